"""What a person reads about a retirement's steps in the Temporal UI and in its reasons:
the activity of each polling phase and its summary, the names of the workflow's timers,
and why an activity failed (a queue timeout named as such)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from activities import RetirementActivities
    from retirement.models import RetirementState
    from retirement.phases import Phase
    from retirement.protocol import ABANDON_AFTER, settled

#: The activity of each polling phase, by typed reference.
PHASE_ACTIVITY: dict[Phase, Callable[..., Any]] = {
    Phase.DISQUALIFIED: RetirementActivities.disqualify,
    Phase.WITHDRAWING: RetirementActivities.withdraw,
    Phase.DRAINING: RetirementActivities.drain,
    Phase.SETTLING: RetirementActivities.settle,
}

SUMMARY: dict[Phase, str] = {
    Phase.DISQUALIFIED: "remove the eligibility label from the admitted members",
    Phase.WITHDRAWING: "wait until Services and every router stop selecting the members",
    Phase.DRAINING: "read the engines' in-flight metrics until idle twice",
    Phase.SETTLING: "wait until the Pods are gone and the capacity released",
}


def backstop_summary(phase: Phase) -> str:
    """The name of the workflow's backstop timer on ``phase``'s activity (the UI's timer)."""
    return (
        f"{phase}: backstop, stop {PHASE_ACTIVITY[phase].__name__} if it outlives its "
        "ScheduleToClose timeout (phase deadline + grace)"
    )


def rerun_summary(phase: Phase) -> str:
    """The name of the timer before ``phase``'s activity runs again (its last read was
    UNKNOWN; an abort, cancellation or cancel-intent cuts it short)."""
    name = PHASE_ACTIVITY[phase].__name__ if phase in PHASE_ACTIVITY else str(phase)
    return f"{phase}: wait, then run {name} again (last read UNKNOWN, before the phase deadline)"


def hold_summary(s: RetirementState) -> str:
    """The name of a held retirement's timer: what is due when it fires (members to put
    back, routers to read again, the abandon bound of a hold asked to end)."""
    due: list[str] = []
    if s.unrestored:
        due.append(f"put back {', '.join(sorted(s.unrestored))} again")
    if s.confirm_at:
        due.append("read the routers again (a member confirmed back by time)")
    if s.cancel_intent is not None and s.end_asked_at is not None and not settled(s):
        due.append(
            f"abandon if still not back {ABANDON_AFTER.total_seconds() / 60:.0f} min "
            "after the hold was asked to end"
        )
    return "held: " + ("; ".join(due) or "look at the held members again")


#: Timeouts that can strike an activity that never started (it waited in the task queue).
_QUEUE_TIMEOUTS = {
    TimeoutType.SCHEDULE_TO_START: "ScheduleToStart",
    TimeoutType.SCHEDULE_TO_CLOSE: "ScheduleToClose",
}


def failure(name: str, e: ActivityError) -> str:
    """Why activity ``name`` ended in ``e``, for a person.  An attempt that timed out before
    it started could not start in time because no worker slot was free, which a generic
    "timed out" would hide: a ScheduleToStart timeout always, a ScheduleToClose one when no
    attempt started (``started_event_id`` unset: 0 on the server, -1 on the test server)."""
    cause = e.cause
    timeout = cause.type if isinstance(cause, ActivityTimeout) else None
    kind = _QUEUE_TIMEOUTS.get(timeout) if timeout is not None else None
    never_started = timeout is TimeoutType.SCHEDULE_TO_START or e.started_event_id <= 0
    if kind is not None and never_started:
        return (
            f"{name} could not start in time: it waited in the task queue until its "
            f"{kind} timeout (no worker slot free)"
        )
    return f"{name} failed: {cause or e}"


def queue_timeout(e: ActivityError) -> bool:
    """The activity timed out waiting in the task queue (its ScheduleToStart timeout)."""
    cause = e.cause
    return isinstance(cause, ActivityTimeout) and cause.type is TimeoutType.SCHEDULE_TO_START
