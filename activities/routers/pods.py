"""From a router Pod to the address its observer asks.

The router kind is the deployment's (``spec.router``, bound at admission), never the Pod's
label: router Pods are found by the router label whatever its value.  The address is the
Pod's IP and one of its declared container ports, chosen by name: the first name of the
observer's ``port_names`` that a port carries (``http`` for the routers' APIs, ``metrics``
for llm-d's picker), else the Pod's only declared port, else none ("several ports, none
named http"), which reads UNKNOWN.  A port number outside 1-65535, two ports of the chosen
name, or a Pod without an IP read UNKNOWN too.
"""

from __future__ import annotations

from collections.abc import Mapping

from activities.routers.common import RouterObserver
from activities.routers.kinds import observer_for, unknown_kind
from activities.routers.view import canonical_ip
from kube.objects import ContainerPort, Pod


def router_port(pod: Pod, names: tuple[str, ...]) -> int | str:
    """The port of ``pod`` its observer asks, or why there is none."""
    ports: list[ContainerPort] = [p for c in pod.containers for p in c.ports]
    if not ports:
        return "the router Pod declares no container port"
    chosen: ContainerPort | None = None
    for name in names:
        named = [p for p in ports if p.name == name]
        if len(named) > 1:
            return f"several ports named {name}"
        if named:
            chosen = named[0]
            break
    if chosen is None:
        if len(ports) > 1:
            return f"several ports, none named {' or '.join(names)}"
        chosen = ports[0]
    if not 1 <= chosen.container_port <= 65535:
        return f"port {chosen.name or '(unnamed)'} has no valid number"
    return chosen.container_port


def router_base(pod: Pod, obs: RouterObserver) -> str:
    """``http://<pod IP>:<port>`` of the router Pod's API for ``obs``; ValueError saying why
    there is none."""
    ip = canonical_ip(pod.pod_ip or "")
    if ip is None:
        raise ValueError("the router Pod has no IP address yet")
    port = router_port(pod, obs.port_names)
    if isinstance(port, str):
        raise ValueError(port)
    host = f"[{ip}]" if ":" in ip else ip
    return f"http://{host}:{port}"


def resolve(
    pod: Pod, kind: str | None, environ: Mapping[str, str] | None = None
) -> tuple[RouterObserver, str] | str:
    """The observer and base URL of router Pod ``pod`` of a deployment whose router is
    ``kind``, or why it cannot be observed (a reason for a reading: UNKNOWN)."""
    obs = observer_for(kind or "", environ)
    if obs is None:
        return unknown_kind(kind)
    try:
        return obs, router_base(pod, obs)
    except ValueError as e:
        return f"{obs.kind} router: {e}"
