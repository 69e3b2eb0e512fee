"""Withdrawal (SPEC section 6): no EndpointSlice of the namespace lists a target (by any of
its addresses or its Pod UID as ``targetRef``), but those of the per-replica headless
Services, and every router Pod of the deployment has stopped selecting it.

The helpers here (Services, router discovery) are shared with the restore, which reads
back the opposite: the Services that select a member list it again, and every router Pod
selects it again."""

from __future__ import annotations

import time

import httpx

from activities.fencing import fence, heartbeat
from activities.labels_off import labels_still_off
from activities.polling import poll_until, resumed, seconds_left
from activities.routers import (
    TIMEOUT_S,
    Generations,
    RouterObserver,
    RouterView,
    canonical_ip,
    resolve,
    worker_host,
)
from activities.sampling import Replaced, sample_member
from kube.api import KubeApi
from kube.errors import KubeError
from kube.members import MemberGone, read_member
from kube.objects import EndpointSlice, Pod, Service
from retirement.drain import next_read_in
from retirement.models import (
    MemberTarget,
    Observation,
    PhaseInput,
    RouterlessPolicy,
    Target,
    WithdrawProgress,
)
from retirement.names import LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ROUTER
from retirement.phases import Verdict

#: The reading under which withdrawal reports the router removals it asked for.
REMOVALS_READING = "routers/removal-requested"
#: The first re-poll comes this soon; each later one twice as late, up to the poll
#: interval (measured on the bed: vllm-router 0.1.17 drops a de-labelled Pod in ~0.2 s,
#: smg marks it draining in ~1 s, the SGLang gateway removes a worker asked to at once).
FIRST_REPOLL_S = 0.1


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


def member_addresses(api: KubeApi, target: Target, m: MemberTarget) -> set[str] | None:
    """Every address of a member: the one admission recorded and the live ``podIPs`` of
    the admitted UID (a Pod's addresses do not change while it lives); None when the read
    failed (the caller uses the recorded address and reads again later)."""
    try:
        pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
    except KubeError:
        return None
    return {m.ip} if isinstance(pod, MemberGone) else {m.ip, *pod.pod_ips}


def router_pods(api: KubeApi, target: Target, *, leaving: bool = True) -> list[Pod]:
    """The deployment's router Pods.  A terminating one still routes until it is gone, so
    withdrawal and its re-checks ask it too (``leaving``); the restore does not wait for
    one to select a member again (it is going away)."""
    pods = api.list_pods(
        namespace=target.namespace, selector=f"{LABEL_INSTANCE}={target.deployment},{LABEL_ROUTER}"
    )
    return [p for p in pods if leaving or not p.terminating]


def may_remove(api: KubeApi, target: Target, url: str) -> Observation | str:
    """Read fresh, immediately before asking a router to remove ``url``, whether it may:
    every member is still the admitted Pod with no eligibility label (FAILED otherwise:
    gone, replaced, or the label put back by someone else, perhaps the restore), and the
    URL's host is an address of a live member now ("" when all holds; else why not).  A
    member's address outlives the member (another Pod may get it): only a live member's
    address is ever removed."""
    check = labels_still_off(api, target)
    if check.verdict is Verdict.FAILED:
        return Observation(verdict=Verdict.FAILED, reason=check.reason, readings=check.readings)
    if check.verdict is not Verdict.VERIFIED:
        return f"not removed: {check.reason}"
    live = {canonical_ip(a) or a for a in check.addresses}
    host = worker_host(url)
    if host is None or host not in live:
        return f"not removed: {url} is not the address of a live member"
    return ""


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


