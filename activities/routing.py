"""Who still routes to a target, read: the Services whose EndpointSlices list it (but the
per-replica headless ones), and the deployment's router Pods with each one's answer.

Read by the withdrawal (``activities.withdrawal``: nothing lists or selects a target any
more), by its re-check in every drain round (``activities.recheck``), and by the restore
(``activities.restore``), which reads back the opposite: the Services that select a
member list it again, and every router Pod selects it again.  Nothing here writes."""

from __future__ import annotations

import time

import httpx

from activities.routers import Generations, RouterObserver, RouterView, resolve
from kube.api import KubeApi
from kube.objects import EndpointSlice, Pod, Service
from retirement.models import Target
from retirement.names import LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ROUTER


def excluded_services(services: list[Service]) -> set[str]:
    """The per-replica headless Services (SPEC section 2): headless, selecting Pods, and
    not on the eligibility label.  They keep listing a withdrawn member by design; every
    other EndpointSlice of the namespace counts."""
    return {
        s.name for s in services if s.headless and s.selector and LABEL_ELIGIBLE not in s.selector
    }


def _slice_owner(s: EndpointSlice) -> str:
    return s.service or f"(no Service: EndpointSlice {s.name})"


def services_listing(
    api: KubeApi, target: Target, addresses: set[str] | None = None
) -> dict[str, list[str]]:
    """Every Service of the namespace (but the per-replica headless ones) whose
    EndpointSlices still list a target: one of its addresses, or its Pod UID as
    ``targetRef``; Service name -> what is listed."""
    if addresses is None:
        addresses = {m.ip for m in target.members}
    uids = set(target.uids)
    skip = excluded_services(api.list_services(namespace=target.namespace))
    found: dict[str, list[str]] = {}
    for s in api.list_namespace_endpoint_slices(namespace=target.namespace):
        if s.service in skip:
            continue
        listed = s.listing(addresses, uids)
        if listed:
            owner = found.setdefault(_slice_owner(s), [])
            owner.extend(x for x in listed if x not in owner)
    return {k: sorted(v) for k, v in sorted(found.items())}


def services_missing(
    api: KubeApi, namespace: str, labels: dict[str, str], addresses: set[str], uid: str
) -> list[str]:
    """The Services that select a Pod labelled ``labels`` (but the per-replica headless
    ones) and whose EndpointSlices do not list it (by address or ``targetRef``) yet."""
    services = api.list_services(namespace=namespace)
    skip = excluded_services(services)
    selecting = [
        s.name
        for s in services
        if s.name not in skip
        and s.selector
        and all(labels.get(k) == v for k, v in s.selector.items())
    ]
    if not selecting:
        return []
    slices = api.list_namespace_endpoint_slices(namespace=namespace)
    return [
        name
        for name in selecting
        if not any(s.service == name and s.listing(addresses, {uid}) for s in slices)
    ]


def router_pods(api: KubeApi, target: Target, *, leaving: bool = True) -> list[Pod]:
    """The deployment's router Pods.  A terminating one still routes until it is gone, so
    withdrawal and its re-checks ask it too (``leaving``); the restore does not wait for
    one to select a member again (it is going away)."""
    pods = api.list_pods(
        namespace=target.namespace, selector=f"{LABEL_INSTANCE}={target.deployment},{LABEL_ROUTER}"
    )
    return [p for p in pods if leaving or not p.terminating]


def router_kind(pod: Pod, target: Target) -> str:
    """The kind of a router Pod: the deployment's declared router (``spec.router``, bound at
    admission), whatever the Pod's router label says ("" when none is declared)."""
    return target.router or ""


def read_router(
    http: httpx.Client, pod: Pod, target: Target, generations: Generations
) -> tuple[RouterObserver, str, RouterView] | str:
    """One router Pod's answer that may count, with its observer and base URL, or why there
    is none: the Pod cannot be observed (unknown kind, no address), the answer failed or is
    stale, or the router restarted since an earlier answer of this phase."""
    found = resolve(pod, router_kind(pod, target))
    if isinstance(found, str):
        return f"cannot observe: {found}"
    obs, base = found
    view = obs.view(http, base)
    why = view.stale(time.time()) or generations.admit(pod.uid, view)
    if why:
        return f"no fresh answer: {why}"
    return obs, base, view
