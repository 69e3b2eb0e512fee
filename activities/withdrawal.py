"""Withdrawal (SPEC section 6): no EndpointSlice of the namespace lists a target (by any of
its addresses or its Pod UID as ``targetRef``), but those of the per-replica headless
Services, and every router Pod of the deployment has stopped selecting it.

What routes to a target is read through ``activities.routing`` (shared with the drain's
re-check and the restore)."""

from __future__ import annotations

import time

import httpx
from temporalio import activity
from temporalio.exceptions import CancelledError

from activities.fairslots import FairSlots, WorkerSlots
from activities.fencing import fence, heartbeat
from activities.http_client import http_client
from activities.idle_wait import IdleWait
from activities.labels_off import labels_still_off
from activities.oneshot import EXEC_TIMEOUT_S, MAX_WAIT_S, MAX_WINDOW_S
from activities.polling import poll_until, resumed, seconds_left, slot_lent
from activities.routers import (
    TIMEOUT_S,
    Generations,
    canonical_ip,
    worker_host,
)
from activities.routing import read_router, router_pods, services_listing
from activities.sampling import Replaced, quiet_window_read, sample_member, wait_slots
from kube.api import KubeApi
from kube.errors import KubeError
from kube.members import MemberGone, read_member
from kube.objects import Pod
from retirement.drain import next_read_in
from retirement.models import (
    MemberTarget,
    Observation,
    PhaseInput,
    RouterlessPolicy,
    Target,
    WithdrawProgress,
)
from retirement.phases import Verdict
from retirement.quiet import QuietDecision, QuietWindow, decide, decide_in_one, ends_reads
from retirement.readings import Sample

#: The reading under which withdrawal reports the router removals it asked for.
REMOVALS_READING = "routers/removal-requested"
#: What a window kept in one exec leaves of the budget after its exec's bound: the
#: identity read after it, the poll slot taken back, the router Pods and Services listed.
AFTER_EXEC_S = 3.0
#: The first re-poll comes this soon; each later one twice as late, up to the poll
#: interval (measured on the bed: vllm-router 0.1.17 drops a de-labelled Pod in ~0.2 s,
#: smg marks it draining in ~1 s, the SGLang gateway removes a worker asked to at once).
FIRST_REPOLL_S = 0.1


def member_addresses(api: KubeApi, target: Target, m: MemberTarget) -> set[str] | None:
    """Every address of a member: the one admission recorded and the live ``podIPs`` of
    the admitted UID (a Pod's addresses do not change while it lives); None when the read
    failed (the caller uses the recorded address and reads again later)."""
    try:
        pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
    except KubeError:
        return None
    return {m.ip} if isinstance(pod, MemberGone) else {m.ip, *pod.pod_ips}


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


def withdraw(
    api: KubeApi,
    inp: PhaseInput,
    *,
    transport: httpx.BaseTransport | None = None,
    slots: WorkerSlots | None = None,
) -> Observation:
    """Poll until withdrawn from every Service and router, or the deadline.

    ``transport``: the HTTP transport of the router calls (tests answer them offline);
    ``slots``: the worker's exec and poll slots (None: the process's default)."""
    with http_client(timeout=TIMEOUT_S, transport=transport) as http:
        polls = WithdrawPolls(
            api,
            inp,
            http,
            None if slots is None else slots.execs,
            wait_slots() if slots is None else slots.waits,
        )
        return poll_until(
            deadline=inp.deadline,
            interval=polls.next_poll,
            once=polls.once,
            details=polls.details,
            tenant=inp.target.namespace,
            slots=None if slots is None else slots.polls,
            pause=polls.idle_wait.pause,
        )