def withdraw(
    api: KubeApi, inp: PhaseInput, *, transport: httpx.BaseTransport | None = None
) -> Observation:
    """Poll until withdrawn from every Service and router, or the deadline.

    ``transport``: the HTTP transport of the router calls (tests answer them offline)."""
    target = inp.target
    progress: WithdrawProgress = resumed(WithdrawProgress) or WithdrawProgress()
    requested = set(progress.removal_requested)
    quiet: dict[str, object] = {}
    routerless = [False]  # the last poll found no router Pod (the router-less policy applies)
    known: dict[str, set[str]] = {}
    generations = Generations()  # per router Pod, within this attempt of the phase

    with httpx.Client(trust_env=False, timeout=TIMEOUT_S, transport=transport) as http:

        def addresses() -> set[str]:
            for m in target.members:
                if m.pod not in known:
                    read = member_addresses(api, target, m)
                    if read is not None:
                        known[m.pod] = read
            return {m.ip for m in target.members} | {a for ips in known.values() for a in ips}

        def once() -> Observation:
            readings: dict[str, str] = {}
            targets = addresses()
            heartbeat()
            services = services_listing(api, target, targets)
            for name, listed in services.items():
                readings[f"service/{name}"] = f"still lists {', '.join(listed)}"
            heartbeat()
            routers = router_pods(api, target)
            routerless[0] = not routers and not target.router
            pending: list[str] = []
            if not routers:
                if target.router:
                    pending.append(f"router {target.router} declared but no router Pod found")
                else:
                    verdict, why = _routerless(api, inp, quiet)
                    readings["routers"] = why
                    if verdict is not Verdict.VERIFIED:
                        pending.append(why)
            pods = {m.pod for m in target.members}
            for pod in routers:
                heartbeat()  # one router answer may take its whole timeout
                name = f"router/{pod.name}"
                read = read_router(http, pod, target, generations)
                if isinstance(read, str):
                    readings[name] = read
                    pending.append(f"router {pod.name}: {read}")
                    continue
                obs, base, view = read
                still = view.holding(targets, pods)
                if not still:
                    readings[name] = "selects no target"
                    continue
                readings[name] = view.describe(still)
                pending.append(f"router {pod.name} {readings[name]}")
                if not obs.active:
                    continue  # passive (llm-d): it drops the member once the label is gone
                for url in (w for w in still if w in view.workers):  # ask; the next poll verifies
                    allowed = may_remove(api, target, url)
                    if isinstance(allowed, Observation):
                        return allowed.model_copy(update={"router_removals": sorted(requested)})
                    if allowed:
                        pending.append(f"router {pod.name}: {allowed}")
                        continue
                    fence(f"asking router {pod.name} to remove {url}")
                    key = f"{pod.uid}|{url}"
                    requested.add(key)  # recorded before the call: it may act and time out
                    obs.remove(http, base, url, view.workers[url])
            removals = sorted(requested)
            if removals:
                readings[REMOVALS_READING] = ", ".join(removals)
            if services or pending:
                reasons = [f"service {n} lists {', '.join(a)}" for n, a in services.items()]
                return Observation(
                    verdict=Verdict.UNKNOWN,
                    reason="; ".join(reasons + pending),
                    readings=readings,
                    router_removals=removals,
                )
            return Observation(
                verdict=Verdict.VERIFIED,
                readings=readings,
                reason="no Service lists and no router selects a target",
                router_removals=removals,
            )

        spacing = [inp.poll_interval_s]
        polls = [0]

        def next_poll(_: Observation) -> float:
            """Quick at first (``FIRST_REPOLL_S``, doubling up to the poll interval): a
            router drops a de-labelled worker or takes a removal within a fraction of a
            second, and an idle replica should not wait a whole interval for the proof.
            For a router-less read that could not be made (an exec that timed out under
            load) the wait doubles from the poll interval, as the drain's does
            (``retirement.drain.next_read_in``); the quiet window is measured in time, so
            sparser reads only make it end later, never sooner."""
            polls[0] += 1
            if not routerless[0]:
                return min(inp.poll_interval_s, FIRST_REPOLL_S * 2.0 ** (polls[0] - 1))
            strained = bool(quiet.pop("strained", False))
            spacing[0] = next_read_in(
                in_flight=None if strained else 0.0,
                previous_s=spacing[0],
                # A quiet window shorter than the poll interval is read again when it can
                # end (never sooner than the first re-poll's spacing).
                base_s=min(inp.poll_interval_s, max(inp.quiet_window_s, FIRST_REPOLL_S)),
                left_s=seconds_left(inp.deadline),
            )
            return spacing[0]

        return poll_until(
            deadline=inp.deadline,
            interval=next_poll,
            once=once,
            details=lambda obs: WithdrawProgress(
                polls=obs.polls, removal_requested=sorted(requested), last=obs
            ),
            tenant=inp.target.namespace,
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
            s = sample_member(api, target, m)
        except Replaced as e:
            return Verdict.UNKNOWN, f"router-less: member {e}"
        if not s.complete:
            # The window is kept: a read that failed (no exec slot, an exec timed out under
            # load) saw nothing, so it cannot have seen traffic.  The window still ends
            # only on a read that works, with the counters of its start: they are
            # monotonic, and every read that works was bound to the admitted container
            # (``sample_member``: same container ID and restart count before and after),
            # so equal counters mean no work in between, however many reads failed.
            # Restarting it instead made retirements of 200 started at once run out of
            # budget on "quiet window started" (worker benchmark: each read that found no
            # exec slot began the wait again).
            quiet["strained"] = True  # the next read backs off (``next_poll``)
            return Verdict.UNKNOWN, f"router-less: {m.pod} {s.reason}"
        if s.exact:  # requests held by its HTTP front end: not quiet, whatever the counters
            quiet.pop("counters", None)
            return Verdict.UNKNOWN, f"router-less: {m.pod} holds {s.exact} request(s) (GET /load)"
        counters[m.pod] = s.counters
    now = time.monotonic()
    if quiet.get("counters") != counters:
        quiet["counters"], quiet["since"] = counters, now
        return Verdict.UNKNOWN, "router-less: quiet window started"
    since = float(quiet["since"])  # type: ignore[arg-type]
    if now - since >= inp.quiet_window_s:
        return Verdict.VERIFIED, f"router-less: counters quiet for {now - since:.0f} s"
    return Verdict.UNKNOWN, f"router-less: quiet for {now - since:.0f} s of {inp.quiet_window_s:g}"
