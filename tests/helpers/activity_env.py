"""``ActivityEnvironment``s for the offline tests of the activities: an attempt as the
worker runs one (started now, with the product's heartbeat timeout), and one that records a
polling activity's heartbeats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.testing import ActivityEnvironment

from workflows.options import HEARTBEAT


def attempt_env(**info: Any) -> ActivityEnvironment:
    """An environment whose attempt started now, with the phase activities' heartbeat
    timeout and a start-to-close timeout of five minutes (the SDK's default info is an
    attempt started in 1970 with 1 s timeouts: one no lease would let change anything);
    ``info`` replaces fields of it."""
    env = ActivityEnvironment()
    now = datetime.now(UTC)
    fields: dict[str, Any] = {
        "started_time": now,
        "scheduled_time": now,
        "current_attempt_scheduled_time": now,
        "heartbeat_timeout": HEARTBEAT,
        "start_to_close_timeout": timedelta(minutes=5),
        "schedule_to_close_timeout": None,
    }
    env.info = replace(env.info, **(fields | info))
    return env


def recording_env(
    beats: list[Any],
    *,
    on_beat: Callable[[int], None] | None = None,
    resume: list[Any] | None = None,
) -> ActivityEnvironment:
    """An environment appending each poll's heartbeat details to ``beats`` and calling
    ``on_beat`` with how many there are.  The polling loop beats the same details again
    while it waits (so that a cancel reaches it), and an attempt re-sends the details an
    earlier attempt left until it has its own (``activities.fencing``): neither is a poll.
    ``resume``: heartbeat details of a previous attempt (attempt 2)."""
    env = attempt_env()
    earlier = list(resume or [])

    def beat(*details: Any) -> None:
        for d in details:
            if (beats and d == beats[-1]) or (not beats and d in earlier):
                continue
            beats.append(d)
            if on_beat is not None:
                on_beat(len(beats))

    env.on_heartbeat = beat
    if resume is not None:
        env.info = replace(env.info, attempt=2, heartbeat_details=resume)
    return env
