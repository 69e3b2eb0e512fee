"""One ``ActivityEnvironment`` that records a polling activity's heartbeats, for the offline
tests of the activities."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from temporalio.testing import ActivityEnvironment


def recording_env(
    beats: list[Any],
    *,
    on_beat: Callable[[int], None] | None = None,
    resume: list[Any] | None = None,
) -> ActivityEnvironment:
    """An environment appending each poll's heartbeat details to ``beats`` and calling
    ``on_beat`` with how many there are.  The polling loop beats the same details again
    while it waits (so that a cancel reaches it): those repeats are not another poll.
    ``resume``: heartbeat details of a previous attempt (attempt 2)."""
    env = ActivityEnvironment()

    def beat(*details: Any) -> None:
        for d in details:
            if beats and d == beats[-1]:
                continue
            beats.append(d)
            if on_beat is not None:
                on_beat(len(beats))

    env.on_heartbeat = beat
    if resume is not None:
        env.info = replace(env.info, attempt=2, heartbeat_details=resume)
    return env
