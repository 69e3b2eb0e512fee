"""The one loop every polling phase runs inside its single activity: observe, heartbeat
the progress, stop on a verdict, at the deadline, or when cancelled.

Queueing never silently eats a phase's budget: an attempt that waited in the task queue
(a saturated worker) before it started says so in the reason it ends with at the deadline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import CancelledError

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
) -> Observation:
    """Run ``once`` every ``interval`` seconds until it answers VERIFIED or FAILED, or the
    deadline passes (then the last UNKNOWN is returned, with the attempt's queue lag in its
    reason when it is material: ``late_start``).  ``interval`` may be a function of the
    last observation (the drain spaces its reads adaptively).  Cancellation raises."""
    polls = 0
    while True:
        polls += 1
        obs = once().model_copy(update={"polls": polls})
        activity.heartbeat(details(obs))
        if obs.verdict is not Verdict.UNKNOWN:
            return obs
        left = seconds_left(deadline)
        if left <= 0:
            late = late_start()
            if late:
                obs = obs.model_copy(update={"reason": f"{obs.reason}; {late}"})
            return obs
        wait = interval(obs) if callable(interval) else interval
        wait_heartbeating(min(wait, left), details(obs))


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
        activity.heartbeat(details)


def cancel_seen() -> bool:
    """Heartbeat (so a cancel can reach a running activity) and say whether one has; False
    outside an activity.  Checked before every change to the world: once the workflow has
    asked an activity to stop, it must not remove a label or a router worker the restore
    is about to put back."""
    if not activity.in_activity():
        return False
    activity.heartbeat()
    return activity.is_cancelled()


def resumed(kind: type[Any]) -> Any | None:
    """The last heartbeat details of a previous attempt of this activity, as ``kind``."""
    raw = activity.info().heartbeat_details
    if not raw:
        return None
    try:
        return kind.model_validate(raw[-1])
    except Exception:
        return None
