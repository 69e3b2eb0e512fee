"""At most ``--max-concurrent-polls`` polls run at once in a worker
(``activities.polling.poll_slots``): a fleet's polls take turns instead of all decoding
their answers at once; a poll waiting for its turn heartbeats; at the phase deadline it
polls without a slot (a last look, never a skipped one)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import polling
from activities.polling import DEFAULT_POLL_SLOTS, limit_polls, poll_slots, poll_until, take_slot
from retirement.models import Observation
from retirement.phases import Verdict
from tests.helpers.activity_env import attempt_env
from worker.config import WorkerConfig


@pytest.fixture(autouse=True)
def default_slots() -> Iterator[None]:
    yield
    limit_polls(DEFAULT_POLL_SLOTS)


def wait_for(check: Any) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.01)


def test_the_polls_of_many_retirements_run_at_most_the_slots_at_once() -> None:
    limit_polls(2)
    lock = threading.Lock()
    running = [0, 0, 0]  # now, peak, started
    release = threading.Event()

    def once() -> Observation:
        with lock:
            running[0] += 1
            running[2] += 1
            running[1] = max(running[1], running[0])
        release.wait(30)
        with lock:
            running[0] -= 1
        return Observation(verdict=Verdict.VERIFIED, reason="done")

    deadline = datetime.now(UTC) + timedelta(seconds=300)

    def one() -> None:
        attempt_env().run(poll_until, deadline=deadline, interval=1.0, once=once)

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    wait_for(lambda: running[2] == 2)
    time.sleep(0.2)  # the other four had every chance to poll: they wait for a slot instead
    assert running[2] == 2
    release.set()
    for t in threads:
        t.join(timeout=20)
    assert running[1] == 2 and running[2] == 6


def test_waiting_for_a_slot_heartbeats_the_last_progress() -> None:
    limit_polls(1)
    slots = poll_slots()
    assert slots.acquire(timeout=1)  # another retirement's poll holds the only slot
    beats: list[Any] = []
    env = attempt_env()
    env.on_heartbeat = lambda *d: beats.append(d)
    deadline = datetime.now(UTC) + timedelta(seconds=300)
    timer = threading.Timer(2.5, slots.release)
    timer.start()
    held = env.run(take_slot, slots, deadline, {"progress": 7})
    timer.join()
    assert held is True
    assert beats and all(b == ({"progress": 7},) for b in beats)
    slots.release()


def test_at_the_deadline_the_last_poll_is_made_without_a_slot() -> None:
    limit_polls(1)
    slots = poll_slots()
    assert slots.acquire(timeout=1)
    past = datetime.now(UTC) - timedelta(seconds=1)
    held = attempt_env().run(take_slot, slots, past, None)
    assert held is False
    slots.release()


def test_the_worker_flag_sets_the_poll_slots() -> None:
    assert WorkerConfig.parse(["--max-concurrent-polls", "8"], environ={}).max_concurrent_polls == 8
    assert WorkerConfig.parse([], environ={}).max_concurrent_polls == DEFAULT_POLL_SLOTS
    with pytest.raises(SystemExit):
        WorkerConfig.parse(["--max-concurrent-polls", "0"], environ={})
    with pytest.raises(ValueError):
        limit_polls(0)
    assert polling.FIRST_SLOT_WAIT_S < 10  # inside the phase activities' heartbeat timeout
