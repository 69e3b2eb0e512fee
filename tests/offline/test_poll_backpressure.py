"""A poll that took long is followed by a wait at least as long
(``activities.polling.backpressure``): a saturated API server or worker is not polled again
a second later.  Found in the worker benchmark (50 withdrawals at once in one namespace:
polls took seconds, the next followed a second later, the withdrawal budget ran out)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from activities import polling
from activities.polling import POLL_SHARE, backpressure, poll_until
from retirement.models import Observation
from retirement.phases import Verdict
from tests.helpers.activity_env import attempt_env


class Clock:
    """A monotonic clock that only moves when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_slow_poll_stretches_the_wait_to_keep_polling_under_its_share() -> None:
    assert POLL_SHARE == 0.5
    assert backpressure(1.0, 0.2) == 1.0  # a quick poll: the planned wait
    assert backpressure(1.0, 3.0) == 3.0  # a 3 s poll: 3 s of rest before the next
    assert backpressure(8.0, 3.0) == 8.0  # a longer planned wait stays


def test_poll_until_waits_after_a_slow_poll_as_long_as_it_took(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(polling.time, "monotonic", clock)
    waits: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _d: waits.append(s))
    took = iter([4.0, 0.1, 2.5])

    def once() -> Observation:
        clock.now += next(took)
        done = len(waits) == 2
        return Observation(verdict=Verdict.VERIFIED if done else Verdict.UNKNOWN, reason="r")

    deadline = datetime.now(UTC) + timedelta(seconds=300)
    obs = attempt_env().run(poll_until, deadline=deadline, interval=1.0, once=once)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 3
    assert waits == [4.0, 1.0]


def test_the_deadline_still_bounds_the_stretched_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(polling.time, "monotonic", clock)
    waits: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _d: waits.append(s))

    def once() -> Observation:
        clock.now += 50.0
        if waits:
            return Observation(verdict=Verdict.FAILED, reason="stop")
        return Observation(verdict=Verdict.UNKNOWN, reason="r")

    deadline = datetime.now(UTC) + timedelta(seconds=20)
    attempt_env().run(poll_until, deadline=deadline, interval=1.0, once=once)
    assert len(waits) == 1 and 0 < waits[0] <= 20.0
