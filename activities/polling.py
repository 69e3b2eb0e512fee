"""The one loop every polling phase runs inside its single activity: observe, heartbeat
the progress, stop on a verdict, at the deadline, or when cancelled."""

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
    interval: float,
    once: Callable[[], Observation],
    details: Callable[[Observation], Any] = lambda obs: obs,
) -> Observation:
    """Run ``once`` every ``interval`` seconds until it answers VERIFIED or FAILED, or the
    deadline passes (then the last UNKNOWN is returned).  Cancellation raises."""
    polls = 0
    while True:
        polls += 1
        obs = once().model_copy(update={"polls": polls})
        activity.heartbeat(details(obs))
        if obs.verdict is not Verdict.UNKNOWN:
            return obs
        left = seconds_left(deadline)
        if left <= 0:
            return obs
        wait_heartbeating(min(interval, left), details(obs))


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
