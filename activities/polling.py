"""The one loop every polling phase runs inside its single activity: observe, heartbeat
the progress, stop on a verdict, at the deadline, or when cancelled.

Queueing never silently eats a phase's budget: an attempt that waited in the task queue
(a saturated worker) before it started says so in the reason it ends with at the deadline.

A poll that took long is followed by a wait at least as long (``POLL_SHARE``): a slow poll
means the API server, the node or this worker is saturated, and polling again after the
usual interval would only add to it.  Measured in the worker benchmark: 50 retirements
withdrawing at once in one namespace each listed every Service and EndpointSlice of the
namespace once a second, the worker's CPU saturated, polls took seconds and the next one
followed a second later, until the withdrawal budget ran out.

At most ``WorkerSlots.polls.size`` polls run at once in a worker (``--max-concurrent-polls``),
however many retirements it carries: a poll is mostly Python work under one GIL (decoding
the API server's answers), so running more at once adds no throughput, only memory: every
poll in flight holds its decoded lists (measured: 200 threads each decoding a list of 600
EndpointSlices and 600 Services at once peaked at 2.2 GB, 16 at once at 312 MB).  A poll
waits for a slot as it waits for its turn, heartbeating; at the phase deadline it polls
without one (a last look, never a skipped one).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import CancelledError

from activities.fairslots import FairSlots
from activities.fencing import heartbeat
from retirement.models import Observation
from retirement.phases import Verdict


def seconds_left(deadline: datetime) -> float:
    """Seconds until ``deadline`` (negative once past)."""
    return (deadline - datetime.now(UTC)).total_seconds()


def poll_until(
    *,
    deadline: datetime,
    interval: float | Callable[[Observation], float],
    once: Callable[[], Observation],
    details: Callable[[Observation], Any] = lambda obs: obs,
    tenant: str = "",
    slots: FairSlots | None = None,
    pause: Callable[[float, Any], None] | None = None,
) -> Observation:
    """Run ``once`` every ``interval`` seconds until it answers VERIFIED or FAILED, or the
    deadline passes (then the last UNKNOWN is returned, with the attempt's queue lag in its
    reason when it is material: ``late_start``).  ``interval`` may be a function of the
    last observation (the drain spaces its reads adaptively).  ``tenant`` (the target's
    namespace) is whose share of the poll ``slots`` (None: the process's default) a poll
    takes.  ``pause(seconds, details)`` waits between polls instead of
    ``wait_heartbeating`` (it may end sooner, when what it waits for happened: the drain
    waits for an engine to go idle); it must heartbeat as that does.  Cancellation
    raises."""
    polls = 0
    slots = poll_slots() if slots is None else slots
    turn = _Turn(slots, tenant, deadline, held=_first_slot(slots, tenant))
    outer, _turns.turn = getattr(_turns, "turn", None), turn
    try:
        while True:
            polls += 1
            began = time.monotonic()
            try:
                obs = once().model_copy(update={"polls": polls})
            finally:
                if turn.held:
                    turn.held = False
                    slots.release(tenant)
            # Time the poll lent its slot is a deliberate wait, not a sign of load.
            took, turn.lent_s = time.monotonic() - began - turn.lent_s, 0.0
            turn.details = details(obs)
            heartbeat(turn.details)
            if obs.verdict is not Verdict.UNKNOWN:
                return obs
            left = seconds_left(deadline)
            if left <= 0:
                late = late_start()
                if late:
                    obs = obs.model_copy(update={"reason": f"{obs.reason}; {late}"})
                return obs
            wait = interval(obs) if callable(interval) else interval
            (pause or wait_heartbeating)(min(backpressure(wait, took), left), turn.details)
            turn.held = take_slot(slots, deadline, turn.details, tenant)
    finally:
        _turns.turn = outer


class _Turn:
    """A poll loop's hold on its poll slot, for ``slot_lent``: the slots, whose share, the
    phase deadline, whether a slot is held now, and the details last heartbeated (None
    before the first poll ended)."""

    def __init__(self, slots: FairSlots, tenant: str, deadline: datetime, *, held: bool) -> None:
        self.slots, self.tenant, self.deadline, self.held = slots, tenant, deadline, held
        self.details: Any = None
        #: Seconds the current poll has lent its slot (``slot_lent``).
        self.lent_s = 0.0


#: The poll loop running in this thread (an activity runs in a thread of its own).
_turns = threading.local()


@contextmanager
def slot_lent() -> Iterator[None]:
    """Inside a poll: give its poll slot back for the duration of a long wait that holds no
    decoded answers (an exec keeping a quiet window), and take one again after it, waiting
    and heartbeating as between polls (at the deadline the poll goes on without one).  Not
    taken again when the wait raised (the exception ends the poll: the caller lets it
    through, as a cancel or a failed read of the world must).  Outside a poll loop, or in a
    poll that holds no slot, there is nothing to give back.  Either way the time lent is
    not counted as the poll's own (``backpressure``): it is a wait, not a sign of load."""
    turn: _Turn | None = getattr(_turns, "turn", None)
    if turn is None:
        yield
        return
    held, turn.held = turn.held, False
    if held:
        turn.slots.release(turn.tenant)
    began = time.monotonic()
    try:
        yield
    finally:
        turn.lent_s += time.monotonic() - began
    if held:
        turn.held = take_slot(turn.slots, turn.deadline, turn.details, turn.tenant)


#: Polls one worker runs at once, by default (``retire-worker --max-concurrent-polls``).
#: A poll's Python work (decoding the API server's answers) runs under the GIL, so many
#: at once only hold more decoded answers in memory and starve each other's I/O of the
#: GIL (an exec whose websocket is read by a starved thread times out).  But a poll holds
#: its slot for its whole round, its exec reads included, and those wait seconds on a
#: loaded node while the exec slots (``activities.sampling.DEFAULT_EXEC_SLOTS``, 16) bound
#: them already.  With as many poll slots as exec slots, the slots were held by polls
#: waiting on execs and a drain's first poll waited for one (up to ``FIRST_SLOT_WAIT_S``):
#: in the worker benchmark (N = 50, one run each) its first read came 4.3 s (p50) after
#: its start with 16 and 1.2 s with 64; over three runs each the drain after idle took
#: 5.5 s (median of the p50s) with 16 and 4.4 s with 64, at the same peak memory (the
#: polls of one namespace share one decoded list, ``kube.sharing``).
DEFAULT_POLL_SLOTS = 64
#: How long the first poll of an attempt waits for a slot before it polls without one: it
#: has no progress of its own to heartbeat yet, and must not go quiet past the heartbeat
#: timeout (10 s).
FIRST_SLOT_WAIT_S = 5.0

#: Shared fairly between namespaces (``activities.fairslots``).
_poll_slots = [FairSlots(DEFAULT_POLL_SLOTS)]


def poll_slots() -> FairSlots:
    """The process's default poll slots: those of a poll loop given none (a worker's
    ``RetirementActivities`` passes its own, ``activities.fairslots.WorkerSlots``)."""
    return _poll_slots[0]


def limit_polls(size: int) -> None:
    """Bound the process's default poll slots to ``size``."""
    _poll_slots[0] = FairSlots(size)


def _first_slot(slots: FairSlots, tenant: str = "") -> bool:
    """Wait up to ``FIRST_SLOT_WAIT_S`` for the first poll's slot, heartbeating meanwhile
    (a bare heartbeat: the details an earlier attempt left are kept, not wiped).  True
    once one is held.  Cancellation raises.  One place in the queue for the whole wait."""
    end = time.monotonic() + FIRST_SLOT_WAIT_S
    ticket = slots.request(tenant)
    try:
        while True:
            left = end - time.monotonic()
            if ticket.wait(max(0.0, min(left, HEARTBEAT_EVERY_S))):
                return True
            if activity.in_activity() and activity.is_cancelled():
                raise CancelledError("cancelled while waiting for a poll slot")
            if left <= HEARTBEAT_EVERY_S:
                return ticket.cancel()
            heartbeat()
    except BaseException:
        if ticket.cancel():  # given meanwhile: give it back
            slots.release(tenant)
        raise


def take_slot(slots: FairSlots, deadline: datetime, details: Any, tenant: str = "") -> bool:
    """Wait for a poll slot, heartbeating ``details`` (None: the last ones again), so a
    cancel reaches the activity and the heartbeat timeout is not tripped; True once one is
    held, False at the deadline
    (the caller then polls without one).  Cancellation raises.  One place in the queue
    for the whole wait."""
    ticket = slots.request(tenant)
    try:
        while True:
            if ticket.wait(HEARTBEAT_EVERY_S):
                return True
            if activity.is_cancelled():
                raise CancelledError("cancelled while waiting for a poll slot")
            if seconds_left(deadline) <= 0:
                return ticket.cancel()
            if details is None:
                heartbeat()  # no poll ended yet: the details already beaten are kept
            else:
                heartbeat(details)
    except BaseException:
        if ticket.cancel():
            slots.release(tenant)
        raise


#: The largest share of a polling activity's time spent polling: after a poll that took
#: ``t`` seconds, the next one comes no sooner than ``t * (1 / POLL_SHARE - 1)`` later.
POLL_SHARE = 0.5


def backpressure(wait_s: float, took_s: float) -> float:
    """The wait after a poll that took ``took_s``: the planned ``wait_s``, stretched so
    that polling takes at most ``POLL_SHARE`` of the time.  Waiting longer skips no
    reading: the drain's rounds stay consecutive and a quiet window is measured in time,
    so it only makes the phase end later; the phase deadline still bounds it."""
    return max(wait_s, took_s * (1.0 / POLL_SHARE - 1.0))


#: A queue lag from this many seconds on is told in the reason of a phase that ended
#: UNKNOWN at its deadline (below it, ordinary dispatch latency).
MATERIAL_QUEUE_LAG_S = 2.0


def queue_lag_s() -> float:
    """Seconds this attempt waited in the task queue (scheduled to started, both stamped
    by the Temporal server, so no clock skew); 0 outside an activity."""
    if not activity.in_activity():
        return 0.0
    info = activity.info()
    return max(0.0, (info.started_time - info.current_attempt_scheduled_time).total_seconds())


def late_start() -> str:
    """Why part of the budget went before any poll, when this attempt started materially
    late (a worker with no free activity slot); empty otherwise."""
    lag = queue_lag_s()
    if lag < MATERIAL_QUEUE_LAG_S:
        return ""
    return f"this attempt started {lag:.0f} s after it was scheduled (worker busy)"


#: The longest stretch a polling activity goes without a heartbeat while it waits.
HEARTBEAT_EVERY_S = 1.0


def wait_heartbeating(seconds: float, details: Any) -> None:
    """Wait ``seconds``, heartbeating at least every ``HEARTBEAT_EVERY_S`` (so a cancel can
    reach the activity and a long poll interval never trips the heartbeat timeout).
    Cancellation raises."""
    end = time.monotonic() + seconds
    while True:
        left = end - time.monotonic()
        if left > 0:
            activity.wait_for_cancelled_sync(min(left, HEARTBEAT_EVERY_S))
        if activity.is_cancelled():
            raise CancelledError("cancelled while polling")
        if left <= 0:
            return
        heartbeat(details)


def resumed(kind: type[Any]) -> Any | None:
    """The last heartbeat details of a previous attempt of this activity, as ``kind``."""
    raw = activity.info().heartbeat_details
    if not raw:
        return None
    try:
        return kind.model_validate(raw[-1])
    except ValidationError:
        return None  # unreadable: the attempt starts afresh
