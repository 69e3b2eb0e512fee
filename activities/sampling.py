"""Member sampling: one bounded, read-only ``pods/exec`` of the one-shot in a member's
``main`` container, matched to the admitted member by Pod UID and container ID before and
after (``Replaced`` when it is not that Pod any more).  The drain's rounds read through it
(``activities.drain``), and so do the router-less withdrawal's quiet-window reads
(``activities.withdrawal``).

Every exec is counted (``activities.metrics``), so a fleet's cost can be reported.

A worker runs at most ``WorkerSlots.execs.size`` execs at once (``FairSlots``), whatever the
number of retirements it carries: the drain and router-less withdrawal reads of many
retirements started together arrive together, and each exec costs the API server, the
kubelet and a process start on the node.  The execs that mostly sleep in the container
(a wait for idle, a quiet window kept in one exec) hold a wait slot instead
(``WorkerSlots.waits``), never queued for."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from activities.fairslots import DEFAULT_WAIT_SLOTS, FairSlots
from activities.fencing import heartbeat
from activities.metrics import count_exec_read
from activities.oneshot import (
    EXEC_TIMEOUT_S,
    command,
    quiet_command,
    valid_path,
    valid_port,
    valid_scheme,
    wait_command,
)
from kube.api import KubeApi
from kube.errors import KubeError
from kube.members import MemberGone, read_member
from kube.podexec import OVERRAN
from retirement.models import MemberTarget, Target
from retirement.names import ENGINE_CONTAINER
from retirement.readings import (
    QuietReads,
    Sample,
    parse_oneshot_reads,
    parse_quiet_output,
    series_for,
    unknown,
)

OUTPUT_CAP = 64 * 1024

#: Execs one worker runs at once, by default (``retire-worker --max-concurrent-execs``).
DEFAULT_EXEC_SLOTS = 16
#: How long a read waits for an exec slot before it gives up (an UNKNOWN read, followed
#: later: ``retirement.drain.next_read_in``).  With the exec bound, a read takes at most
#: ``EXEC_SLOT_WAIT_S + EXEC_TIMEOUT_S``, inside the phase activities' heartbeat timeout.
EXEC_SLOT_WAIT_S = 3.0


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
    """The process's default exec slots: those of a read given none (a worker's
    ``RetirementActivities`` passes its own, ``activities.fairslots.WorkerSlots``)."""
    return _slots[0]


_WAIT_SLOTS = FairSlots(DEFAULT_WAIT_SLOTS)


def wait_slots() -> FairSlots:
    """The process's default wait slots (``wait_for_idle``), for a caller given none."""
    return _WAIT_SLOTS


def limit_execs(size: int) -> FairSlots:
    """Bound the process's default exec slots to ``size``."""
    _slots[0] = FairSlots(size)
    return _slots[0]


#: A read that took less than this is quick: the node has room for one more at once.
QUICK_S = EXEC_TIMEOUT_S / 4


def pace_execs(slots: FairSlots, *, took_s: float, overran: bool) -> None:
    """Fit the reads at once to what the node answers in time (``FairSlots.congested``):
    an exec past its bound halves them, once per bound (the execs begun before the cut
    overrun the old bound); a quick one adds one back."""
    if overran:
        slots.congested(hold_s=EXEC_TIMEOUT_S)
    elif took_s < QUICK_S:
        slots.uncongested()


