"""Drain reads (SPEC section 5): one bounded, read-only ``pods/exec`` per measured member,
matched to the member by Pod UID and container ID before and after, folded into the
drain rule until every member is idle twice with unchanged counters.

Rounds are spaced by ``retirement.drain.next_read_in``: the poll interval while the
members read idle, nearly idle or incomplete, growing to a bound while they stay busy.
Every exec is counted (``activities.metrics``), so a fleet's cost can be reported.

A worker runs at most ``exec_slots().size`` execs at once (``FairSlots``), whatever the
number of retirements it carries: the drain and router-less withdrawal reads of many
retirements started together arrive together, and each exec costs the API server, the
kubelet and a process start on the node."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from activities.fairslots import FairSlots
from activities.fencing import heartbeat
from activities.metrics import count_exec_read
from activities.oneshot import EXEC_TIMEOUT_S, command, valid_path, valid_port, valid_scheme
from activities.polling import poll_until, resumed, seconds_left
from kube.api import KubeApi
from kube.errors import KubeError
from kube.members import MemberGone, read_member
from retirement.drain import (
    EXACT_IDLE_SPACING_S,
    SGLANG_GAUGE_SETTLE_S,
    DrainProgress,
    busy_in_flight,
    next_read_in,
    observe_round,
    resume,
)
from retirement.models import DrainHeartbeat, MemberTarget, Observation, PhaseInput, Target
from retirement.names import ENGINE_CONTAINER
from retirement.phases import Verdict
from retirement.readings import (
    Sample,
    parse_oneshot_reads,
    series_for,
    steps_counted,
    unknown,
)

OUTPUT_CAP = 64 * 1024

#: Execs one worker runs at once, by default (``retire-worker --max-concurrent-execs``).
DEFAULT_EXEC_SLOTS = 16
#: How long a read waits for an exec slot before it gives up (an UNKNOWN read, followed
#: later: ``retirement.drain.next_read_in``).  With the exec bound, a read takes at most
#: ``EXEC_SLOT_WAIT_S + EXEC_TIMEOUT_S``, inside the phase activities' heartbeat timeout.
EXEC_SLOT_WAIT_S = 3.0
#: The bound of one router answer when the withdrawal is confirmed again in a round.
RECHECK_HTTP_TIMEOUT_S = 3.0


class Replaced(Exception):
    """The member is not the admitted Pod any more (gone, or another UID): a definite fault."""


@dataclass(frozen=True)
class Identity:
    """What binds a read to the admitted member."""

    uid: str
    container_id: str
    restart_count: int


def identity(api: KubeApi, target: Target, m: MemberTarget) -> Identity:
    """The live Pod's UID and ``main`` container identity; raises Replaced."""
    pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
    if isinstance(pod, MemberGone):
        raise Replaced(pod.describe())
    st = pod.container_status(ENGINE_CONTAINER)
    if st is None:
        return Identity(uid=pod.uid, container_id="", restart_count=-1)
    return Identity(uid=pod.uid, container_id=st.container_id, restart_count=st.restart_count)


#: Why a bound: N retirements started together (an autoscaler scaling N deployments down)
#: read together; unbounded, N execs start at once, queue for the API server and the node's
#: CPU, and every one of them times out together (measured on the bed: 50 reads at once
#: took 4.2 s against the 5 s exec bound).  Bounded, they run a few at a time and each one
#: is quick; a read that finds no slot within ``EXEC_SLOT_WAIT_S`` reads UNKNOWN with that
#: reason (never idle) and is followed later, as a timed-out one is.  The slots are shared
#: fairly between namespaces (``activities.fairslots``): one tenant's hundred retirements
#: do not queue ahead of another tenant's one.
_slots = [FairSlots(DEFAULT_EXEC_SLOTS)]


def exec_slots() -> FairSlots:
    """This process's exec slots."""
    return _slots[0]


def limit_execs(size: int) -> FairSlots:
    """Bound this process's concurrent execs to ``size`` (the worker calls it once, at
    start, from ``--max-concurrent-execs``)."""
    _slots[0] = FairSlots(size)
    return _slots[0]


