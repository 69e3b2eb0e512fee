"""Drain reads (SPEC section 5): one bounded, read-only ``pods/exec`` per measured member
(``activities.sampling``: matched to the member by Pod UID and container ID before and
after), folded into the drain rule until every member is idle twice with unchanged
counters.

Rounds are spaced by ``retirement.drain.next_read_in``: the poll interval while the
members read idle, nearly idle or incomplete, growing to a bound while they stay busy.
Where the members count exactly, the pause after a busy round waits in the busiest
member's container for its count to read 0 (``activities.idle_wait``), so the next round
follows as soon as the engine is idle, not a whole spacing later."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from activities.fairslots import FairSlots, WorkerSlots
from activities.fencing import heartbeat
from activities.http_client import http_client
from activities.idle_wait import IdleWait
from activities.polling import poll_until, resumed, seconds_left
from activities.recheck import still_withdrawn
from activities.sampling import Replaced, sample_member_reads, wait_slots
from kube.api import KubeApi
from retirement.drain import (
    EXACT_IDLE_SPACING_S,
    SGLANG_GAUGE_SETTLE_S,
    DrainProgress,
    busy_in_flight,
    next_read_in,
    observe_round,
    resume,
)
from retirement.models import DrainHeartbeat, Observation, PhaseInput
from retirement.phases import Verdict
from retirement.readings import Sample, steps_counted

#: The bound of one router answer when the withdrawal is confirmed again in a round.
RECHECK_HTTP_TIMEOUT_S = 3.0


def drain(api: KubeApi, inp: PhaseInput, *, slots: WorkerSlots | None = None) -> Observation:
    """Poll the measured members until the drain rule holds, or the deadline.

    Every round reads the measured members, then confirms again, read-only, that the
    withdrawal still holds (``activities.recheck``): the label back on a member FAILS the
    drain; a Service listing a target again, or a router selecting one, makes the round
    not idle.  A resumed attempt goes on from the previous attempt's idle read only if
    that read is recent (``retirement.drain.resume``).  The wait after each round is
    ``retirement.drain.next_read_in`` of that round's reads.  ``slots``: the worker's
    exec and poll slots (None: the process's default)."""
    with http_client(timeout=RECHECK_HTTP_TIMEOUT_S) as http:
        rounds = DrainRounds(
            api,
            inp,
            http,
            None if slots is None else slots.execs,
            wait_slots() if slots is None else slots.waits,
        )
        return poll_until(
            deadline=inp.deadline,
            interval=rounds.next_wait,
            once=rounds.once,
            details=rounds.details,
            tenant=inp.target.namespace,
            slots=None if slots is None else slots.polls,
            pause=rounds.idle_wait.pause,
        )


class DrainRounds:
    """One drain attempt's loop state: the drain rule's progress, and what the next wait
    is derived from (the last round's requests in flight and the wait before it)."""

    def __init__(
        self,
        api: KubeApi,
        inp: PhaseInput,
        http: httpx.Client,
        execs: FairSlots | None,
        waits: FairSlots | None = None,
        *,
        fresh: bool = False,
    ) -> None:
        target = inp.target
        self.api, self.inp, self.target = api, inp, target
        #: The HTTP client of the attempt's re-checks (one per attempt).
        self.http = http
        self.execs = execs  # the worker's exec slots (None: the process's default)
        self.members = [m for m in target.members if m.measured]
        self.settle_s = (
            0.0 if steps_counted(target.engine, target.engine_version) else SGLANG_GAUGE_SETTLE_S
        )
        # ``fresh``: nothing carried over from an earlier attempt's heartbeat (the delete's
        # guard taking the proof again, ``activities.refresh``).
        state = (None if fresh else resumed(DrainHeartbeat)) or DrainHeartbeat()
        self.progress: DrainProgress = resume(
            state.progress, now=datetime.now(UTC), poll_interval_s=inp.poll_interval_s
        )
        #: The last round's requests in flight (None: not every read complete), and the
        #: wait before that round: what the next wait is derived from.
        self.in_flight: float | None = None
        self.spacing = inp.poll_interval_s
        self.exact = all(m.exact_load for m in self.members) and bool(self.members)
        self.idle_wait = IdleWait(api, target, wait_slots() if waits is None else waits)
        #: The member that held the most requests in the last round (None: none did, or
        #: not every read was complete): the pause after it waits for that one.
        self.busiest: str | None = None
        #: How long the next wait for idle may last (doubling while the member stays busy).
        self.wait_spacing = inp.poll_interval_s

    def next_wait(self, _: Observation) -> float:
        self.spacing = next_read_in(
            in_flight=self.in_flight,
            previous_s=self.spacing,
            base_s=self.inp.poll_interval_s,
            left_s=seconds_left(self.inp.deadline),
            idle_s=EXACT_IDLE_SPACING_S if self.exact else None,
        )
        busy = next((m for m in self.members if m.pod == self.busiest), None)
        if self.exact and busy is not None:
            # A wait ends as soon as the count reads 0, so it may be long, however few
            # requests are left: it only spares execs while the member stays busy.
            self.wait_spacing = next_read_in(
                in_flight=float("inf"),
                previous_s=self.wait_spacing,
                base_s=self.inp.poll_interval_s,
                left_s=seconds_left(self.inp.deadline),
            )
            self.idle_wait.plan(busy, self.wait_spacing)
        else:
            self.wait_spacing = self.inp.poll_interval_s
            self.idle_wait.plan(None, 0.0)
        return self.spacing

    def details(self, obs: Observation) -> DrainHeartbeat:
        return DrainHeartbeat(progress=self.progress, readings=obs.readings)

    def once(self) -> Observation:
        """One round: the members' reads, the re-check, folded into the rule."""
        target = self.target
        read_at = datetime.now(UTC)  # the round's reads are no older than this
        # With the exact count, each exec reads twice (the proof's two reads, spaced as
        # the count allows), and the round folds both into the rule in order.
        reads: dict[str, list[Sample]] = {}
        for m in self.members:
            heartbeat()  # one read may take its exec slot wait and exec bound
            try:
                reads[m.pod] = sample_member_reads(
                    self.api, target, m, twice=self.exact, slots=self.execs
                )
            except Replaced as e:
                return Observation(verdict=Verdict.FAILED, reason=f"member {e}")
        rounds = [{k: v[i] for k, v in reads.items()} for i in range(2 if self.exact else 1)]
        samples = rounds[-1]
        self.in_flight = busy_in_flight(target.measured, samples)
        self.busiest = _busiest(samples) if self.in_flight else None
        readings = {k: _describe(s) for k, s in samples.items()}
        check = still_withdrawn(self.api, target, self.http)  # after the reads: no older
        readings.update(check.readings)
        if check.verdict is Verdict.FAILED:
            self.progress = DrainProgress(rounds=self.progress.rounds + 1)
            return Observation(verdict=Verdict.FAILED, reason=check.reason, readings=readings)
        for each in rounds:  # the last read's verdict stands (a busy one undoes the first)
            self.progress, verdict, reason = observe_round(
                self.progress,
                measured=target.measured,
                samples=each,
                not_withdrawn="" if check.verdict is Verdict.VERIFIED else check.reason,
                at=datetime.now(UTC),
                settle_s=self.settle_s,
            )
        return Observation(
            verdict=verdict,
            reason=reason,
            readings=readings,
            evidence_at=read_at if verdict is Verdict.VERIFIED else None,
        )


def _busiest(samples: dict[str, Sample]) -> str | None:
    """The member holding the most requests in a round (gauges and exact count)."""
    load = {pod: s.in_flight + (s.exact or 0) for pod, s in samples.items() if s.complete}
    pod = max(load, key=lambda p: load[p], default=None)
    return pod if pod is not None and load[pod] > 0 else None


def _describe(s: Sample) -> str:
    if not s.complete:
        return f"UNKNOWN: {s.reason}"
    counters = ",".join(f"{c:g}" for c in s.counters)
    said = f" ({s.reason})" if s.reason else ""
    exact = f" exact={s.exact}" if s.exact is not None else ""
    return f"in_flight={s.in_flight:g}{exact} counters={counters}{said}"