def exec_oneshot(
    api: KubeApi,
    target: Target,
    m: MemberTarget,
    *,
    twice: bool = False,
    slots: FairSlots | None = None,
) -> tuple[str, str]:
    """Run the one-shot in the member's ``main`` container, in one of the worker's exec
    ``slots`` (None: the process's default); returns (stdout, error).  ``twice``: the
    exact count's double read."""
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
    slots = exec_slots() if slots is None else slots
    with slots.slot(EXEC_SLOT_WAIT_S, target.namespace) as got:
        if not got:
            return "", (
                f"no exec slot within {EXEC_SLOT_WAIT_S:g} s "
                f"(this worker runs {slots.limit} reads at once now, at most {slots.size})"
            )
        heartbeat()  # after the slot's wait: the exec's bound may follow without one
        began = time.monotonic()
        result = api.exec_pod(
            namespace=target.namespace,
            name=m.pod,
            container=ENGINE_CONTAINER,
            argv=argv,
            timeout_s=EXEC_TIMEOUT_S,
            output_cap=OUTPUT_CAP,
        )
        took = time.monotonic() - began
    pace_execs(slots, took_s=took, overran=result.error.startswith(OVERRAN))
    count_exec_read(failed=bool(result.error) or result.exit_code not in (0, None))
    if result.error:
        return "", result.error
    if result.exit_code not in (0, None):
        return "", f"one-shot exited {result.exit_code}"
    return result.stdout, ""


def sample_member(
    api: KubeApi, target: Target, m: MemberTarget, *, slots: FairSlots | None = None
) -> Sample:
    """One read of one member; raises Replaced on a definite identity fault."""
    return sample_member_reads(api, target, m, twice=False, slots=slots)[0]


