"""Restore (SPEC section 6): put the eligibility label back on the members that still
qualify, bound to the admitted UIDs and to the label value last read
(``kube.members.set_eligibility``), and read back that every Service that selects a member
lists it again and every router Pod selects it again (``activities.routing``); a router
that does not is asked to add it."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Literal
from urllib.parse import urlsplit

import httpx

from activities.fairslots import WorkerSlots
from activities.fencing import fence, heartbeat
from activities.http_client import http_client
from activities.polling import poll_until
from activities.probes import identity_probe, probes_supported
from activities.routers import (
    TIMEOUT_S,
    RouterObserver,
    RouterView,
    canonical_ip,
    resolve,
    worker_host,
    worker_url,
)
from activities.routing import router_kind, router_pods, services_missing
from kube.api import KubeApi
from kube.members import ELIGIBLE_VALUE, LabelChange, MemberGone, read_member, set_eligibility
from kube.objects import Pod, pod_ready
from retirement.eligibility import in_group, label_refusal
from retirement.models import MemberTarget, Observation, PhaseInput, RestoreResult, Target
from retirement.names import LABEL_ELIGIBLE, LABEL_MEMBER_INDEX
from retirement.phases import Verdict
from retirement.shape import GROUP_SHAPES

#: How long the restore waits before asking a router again to add the same worker (an
#: add is asynchronous on the SGLang gateway, and vllm-router holds the call open until the
#: worker is healthy).
ADD_AGAIN_AFTER_S = 10.0


def restore(
    api: KubeApi,
    inp: PhaseInput,
    *,
    transport: httpx.BaseTransport | None = None,
    slots: WorkerSlots | None = None,
) -> RestoreResult:
    """Put the label back on members that still qualify, and every router's selection of
    them (read back, with the Services'), until decided or the deadline.

    ``transport``: the HTTP transport of the router calls (tests answer them offline);
    ``slots``: the worker's, for its poll slots (None: the process's default)."""
    # Always at least one whole pass, however late the attempt starts (past its
    # deadline: one pass, then it ends): a late attempt that did nothing would read as
    # every member back.  What it could not confirm is reported held.
    with http_client(timeout=TIMEOUT_S, transport=transport) as http:
        passes = RestorePasses(api, inp, http)
        poll_until(
            deadline=inp.deadline,
            interval=inp.poll_interval_s,
            once=passes.once,
            tenant=inp.target.namespace,
            slots=None if slots is None else slots.polls,
        )
    return passes.result


class RestorePasses:
    """One restore attempt's loop state: the result so far, when each router add was last
    asked (and what the router answered), and since when each router selects each member
    again (``restore_once``)."""

    def __init__(self, api: KubeApi, inp: PhaseInput, http: httpx.Client) -> None:
        self.api, self.inp, self.http = api, inp, http
        self.result = RestoreResult()
        self.asked: dict[str, tuple[float, str]] = {}
        self.since: dict[str, float] = {}

    def once(self) -> Observation:
        """One pass over the members still to decide."""
        self.result = restore_once(
            self.api,
            self.inp.target,
            self.result,
            http=self.http,
            removals=self.inp.router_removals,
            asked=self.asked,
            since=self.since,
        )
        waiting = self.result.held
        return Observation(
            verdict=Verdict.UNKNOWN if waiting else Verdict.VERIFIED,
            reason="; ".join(f"{k}: {v}" for k, v in waiting.items()),
        )


class _Routers:
    """One restore pass's view of the deployment's routers: the router Pods and each one's
    answer are read once per pass, shared by every member."""

    def __init__(
        self,
        api: KubeApi,
        target: Target,
        http: httpx.Client | None,
        removals: Sequence[str],
        asked: dict[str, tuple[float, str]],
        since: dict[str, float],
    ) -> None:
        self._api, self._target, self._http = api, target, http
        self._removals = [r.partition("|")[::2] for r in removals]  # (router uid, url)
        self._asked = asked
        self._since = since
        self._pods: list[Pod] | None = None
        self._views: dict[str, RouterView] = {}
        self._own: httpx.Client | None = None
        self.adds: list[str] = []
        #: A selection counted only after lasting ``confirm_s`` (``RestoreResult.timed``).
        self.timed = False

    def close(self) -> None:
        if self._own is not None:
            self._own.close()

    def _client(self) -> httpx.Client:
        if self._http is not None:
            return self._http
        if self._own is None:
            self._own = http_client(timeout=TIMEOUT_S)
        return self._own

    def pods(self) -> list[Pod]:
        if self._pods is None:
            self._pods = router_pods(self._api, self._target, leaving=False)
        return self._pods

    def _view(self, pod: Pod, obs: RouterObserver, base: str) -> RouterView:
        if pod.uid not in self._views:
            heartbeat()  # before each router call: each may take its whole timeout
            self._views[pod.uid] = obs.view(self._client(), base)
        return self._views[pod.uid]

    def _url(self, pod: Pod, view: RouterView, m: MemberTarget, addresses: set[str]) -> str | None:
        """The worker URL to add: the one withdrawal removed from this router (else from
        another), else the member's address on the port every other worker has, else on
        its declared serving port."""
        wanted = {canonical_ip(a) or a for a in addresses}
        recorded = [(uid, url) for uid, url in self._removals if worker_host(url) in wanted]
        if recorded:  # this router's own removal first
            return min(recorded, key=lambda r: r[0] != pod.uid)[1]
        shapes = set()
        for url in view.workers:
            with contextlib.suppress(ValueError):
                parts = urlsplit(url)
                if parts.port is not None:
                    shapes.add((parts.scheme or "http", parts.port))
        if len(shapes) == 1:
            [(scheme, port)] = shapes
            return worker_url(m.ip, port, scheme)
        if m.serve_port is not None:
            return worker_url(m.ip, m.serve_port)
        return None

    def missing(
        self, m: MemberTarget, addresses: set[str], may_add: Callable[[], str]
    ) -> list[str]:
        """Why not every router Pod selects the member yet (empty: they all do).  A router
        that does not is asked to add it (``may_add`` first: "" allows it, else why not)."""
        pods = self.pods()
        if not pods:
            if self._target.router:
                return [f"router {self._target.router} declared but no router Pod found"]
            return []
        reasons: list[str] = []
        for pod in pods:
            reason = self._missing_at(pod, m, addresses, may_add)
            if reason is not None:
                reasons.append(reason)
        return reasons

    def _missing_at(
        self, pod: Pod, m: MemberTarget, addresses: set[str], may_add: Callable[[], str]
    ) -> str | None:
        """Why router Pod ``pod`` does not select the member yet (None: it does), asking it
        to add the member when it is active and may."""
        found = resolve(pod, router_kind(pod, self._target))
        if isinstance(found, str):
            return f"router {pod.name}: cannot observe: {found}"
        obs, base = found
        view = self._view(pod, obs, base)
        stale = view.stale(time.time())
        if stale:
            return f"router {pod.name}: no fresh answer: {stale}"
        seen = f"{pod.uid}|{m.pod}"
        if view.selecting(addresses, {m.pod}):
            # A router that may still remove a worker it selects again (smg: a drain
            # job started when the label came off) counts only once it has selected
            # it for ``confirm_s`` (``RouterView.confirm_s``).
            first = self._since.setdefault(seen, time.monotonic())
            left = view.confirm_s - (time.monotonic() - first)
            if left > 0:
                return (
                    f"router {pod.name} selects it again; confirming for {left:.0f} s "
                    "more (a removal it started earlier may still be pending)"
                )
            if view.confirm_s > 0:
                self.timed = True
            return None
        self._since.pop(seen, None)
        if not obs.active:  # llm-d: nothing to ask, it picks the member up by itself
            return f"router {pod.name} does not select it yet (passive: waiting)"
        url = self._url(pod, view, m, addresses)
        if url is None:
            return f"router {pod.name} does not select it; no worker URL known"
        key = f"{pod.uid}|{url}"
        last = self._asked.get(key)
        if last is not None and time.monotonic() - last[0] < ADD_AGAIN_AFTER_S:
            return f"router {pod.name} does not select {url} yet (asked to add: {last[1]})"
        refused = may_add()
        if refused:
            return refused
        fence(f"asking router {pod.name} to add {url}")
        answer = obs.add(self._client(), base, url)
        self._asked[key] = (time.monotonic(), answer)
        self.adds.append(f"{pod.name}|{url}")
        return f"router {pod.name} does not select {url} yet (asked to add: {answer})"


def _probe(target: Target, m: MemberTarget) -> str:
    """Why a group member may not be put back in routing ("" when it may)."""
    if not probes_supported(target):
        return (
            f"identity probe unsupported for {target.engine} "
            f"{target.engine_version or '(no version)'}"
        )
    return identity_probe(target, m)


class _MayAdd:
    """Whether a member may be added to a router: a group member only once its identity
    probe passed in this pass (a label put back on it counts: the probe passed for it)."""

    def __init__(self, target: Target, m: MemberTarget, group: bool) -> None:
        self.target, self.m, self.group = target, m, group
        self.probed = False

    def check(self) -> str:
        """Empty when it may, else why not (the probe is asked until it passes once)."""
        if not self.group or self.probed:
            return ""
        why = _probe(self.target, self.m)
        self.probed = not why
        return why


def restore_once(
    api: KubeApi,
    target: Target,
    result: RestoreResult,
    *,
    http: httpx.Client | None = None,
    removals: Sequence[str] = (),
    asked: dict[str, tuple[float, str]] | None = None,
    since: dict[str, float] | None = None,
) -> RestoreResult:
    """One pass of the restore rule over the members still to decide.

    A member is restored only when its label is back, every Service that selects it lists
    it (its EndpointSlices, by address or ``targetRef``), and every router Pod of the
    deployment selects it, read back; until then it stays held with the reason.  A router
    that does not select it is asked to add it (``removals``: the worker URLs withdrawal
    removed, preferred; ``asked``: when each add was last asked and what the router
    answered; ``since``: since when each router selects each member again; both kept
    across passes)."""
    done = set(result.restored) | set(result.failed)
    restorable = set(target.restorable())
    restored, held, failed = list(result.restored), dict(result.held), dict(result.failed)
    routers = _Routers(
        api, target, http, removals, {} if asked is None else asked, {} if since is None else since
    )
    try:
        for m in target.members:
            if m.pod in done or m.pod not in restorable:
                continue
            heartbeat()
            outcome, why = _restore_member(api, target, m, routers)
            if outcome == "held":
                held[m.pod] = why
                continue
            if outcome == "failed":
                failed[m.pod] = why
            else:
                restored.append(m.pod)
            held.pop(m.pod, None)
    finally:
        routers.close()
    return RestoreResult(
        restored=restored,
        held=held,
        failed=failed,
        router_adds=[*result.router_adds, *routers.adds],
        timed=result.timed or routers.timed,
    )


def _restore_member(
    api: KubeApi, target: Target, m: MemberTarget, routers: _Routers
) -> tuple[Literal["restored", "held", "failed"], str]:
    """One member's pass of the restore rule: restored, held (why) or failed (why)."""
    group = is_group_member(target, m)
    pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
    if isinstance(pod, MemberGone):
        return "failed", "gone or replaced: not the admitted UID"
    ready = pod_ready(pod)
    may_add = _MayAdd(target, m, group)
    current = pod.labels.get(LABEL_ELIGIBLE)
    # Not yet: evaluated again while held (it may recover).  The label goes back
    # by the rule the watcher's repair also follows (retirement.eligibility).
    refusal = (
        label_refusal(ready=ready, group=group, probe=partial(_probe, target, m))
        if current != ELIGIBLE_VALUE
        else label_refusal(ready=ready, group=False, probe=None)
    )
    if refusal:
        return "held", refusal
    if current != ELIGIBLE_VALUE:
        may_add.probed = group
        fence(f"putting the label back on {m.pod}")
        change = set_eligibility(
            api,
            namespace=target.namespace,
            name=m.pod,
            uid=m.uid,
            current=current,
            eligible=True,
        )
        if change is LabelChange.CHANGED:
            return "held", "the label changed while restoring: read again on the next pass"
        if change is not LabelChange.APPLIED:
            return "failed", "replaced while restoring"
    labels = {**pod.labels, LABEL_ELIGIBLE: ELIGIBLE_VALUE}
    addresses = {m.ip, *pod.pod_ips}
    unlisted = services_missing(api, target.namespace, labels, addresses, m.uid)
    reasons = [f"service {name} does not list it yet" for name in unlisted]
    reasons += routers.missing(m, addresses, may_add.check)
    if reasons:
        return "held", "label back; " + "; ".join(reasons)
    return "restored", ""


def is_group_member(target: Target, m: MemberTarget) -> bool:
    """Whether ``m`` belongs to a multi-member group (``retirement.eligibility.in_group``:
    the replica's declared size, or the member-index label).  A target admitted before its
    size was recorded falls back to the number of members and the shape."""
    if target.size is None and (len(target.members) > 1 or target.shape in GROUP_SHAPES):
        return True
    return in_group(size=target.size, member_index=m.labels.get(LABEL_MEMBER_INDEX))