def exec_oneshot(
    api: KubeApi, target: Target, m: MemberTarget, *, twice: bool = False
) -> tuple[str, str]:
    """Run the one-shot in the member's ``main`` container, in one of the worker's exec
    slots; returns (stdout, error).  ``twice``: the exact count's double read."""
    try:
        port = valid_port(None if m.metrics_port is None else str(m.metrics_port))
        scheme, path = valid_scheme(m.metrics_scheme), valid_path(m.metrics_path)
    except ValueError as e:
        return "", f"read refused: {e}"
    series = series_for(target.engine, target.engine_version)
    if series is None:
        return "", f"read refused: unknown engine {target.engine!r}"
    argv = command(
        port=port, scheme=scheme, path=path, names=series.all, exact=m.exact_load, twice=twice
    )
    slots = exec_slots()
    with slots.slot(EXEC_SLOT_WAIT_S, target.namespace) as got:
        if not got:
            return "", (
                f"no exec slot within {EXEC_SLOT_WAIT_S:g} s "
                f"(this worker runs {slots.size} reads at once)"
            )
        result = api.exec_pod(
            namespace=target.namespace,
            name=m.pod,
            container=ENGINE_CONTAINER,
            argv=argv,
            timeout_s=EXEC_TIMEOUT_S,
            output_cap=OUTPUT_CAP,
        )
    count_exec_read(failed=bool(result.error) or result.exit_code not in (0, None))
    if result.error:
        return "", result.error
    if result.exit_code not in (0, None):
        return "", f"one-shot exited {result.exit_code}"
    return result.stdout, ""


def sample_member(api: KubeApi, target: Target, m: MemberTarget) -> Sample:
    """One read of one member; raises Replaced on a definite identity fault."""
    return sample_member_reads(api, target, m, twice=False)[0]


def sample_member_reads(
    api: KubeApi, target: Target, m: MemberTarget, *, twice: bool
) -> list[Sample]:
    """One read of one member, or with ``twice`` (members with the exact count only) two
    reads ``TWICE_SPACING_S`` apart in one exec, both bound to the admitted container by
    the identity read before and after the exec; raises Replaced on a definite identity
    fault."""
    n = 2 if twice else 1

    def all_unknown(reason: str) -> list[Sample]:
        return [unknown(reason)] * n

    try:
        before = identity(api, target, m)
    except KubeError as e:
        return all_unknown(f"read Pod failed: {_http(e)}")
    if not m.container_id:  # admitted as never started: nothing ran, nothing to drain
        if before.container_id:
            raise Replaced(f"member {m.pod} started since admission")
        return [Sample(complete=True, reason="never started: nothing to drain")] * n
    if before.container_id != m.container_id or before.restart_count != m.restart_count:
        return all_unknown("container main restarted since admission")
    stdout, error = exec_oneshot(api, target, m, twice=twice)
    try:
        after = identity(api, target, m)
    except KubeError as e:
        return all_unknown(f"read Pod failed: {_http(e)}")
    if after != before:
        return all_unknown("container main changed during the read")
    if error:
        return all_unknown(error)
    return parse_oneshot_reads(
        engine=target.engine,
        stdout=stdout,
        version=target.engine_version,
        exact=m.exact_load,
        reads=n,
    )


def drain(api: KubeApi, inp: PhaseInput) -> Observation:
    """Poll the measured members until the drain rule holds, or the deadline.

    Every round reads the measured members, then confirms again, read-only, that the
    withdrawal still holds (``activities.recheck``): the label back on a member FAILS the
    drain; a Service listing a target again, or a router selecting one, makes the round
    not idle.  A resumed attempt goes on from the previous attempt's idle read only if
    that read is recent (``retirement.drain.resume``).  The wait after each round is
    ``retirement.drain.next_read_in`` of that round's reads."""
    # Imported here: ``activities.withdrawal`` (which ``recheck`` reads through) imports
    # ``activities.drain``.
    from activities.recheck import still_withdrawn

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


def _http(e: KubeError) -> str:
    return f"HTTP {e.status}" if e.status else f"{type(e).__name__} ({e.reason})"


def _describe(s: Sample) -> str:
    if not s.complete:
        return f"UNKNOWN: {s.reason}"
    counters = ",".join(f"{c:g}" for c in s.counters)
    said = f" ({s.reason})" if s.reason else ""
    exact = f" exact={s.exact}" if s.exact is not None else ""
    return f"in_flight={s.in_flight:g}{exact} counters={counters}{said}"