def sample_member_reads(
    api: KubeApi,
    target: Target,
    m: MemberTarget,
    *,
    twice: bool,
    slots: FairSlots | None = None,
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
    stdout, error = exec_oneshot(api, target, m, twice=twice, slots=slots)
    changed = _changed_after(api, target, m, before)
    if changed or error:
        return all_unknown(changed or error)
    return parse_oneshot_reads(
        engine=target.engine,
        stdout=stdout,
        version=target.engine_version,
        exact=m.exact_load,
        reads=n,
    )


#: The most of a wait one-shot's output read (one short line).
WAIT_OUTPUT_CAP = 4096


@dataclass(frozen=True)
class Waited:
    """How a wait for idle ended: ``idle`` only when the engine's count read 0 (the one
    ending that lets the caller read at once); ``said``: what it saw, for the log."""

    idle: bool
    said: str


def wait_for_idle(
    api: KubeApi,
    target: Target,
    m: MemberTarget,
    *,
    wait_s: float,
    slots: FairSlots,
    tick: Callable[[], None] | None = None,
) -> Waited | None:
    """Wait in the member's ``main`` container, up to ``wait_s``, for its engine's exact
    count (``GET /load``) to read 0 (``activities.oneshot.WAIT_SCRIPT``): a trigger, never
    evidence; the caller's next read is the evidence, bound to the admitted container as
    every read is.  None when it could not wait at all: the member has no exact count, its
    metrics annotations are refused, or no wait slot is free now (it never queues for one).
    ``tick`` runs at least once a second meanwhile (the caller's heartbeat).  The exec is
    counted as a drain exec: it costs what a read costs to start."""
    if not m.exact_load or not m.container_id:
        return None
    try:
        port = valid_port(None if m.metrics_port is None else str(m.metrics_port))
        argv = wait_command(port=port, scheme=valid_scheme(m.metrics_scheme), wait_s=wait_s)
    except ValueError:
        return None
    if not slots.acquire(0.0, target.namespace):
        return None
    try:
        result = api.exec_pod(
            namespace=target.namespace,
            name=m.pod,
            container=ENGINE_CONTAINER,
            argv=argv,
            timeout_s=wait_s + EXEC_TIMEOUT_S,
            output_cap=WAIT_OUTPUT_CAP,
            tick=tick,
        )
    finally:
        slots.release(target.namespace)
    count_exec_read(failed=bool(result.error) or result.exit_code not in (0, None))
    line = result.stdout.strip("\n")
    if result.error or result.exit_code not in (0, None):
        return Waited(idle=False, said=result.error or f"wait exited {result.exit_code}")
    head, _, rest = line.partition("\t")
    if head == "#idle" and "\n" not in rest:
        return Waited(idle=True, said=f"idle after {rest[:12]} s")
    return Waited(idle=False, said=line[:200] or "wait said nothing")


def quiet_window_read(
    api: KubeApi,
    target: Target,
    m: MemberTarget,
    *,
    wait_s: float,
    window_s: float,
    slots: FairSlots,
    tick: Callable[[], None] | None = None,
    lend: Callable[[], AbstractContextManager[None]] = nullcontext,
) -> QuietReads | None:
    """A whole router-less quiet window of one member with the exact count, in one exec
    (``activities.oneshot.quiet_command``): wait up to ``wait_s`` for its count to read 0,
    read, keep ``window_s``, read again; both reads bound to the admitted container by the
    identity read before and after the exec, as every read is.  None when it cannot be
    made this way (no exact count, a member never started, its metrics annotations
    refused, a window over ``MAX_WINDOW_S``, or no wait slot free now: the exec holds one
    for its whole wait and window, and never queues for it); the caller then reads the
    window's two ends as before.  ``tick`` runs at least once a second meanwhile (the
    caller's heartbeat); ``lend`` is entered around the exec alone (the caller's poll
    slot is lent while it runs: ``activities.polling.slot_lent``).  The exec takes a wait
    slot, not an exec slot: it is mostly a sleeping process, as a wait is.  Raises
    Replaced on a definite identity fault."""
    if not m.exact_load or not m.container_id:
        return None
    series = series_for(target.engine, target.engine_version)
    if series is None:
        return None
    # As the one-shot is told them (milliseconds): the wait never longer than asked (the
    # exec's bound covers it), the window never shorter.
    wait_s, window_s = math.floor(wait_s * 1000) / 1000, math.ceil(window_s * 1000) / 1000
    try:
        port = valid_port(None if m.metrics_port is None else str(m.metrics_port))
        argv = quiet_command(
            port=port,
            scheme=valid_scheme(m.metrics_scheme),
            path=valid_path(m.metrics_path),
            names=series.all,
            wait_s=wait_s,
            window_s=window_s,
        )
    except ValueError:
        return None

    def broken(reason: str) -> QuietReads:
        return QuietReads(reads=(unknown(reason), unknown(reason)))

    if not slots.acquire(0.0, target.namespace):
        return None
    try:
        try:
            before = identity(api, target, m)
        except KubeError as e:
            return broken(f"read Pod failed: {_http(e)}")
        if before.container_id != m.container_id or before.restart_count != m.restart_count:
            return broken("container main restarted since admission")
        with lend():
            result = api.exec_pod(
                namespace=target.namespace,
                name=m.pod,
                container=ENGINE_CONTAINER,
                argv=argv,
                timeout_s=wait_s + window_s + EXEC_TIMEOUT_S,
                output_cap=OUTPUT_CAP,
                tick=tick,
            )
    finally:
        slots.release(target.namespace)
    count_exec_read(failed=bool(result.error) or result.exit_code not in (0, None))
    changed = _changed_after(api, target, m, before)
    if changed:
        return broken(changed)
    if result.error:
        return broken(result.error)
    if result.exit_code not in (0, None):
        return broken(f"one-shot exited {result.exit_code}")
    return parse_quiet_output(
        engine=target.engine, stdout=result.stdout, version=target.engine_version
    )


def _changed_after(api: KubeApi, target: Target, m: MemberTarget, before: Identity) -> str:
    """Read after an exec: why its output is not bound to the container it began in ("" when
    it is: the same Pod and container, not restarted).  Raises Replaced."""
    try:
        after = identity(api, target, m)
    except KubeError as e:
        return f"read Pod failed: {_http(e)}"
    return "" if after == before else "container main changed during the read"


def _http(e: KubeError) -> str:
    return f"HTTP {e.status}" if e.status else f"{type(e).__name__} ({e.reason})"