class WithdrawPolls:
    """One withdrawal attempt's loop state: the router removals asked for (with the
    previous attempt's), the router-less quiet window, whether the last poll found no
    router Pod, the members' addresses read, the routers' boot generations, and what the
    next wait is derived from."""

    def __init__(
        self,
        api: KubeApi,
        inp: PhaseInput,
        http: httpx.Client,
        execs: FairSlots | None,
        waits: FairSlots | None = None,
    ) -> None:
        self.api, self.inp, self.target, self.http = api, inp, inp.target, http
        self.execs = execs  # the worker's exec slots (None: the process's default)
        progress: WithdrawProgress = resumed(WithdrawProgress) or WithdrawProgress()
        self.requested = set(progress.removal_requested)
        self.quiet = QuietWindow()
        #: A router-less read failed in the last poll: the next one backs off.
        self.strained = False
        #: The last poll found no router Pod (the router-less policy applies).
        self.routerless = False
        self.known: dict[str, set[str]] = {}
        self.generations = Generations()  # per router Pod, within this attempt of the phase
        self.spacing = inp.poll_interval_s
        self.polls = 0
        #: A router-less read found this member holding requests (its exact count): the
        #: pause after the poll waits for it to go idle (``activities.idle_wait``), for up
        #: to ``busy_spacing``, which grows while it stays busy, as the drain's reads do.
        self.holding: MemberTarget | None = None
        self.busy_spacing = inp.poll_interval_s
        self.idle_wait = IdleWait(api, inp.target, wait_slots() if waits is None else waits)
        measured = [m for m in inp.target.members if m.measured]
        self.exact = bool(measured) and all(m.exact_load for m in measured)
        #: A window kept in one exec failed to be read: the rest of the attempt reads
        #: the window's ends instead (``_window_in_one``).
        self.in_one_failed = False

    def details(self, obs: Observation) -> WithdrawProgress:
        return WithdrawProgress(polls=obs.polls, removal_requested=sorted(self.requested), last=obs)

    def addresses(self) -> set[str]:
        target = self.target
        for m in target.members:
            if m.pod not in self.known:
                read = member_addresses(self.api, target, m)
                if read is not None:
                    self.known[m.pod] = read
        return {m.ip for m in target.members} | {a for ips in self.known.values() for a in ips}

    def once(self) -> Observation:
        """One poll: the Services' listings, then every router Pod (asked to remove what
        it still selects, when it may)."""
        api, target = self.api, self.target
        readings: dict[str, str] = {}
        targets = self.addresses()
        heartbeat()
        routers = router_pods(api, target)
        self.routerless = not routers and not target.router
        pending: list[str] = []
        if not routers:
            if target.router:
                pending.append(f"router {target.router} declared but no router Pod found")
            else:
                decided, self.holding = self._routerless()
                self.quiet, self.strained = decided.window, self.strained or decided.strained
                verdict, why = decided.verdict, decided.reason
                if verdict is Verdict.VERIFIED:
                    # The window's reads took seconds (a whole window, in one exec): the
                    # verdict rests on the router Pods (and Services, below) listed after.
                    heartbeat()
                    routers = router_pods(api, target)
                    if routers:
                        verdict, why = Verdict.UNKNOWN, "a router Pod appeared in the window"
                readings["routers"] = why
                if verdict is not Verdict.VERIFIED:
                    pending.append(why)
        heartbeat()
        services = services_listing(api, target, targets)
        for name, listed in services.items():
            readings[f"service/{name}"] = f"still lists {', '.join(listed)}"
        for pod in routers:
            ended = self._router(pod, targets, readings, pending)
            if ended is not None:
                return ended
        removals = sorted(self.requested)
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

    def _router(
        self, pod: Pod, targets: set[str], readings: dict[str, str], pending: list[str]
    ) -> Observation | None:
        """Read one router Pod (its reading and why it is pending, if it is), and ask an
        active one to remove every target it still selects; the Observation that ends the
        phase when a removal may not be asked for (``may_remove``: FAILED)."""
        api, target, http = self.api, self.target, self.http
        heartbeat()  # one router answer may take its whole timeout
        name = f"router/{pod.name}"
        read = read_router(http, pod, target, self.generations)
        if isinstance(read, str):
            readings[name] = read
            pending.append(f"router {pod.name}: {read}")
            return None
        obs, base, view = read
        still = view.holding(targets, {m.pod for m in target.members})
        if not still:
            readings[name] = "selects no target"
            return None
        readings[name] = view.describe(still)
        pending.append(f"router {pod.name} {readings[name]}")
        if not obs.active:
            return None  # passive (llm-d): it drops the member once the label is gone
        for url in (w for w in still if w in view.workers):  # ask; the next poll verifies
            allowed = may_remove(api, target, url)
            if isinstance(allowed, Observation):
                return allowed.model_copy(update={"router_removals": sorted(self.requested)})
            if allowed:
                pending.append(f"router {pod.name}: {allowed}")
                continue
            fence(f"asking router {pod.name} to remove {url}")
            key = f"{pod.uid}|{url}"
            self.requested.add(key)  # recorded before the call: it may act and time out
            obs.remove(http, base, url, view.workers[url])
        return None

    def next_poll(self, _: Observation) -> float:
        """Quick at first (``FIRST_REPOLL_S``, doubling up to the poll interval): a
        router drops a de-labelled worker or takes a removal within a fraction of a
        second, and an idle replica should not wait a whole interval for the proof.
        For a router-less read that could not be made (an exec that timed out under
        load) the wait doubles from the poll interval, as the drain's does
        (``retirement.drain.next_read_in``); the quiet window is measured in time, so
        sparser reads only make it end later, never sooner."""
        inp = self.inp
        self.polls += 1
        holding, self.holding = self.holding, None
        if not self.routerless:
            self.idle_wait.plan(None, 0.0)
            return min(inp.poll_interval_s, FIRST_REPOLL_S * 2.0 ** min(self.polls - 1, 30))
        if holding is not None and not self.strained:
            # Waiting in the container ends as soon as the count reads 0, so a long wait
            # costs no time: it only spares execs while the member stays busy.
            self.busy_spacing = next_read_in(
                in_flight=float("inf"),
                previous_s=self.busy_spacing,
                base_s=inp.poll_interval_s,
                left_s=seconds_left(inp.deadline),
            )
            self.idle_wait.plan(holding, self.busy_spacing)
        else:
            self.busy_spacing = inp.poll_interval_s
            self.idle_wait.plan(None, 0.0)
        strained, self.strained = self.strained, False
        self.spacing = next_read_in(
            in_flight=None if strained else 0.0,
            previous_s=self.spacing,
            # A quiet window shorter than the poll interval is read again when it can
            # end (never sooner than the first re-poll's spacing).
            base_s=min(inp.poll_interval_s, max(inp.quiet_window_s, FIRST_REPOLL_S)),
            left_s=seconds_left(inp.deadline),
        )
        if not strained and self.quiet.counters is not None and self.exact:
            # A window runs, and every measured member counts exactly: the read when the
            # window can end proves as much as one every second would (the counters are
            # monotonic: a request that came and went moved them; one still held shows
            # in the count), so none is made in between.
            until_end = inp.quiet_window_s - (time.monotonic() - self.quiet.since)
            self.spacing = max(self.spacing, until_end)
        return self.spacing

    def _routerless(self) -> tuple[QuietDecision, MemberTarget | None]:
        """The router-less policy: hold (default), or a quiet window of unmoving counters
        (``retirement.quiet``).  A single measured member with the exact count keeps the
        whole window in one exec, its poll slot lent meanwhile (``_window_in_one``); else
        the measured members are read in order until one read decides the poll on its own.
        Also the member whose complete read held requests (its exact count above 0), if
        one did: the next pause may wait for it."""
        inp = self.inp
        if inp.routerless_policy is RouterlessPolicy.HOLD:
            return QuietDecision(
                self.quiet,
                Verdict.UNKNOWN,
                "router-less: nothing reports that client connections went quiet (policy hold)",
            ), None
        decided = self._window_in_one()
        if decided is not None:
            return decided, None
        return _read_window_ends(self.api, inp, self.quiet, self.execs)

    def _window_in_one(self) -> QuietDecision | None:
        """The whole quiet window in one exec (``activities.sampling.quiet_window_read``):
        it waits in the container for the count to read 0 (up to what the budget leaves
        after the window, an exec's bound and ``AFTER_EXEC_S``), then keeps the window;
        None when it cannot (not one measured member with the exact count, too little
        budget left, a window too long for one exec, no wait slot free, or such an exec
        failed to be read earlier in this attempt)."""
        inp = self.inp
        measured = [m for m in inp.target.members if m.measured]
        if len(measured) != 1 or not measured[0].exact_load:
            return None
        m = measured[0]
        room = seconds_left(inp.deadline) - inp.quiet_window_s - EXEC_TIMEOUT_S - AFTER_EXEC_S
        if room < 0 or not 0 < inp.quiet_window_s <= MAX_WINDOW_S or self.in_one_failed:
            return None

        def tick() -> None:
            if activity.in_activity() and activity.is_cancelled():
                raise CancelledError("cancelled while keeping the quiet window")
            heartbeat()

        try:
            seen = quiet_window_read(
                self.api,
                inp.target,
                m,
                wait_s=min(room, MAX_WAIT_S),
                window_s=inp.quiet_window_s,
                slots=self.idle_wait.slots,
                tick=tick,
                lend=slot_lent,
            )
        except Replaced as e:
            return QuietDecision(QuietWindow(), Verdict.UNKNOWN, f"router-less: member {e}")
        if seen is None:
            return None
        decided = decide_in_one(m.pod, seen, window_s=inp.quiet_window_s)
        # A read that failed (an exec cut, timed out, refused): the long exec may be what
        # fails here (a proxy dropping quiet streams), so the rest of this attempt reads
        # the window's ends, each a short exec.
        self.in_one_failed = decided.strained
        return decided


def _read_window_ends(
    api: KubeApi, inp: PhaseInput, window: QuietWindow, execs: FairSlots | None
) -> tuple[QuietDecision, MemberTarget | None]:
    """The quiet window read at its ends, one exec per member and poll: the measured
    members are read in order until one read decides the poll on its own."""
    target = inp.target
    reads: list[tuple[str, Sample]] = []
    holding: MemberTarget | None = None
    for m in (m for m in target.members if m.measured):
        try:
            s = sample_member(api, target, m, slots=execs)
        except Replaced as e:
            return QuietDecision(window, Verdict.UNKNOWN, f"router-less: member {e}"), None
        reads.append((m.pod, s))
        if s.complete and s.exact:
            holding = m
        if ends_reads(s):
            break
    return decide(window, reads, now=time.monotonic(), window_s=inp.quiet_window_s), holding
