"""A worker runs at most ``--max-concurrent-execs`` drain reads at once
(``activities.drain.ExecSlots``): N retirements reading together queue for a slot instead
of starting N execs at once, and a read that finds no slot in time reads UNKNOWN with that
reason, never idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import drain as drain_module
from activities.drain import DEFAULT_EXEC_SLOTS, ExecSlots, exec_oneshot, exec_slots, limit_execs
from kube.api import ExecResult
from retirement.models import MemberTarget, Target
from retirement.readings import parse_oneshot_output
from tests.helpers.fake_kube import oneshot_stdout
from worker.config import WorkerConfig


class HeldExecs:
    """An API whose execs hold until released, counting how many run at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.started = 0
        self.release = threading.Event()

    def exec_pod(self, **_: Any) -> ExecResult:
        with self.lock:
            self.running += 1
            self.started += 1
            self.peak = max(self.peak, self.running)
        self.release.wait(30)
        with self.lock:
            self.running -= 1
        return ExecResult(stdout=oneshot_stdout(), exit_code=0)


def member() -> tuple[Target, MemberTarget]:
    m = MemberTarget(
        pod="llm-1", uid="u1", container_id="c1", ip="198.18.1.11", measured=True, metrics_port=8000
    )
    target = Target.model_construct(namespace="default", engine="vLLM", members=[m])
    return target, m


@pytest.fixture(autouse=True)
def default_slots() -> Iterator[None]:
    yield
    limit_execs(DEFAULT_EXEC_SLOTS)


def wait_for(check: Any) -> None:
    deadline = time.monotonic() + 10
    while not check():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.01)


