"""Drain reads (SPEC section 5): one bounded, read-only ``pods/exec`` per measured member
(``activities.sampling``: matched to the member by Pod UID and container ID before and
after), folded into the drain rule until every member is idle twice with unchanged
counters.

Rounds are spaced by ``retirement.drain.next_read_in``: the poll interval while the
members read idle, nearly idle or incomplete, growing to a bound while they stay busy."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from activities.fencing import heartbeat
from activities.polling import poll_until, resumed, seconds_left
from activities.recheck import still_withdrawn
from activities.sampling import Replaced, sample_member_reads
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


def drain(api: KubeApi, inp: PhaseInput) -> Observation:
    """Poll the measured members until the drain rule holds, or the deadline.

    Every round reads the measured members, then confirms again, read-only, that the
    withdrawal still holds (``activities.recheck``): the label back on a member FAILS the
    drain; a Service listing a target again, or a router selecting one, makes the round
    not idle.  A resumed attempt goes on from the previous attempt's idle read only if
    that read is recent (``retirement.drain.resume``).  The wait after each round is
    ``retirement.drain.next_read_in`` of that round's reads."""
    target = inp.target
    members = [m for m in target.members if m.measured]
    settle_s = 0.0 if steps_counted(target.engine, target.engine_version) else SGLANG_GAUGE_SETTLE_S
    state: DrainHeartbeat = resumed(DrainHeartbeat) or DrainHeartbeat()
    progress: list[DrainProgress] = [
        resume(state.progress, now=datetime.now(UTC), poll_interval_s=inp.poll_interval_s)
    ]
    #: The last round's requests in flight (None: not every read complete), and the wait
    #: before that round: what the next wait is derived from.
    in_flight: list[float | None] = [None]
    spacing = [inp.poll_interval_s]

    exact = all(m.exact_load for m in members) and bool(members)

    def next_wait(_: Observation) -> float:
        spacing[0] = next_read_in(
            in_flight=in_flight[0],
            previous_s=spacing[0],
            base_s=inp.poll_interval_s,
            left_s=seconds_left(inp.deadline),
            idle_s=EXACT_IDLE_SPACING_S if exact else None,
        )
        return spacing[0]

    with httpx.Client(trust_env=False, timeout=RECHECK_HTTP_TIMEOUT_S) as http:

        def once() -> Observation:
            read_at = datetime.now(UTC)  # the round's reads are no older than this
            # With the exact count, each exec reads twice (the proof's two reads, spaced as
            # the count allows), and the round folds both into the rule in order.
            reads: dict[str, list[Sample]] = {}
            for m in members:
                heartbeat()  # one read may take its exec slot wait and exec bound
                try:
                    reads[m.pod] = sample_member_reads(api, target, m, twice=exact)
                except Replaced as e:
                    return Observation(verdict=Verdict.FAILED, reason=f"member {e}")
            rounds = [{k: v[i] for k, v in reads.items()} for i in range(2 if exact else 1)]
            samples = rounds[-1]
            in_flight[0] = busy_in_flight(target.measured, samples)
            readings = {k: _describe(s) for k, s in samples.items()}
            check = still_withdrawn(api, target, http)  # after the reads: no older than them
            readings.update(check.readings)
            if check.verdict is Verdict.FAILED:
                progress[0] = DrainProgress(rounds=progress[0].rounds + 1)
                return Observation(verdict=Verdict.FAILED, reason=check.reason, readings=readings)
            for each in rounds:  # the last read's verdict stands (a busy one undoes the first)
                new, verdict, reason = observe_round(
                    progress[0],
                    measured=target.measured,
                    samples=each,
                    not_withdrawn="" if check.verdict is Verdict.VERIFIED else check.reason,
                    at=datetime.now(UTC),
                    settle_s=settle_s,
                )
                progress[0] = new
            return Observation(
                verdict=verdict,
                reason=reason,
                readings=readings,
                evidence_at=read_at if verdict is Verdict.VERIFIED else None,
            )

        return poll_until(
            deadline=inp.deadline,
            interval=next_wait,
            once=once,
            details=lambda obs: DrainHeartbeat(progress=progress[0], readings=obs.readings),
            tenant=target.namespace,
        )


def _describe(s: Sample) -> str:
    if not s.complete:
        return f"UNKNOWN: {s.reason}"
    counters = ",".join(f"{c:g}" for c in s.counters)
    said = f" ({s.reason})" if s.reason else ""
    exact = f" exact={s.exact}" if s.exact is not None else ""
    return f"in_flight={s.in_flight:g}{exact} counters={counters}{said}"
