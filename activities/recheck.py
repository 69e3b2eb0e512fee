"""The withdrawal confirmed again, read-only, inside every drain round (SPEC section 4).

Anything can put a replica back in routing after withdrawal verified it: the gpustack
operator owns the eligibility label, a second watcher, the watcher's own label maintenance.
So every drain round reads again (after that round's idle reads):

- the eligibility label on every admitted member: back on any of them is a definite
  conflict with another writer (FAILED, "label re-added by someone else"); a member gone
  or replaced is FAILED as well;
- the EndpointSlices of the namespace (but the per-replica headless Services') and every
  router Pod of the deployment, through the same helpers withdrawal uses
  (``activities.routing``): a slice listing a target again (any of its addresses, or its
  UID as ``targetRef``), a router selecting one, no fresh or no readable answer, a router
  that restarted since an earlier round of this drain (its ``boot_generation`` changed: a
  restarted router's earlier confirmations do not count), or a read that failed reads
  UNKNOWN (the round is not idle).

The boot generations seen are kept per drain attempt: the caller passes a ``Generations``,
or they are kept with the HTTP client the drain opened for the attempt (one client per
attempt, so a new attempt starts afresh).

Nothing here writes: no label change, no router removal call.  A router-less deployment
has no router to ask (the drain's counter check covers established connections).
"""

from __future__ import annotations

import weakref

import httpx
from temporalio.exceptions import CancelledError

from activities.fencing import heartbeat
from activities.labels_off import Recheck, labels_still_off
from activities.routers import Generations
from activities.routing import read_router, router_pods, services_listing
from kube.api import KubeApi
from kube.errors import KubeError
from kube.objects import Pod
from retirement.models import Target
from retirement.phases import Verdict

__all__ = ["Recheck", "generations_of", "labels_still_off", "still_withdrawn"]


#: The generations seen by each drain attempt, kept with the attempt's HTTP client.
_SEEN: weakref.WeakKeyDictionary[httpx.Client, Generations] = weakref.WeakKeyDictionary()


def generations_of(http: httpx.Client) -> Generations:
    """The router generations seen through ``http`` (one drain attempt's client)."""
    seen = _SEEN.get(http)
    if seen is None:
        seen = _SEEN[http] = Generations()
    return seen


def still_withdrawn(
    api: KubeApi, target: Target, http: httpx.Client, generations: Generations | None = None
) -> Recheck:
    """Read again, without changing anything, that the withdrawal still holds."""
    labels = labels_still_off(api, target)
    if labels.verdict is not Verdict.VERIFIED:
        return labels
    readings: dict[str, str] = {}
    addresses = set(labels.addresses)
    heartbeat()  # between calls: each may take the Kubernetes layer's whole timeout
    try:
        services = services_listing(api, target, addresses)
    except KubeError as e:
        return Recheck(Verdict.UNKNOWN, f"Services could not be read: {_http(e)}")
    for name, listed in services.items():
        readings[f"service/{name}"] = f"still lists {', '.join(listed)}"
    try:
        routers = router_pods(api, target)
    except KubeError as e:
        return Recheck(Verdict.UNKNOWN, f"router Pods could not be listed: {_http(e)}", readings)
    if not routers and target.router:
        readings["routers"] = f"router {target.router} declared but no router Pod found"
    seen = generations_of(http) if generations is None else generations
    for pod in routers:
        heartbeat()
        readings.update(_router(http, pod, target, addresses, seen))
    if readings:
        return Recheck(
            Verdict.UNKNOWN, "; ".join(f"{k} {v}" for k, v in readings.items()), readings
        )
    return Recheck(Verdict.VERIFIED, "no Service lists and no router selects a target")


def _router(
    http: httpx.Client, pod: Pod, target: Target, addresses: set[str], seen: Generations
) -> dict[str, str]:
    """One router Pod's reading when it does not confirm the withdrawal (else nothing)."""
    name = f"router/{pod.name}"
    try:
        read = read_router(http, pod, target, seen)
        if isinstance(read, str):
            return {name: read if read.startswith("cannot") else f"gave {read}"}
        _, _, view = read
        still = view.holding(addresses, {m.pod for m in target.members})
    except CancelledError:
        raise  # the attempt was asked to stop: never read as an answer
    except Exception as e:  # an answer that cannot be read never confirms anything
        return {name: f"answer unreadable: {type(e).__name__}"}
    return {name: view.describe(still)} if still else {}


def _http(e: KubeError) -> str:
    return f"HTTP {e.status}" if e.status else f"{type(e).__name__} ({e.reason})"