def test_reads_of_many_retirements_run_at_most_the_slots_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit_execs(2)
    monkeypatch.setattr(drain_module, "EXEC_SLOT_WAIT_S", 30.0)
    api = HeldExecs()
    target, m = member()
    results: list[tuple[str, str]] = []
    threads = [
        threading.Thread(target=lambda: results.append(exec_oneshot(api, target, m)))  # type: ignore[arg-type]
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    wait_for(lambda: api.started == 2)
    time.sleep(0.2)  # the other four had every chance to start an exec: they wait instead
    assert api.started == 2
    api.release.set()
    for t in threads:
        t.join(timeout=10)
    assert api.peak == 2 and api.started == 6
    assert all(parse_oneshot_output(engine="vLLM", stdout=out).idle for out, _ in results)


def test_a_read_that_finds_no_slot_in_time_reads_unknown_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit_execs(1)
    monkeypatch.setattr(drain_module, "EXEC_SLOT_WAIT_S", 0.05)
    api = HeldExecs()
    target, m = member()
    holder = threading.Thread(target=exec_oneshot, args=(api, target, m))
    holder.start()
    wait_for(lambda: api.started == 1)
    stdout, error = exec_oneshot(api, target, m)  # type: ignore[arg-type]
    api.release.set()
    holder.join(timeout=10)
    assert stdout == "" and error.startswith("no exec slot within 0.05 s")
    assert api.started == 1  # the refused read made no exec
    assert not parse_oneshot_output(engine="vLLM", stdout=stdout).complete


def test_the_slot_is_given_back_when_the_exec_raises() -> None:
    limit_execs(1)

    class Raising:
        def exec_pod(self, **_: Any) -> ExecResult:
            raise RuntimeError("boom")

    target, m = member()
    for _ in range(3):
        with pytest.raises(RuntimeError):
            exec_oneshot(Raising(), target, m)  # type: ignore[arg-type]
    with exec_slots().slot(0.0) as got:
        assert got


def test_slots_must_be_at_least_one() -> None:
    with pytest.raises(ValueError):
        limit_execs(0)


def test_the_worker_flag_sets_the_slots() -> None:
    cfg = WorkerConfig.parse(["--max-concurrent-execs", "4"], environ={})
    assert cfg.max_concurrent_execs == 4
    assert WorkerConfig.parse([], environ={}).max_concurrent_execs == DEFAULT_EXEC_SLOTS
    assert WorkerConfig.parse([], environ={"RETIRE_MAX_EXECS": "7"}).max_concurrent_execs == 7
    with pytest.raises(SystemExit):
        WorkerConfig.parse(["--max-concurrent-execs", "0"], environ={})


# ---------------------------------------------------------------- earliest deadline first


def queue_behind_one_slot(
    dues: list[datetime | None], *, wait_s: float = 10.0
) -> tuple[ExecSlots, threading.Event, list[int], list[threading.Thread]]:
    """One slot held; a waiter per due (started in list order, each queued before the
    next starts); returns the slots, the event that frees the held slot, the order in
    which the waiters got it, and the waiters."""
    slots, free, served = ExecSlots(1), threading.Event(), []
    held = threading.Event()

    def holder() -> None:
        with slots.slot(0.0) as got:
            assert got
            held.set()
            free.wait(10)

    threading.Thread(target=holder, daemon=True).start()
    held.wait(5)

    def waiter(i: int, due: datetime | None) -> None:
        with slots.slot(wait_s, due=due) as got:
            if got:
                served.append(i)
                time.sleep(0.01)

    waiters = []
    for i, due in enumerate(dues):
        t = threading.Thread(target=waiter, args=(i, due), daemon=True)
        t.start()
        waiters.append(t)
        wait_for(lambda n=i + 1: len(slots._waiting) == n)
    return slots, free, served, waiters


def test_the_read_of_the_phase_that_ends_first_gets_the_next_slot() -> None:
    """A drain read (240 s budget) queued first, then two router-less withdrawal reads
    (30 s budget; the one whose phase started earlier ends earlier): the withdrawals go
    first, earliest deadline first; reads with no deadline go last, in arrival order."""
    now = datetime.now(UTC)
    dues = [now + timedelta(seconds=240), None, now + timedelta(seconds=31), None,
            now + timedelta(seconds=30)]  # fmt: skip
    _, free, served, waiters = queue_behind_one_slot(dues)
    free.set()
    for t in waiters:
        t.join(10)
    assert served == [4, 2, 0, 1, 3]


def test_equal_deadlines_are_served_in_arrival_order() -> None:
    due = datetime.now(UTC) + timedelta(seconds=30)
    _, free, served, waiters = queue_behind_one_slot([due] * 5)
    free.set()
    for t in waiters:
        t.join(10)
    assert served == [0, 1, 2, 3, 4]


def test_a_read_that_gives_up_leaves_the_queue_and_the_next_one_is_served() -> None:
    """The first in line gives up (its wait ends) while the slot is still held: it leaves
    the queue, and when the slot frees the next in line gets it, not nobody."""
    now = datetime.now(UTC)
    slots, free, served, waiters = queue_behind_one_slot([now + timedelta(seconds=5)], wait_s=0.1)
    later = threading.Thread(
        target=lambda: (
            served.append(9)
            if slots._acquire(10.0, (now + timedelta(seconds=60)).timestamp())
            else None
        ),
        daemon=True,
    )
    later.start()
    waiters[0].join(5)
    assert served == [] and len(slots._waiting) == 1  # the first gave up
    free.set()
    later.join(10)
    assert served == [9]


def test_a_read_passes_its_phase_deadline_to_the_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[datetime | None] = []
    real = ExecSlots.slot

    def spy(self: ExecSlots, wait_s: float, *, due: datetime | None = None) -> Any:
        seen.append(due)
        return real(self, wait_s, due=due)

    monkeypatch.setattr(ExecSlots, "slot", spy)
    target, m = member()

    class Quick:
        def exec_pod(self, **_: Any) -> ExecResult:
            return ExecResult(stdout=oneshot_stdout(), exit_code=0)

    due = datetime.now(UTC) + timedelta(seconds=30)
    exec_oneshot(Quick(), target, m, due=due)  # type: ignore[arg-type]
    assert seen == [due]
