"""Withdrawal (SPEC section 6): no ordinary Service's EndpointSlices list a target address,
and every router Pod of the deployment has stopped selecting it."""

from __future__ import annotations

import time

import httpx
from temporalio.exceptions import CancelledError

from activities.drain import Replaced, read_member
from activities.polling import cancel_seen, poll_until, resumed
from activities.routers import observer_for
from kube.api import KubeApi
from kube.objects import Pod
from retirement.models import (
    Observation,
    PhaseInput,
    RouterlessPolicy,
    Target,
    WithdrawProgress,
)
from retirement.names import LABEL_INSTANCE, LABEL_ROUTER
from retirement.phases import Verdict


def services_listing(api: KubeApi, target: Target) -> dict[str, list[str]]:
    """Ordinary (not headless) Services that would select a member as admitted, with the
    target addresses their EndpointSlices still list."""
    addresses = {m.ip for m in target.members}
    found: dict[str, list[str]] = {}
    for svc in api.list_services(namespace=target.namespace):
        sel = svc.selector
        if not sel or svc.headless:
            continue
        if not any(all(m.labels.get(k) == v for k, v in sel.items()) for m in target.members):
            continue
        slices = api.list_endpoint_slices(namespace=target.namespace, service=svc.name)
        listed = sorted({a for s in slices for a in s.addresses if a in addresses})
        if listed:
            found[svc.name] = listed
    return found


def router_pods(api: KubeApi, target: Target) -> list[Pod]:
    """The deployment's router Pods."""
    pods = api.list_pods(
        namespace=target.namespace, selector=f"{LABEL_INSTANCE}={target.deployment},{LABEL_ROUTER}"
    )
    return [p for p in pods if not p.terminating]


def _router_base(pod: Pod) -> str | None:
    if not pod.pod_ip:
        return None
    for c in pod.containers:
        for port in c.ports:
            if port.name == "http" or port.name is None:
                return f"http://{pod.pod_ip}:{port.container_port}"
    return None


def withdraw(api: KubeApi, inp: PhaseInput) -> Observation:
    """Poll until withdrawn from every Service and router, or the deadline."""
    target = inp.target
    progress: WithdrawProgress = resumed(WithdrawProgress) or WithdrawProgress()
    requested = set(progress.removal_requested)
    quiet: dict[str, object] = {}
    addresses = {m.ip for m in target.members}

    with httpx.Client(trust_env=False, timeout=3.0) as http:

        def once() -> Observation:
            readings: dict[str, str] = {}
            services = services_listing(api, target)
            for name, listed in services.items():
                readings[f"service/{name}"] = f"still lists {', '.join(listed)}"
            routers = router_pods(api, target)
            pending: list[str] = []
            if not routers:
                if target.router:
                    pending.append(f"router {target.router} declared but no router Pod found")
                else:
                    verdict, why = _routerless(api, inp, quiet)
                    readings["routers"] = why
                    if verdict is not Verdict.VERIFIED:
                        pending.append(why)
            for pod in routers:
                kind = pod.labels.get(LABEL_ROUTER) or target.router or ""
                name = f"router/{pod.name}"
                obs = observer_for(kind)
                base = _router_base(pod)
                if obs is None or base is None:
                    readings[name] = f"cannot observe router kind {kind!r}"
                    pending.append(readings[name])
                    continue
                view = obs.view(http, base)
                if not view.fresh(time.time()):
                    readings[name] = f"no fresh answer: {view.error or 'stale'}"
                    pending.append(readings[name])
                    continue
                still = view.selecting(addresses)
                if not still:
                    readings[name] = "selects no target"
                    continue
                readings[name] = f"still selects {', '.join(still)}"
                pending.append(readings[name])
                for url in still:  # ask actively; the next poll verifies
                    if cancel_seen():
                        raise CancelledError("cancelled before asking a router to remove")
                    key = f"{pod.uid}|{url}"
                    obs.remove(http, base, url, view.workers[url])
                    requested.add(key)
            if services or pending:
                reasons = [f"service {n} lists {', '.join(a)}" for n, a in services.items()]
                return Observation(
                    verdict=Verdict.UNKNOWN, reason="; ".join(reasons + pending), readings=readings
                )
            return Observation(
                verdict=Verdict.VERIFIED,
                readings=readings,
                reason="no Service lists and no router selects a target",
            )

        return poll_until(
            deadline=inp.deadline,
            interval=inp.poll_interval_s,
            once=once,
            details=lambda obs: WithdrawProgress(
                polls=obs.polls, removal_requested=sorted(requested), last=obs
            ),
        )


def _routerless(api: KubeApi, inp: PhaseInput, quiet: dict[str, object]) -> tuple[Verdict, str]:
    """The router-less policy: hold (default), or a quiet window of unmoving counters."""
    if inp.routerless_policy is RouterlessPolicy.HOLD:
        return Verdict.UNKNOWN, (
            "router-less: nothing reports that client connections went quiet (policy hold)"
        )
    target = inp.target
    counters: dict[str, tuple[float, ...]] = {}
    for m in (m for m in target.members if m.measured):
        try:
            s = read_member(api, target, m)
        except Replaced as e:
            return Verdict.UNKNOWN, f"router-less: member {e}"
        if not s.complete:
            quiet.clear()
            return Verdict.UNKNOWN, f"router-less: {m.pod} {s.reason}"
        counters[m.pod] = s.counters
    now = time.monotonic()
    if quiet.get("counters") != counters:
        quiet["counters"], quiet["since"] = counters, now
        return Verdict.UNKNOWN, "router-less: quiet window started"
    since = float(quiet["since"])  # type: ignore[arg-type]
    if now - since >= inp.quiet_window_s:
        return Verdict.VERIFIED, f"router-less: counters quiet for {now - since:.0f} s"
    return Verdict.UNKNOWN, f"router-less: quiet for {now - since:.0f} s of {inp.quiet_window_s:g}"
