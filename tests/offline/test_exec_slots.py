"""A worker runs at most ``--max-concurrent-execs`` drain reads at once
(``activities.fairslots.FairSlots``): N retirements reading together queue for a slot instead
of starting N execs at once, and a read that finds no slot in time reads UNKNOWN with that
reason, never idle."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from activities import sampling as sampling_module
from activities.fairslots import DEFAULT_WAIT_SLOTS
from activities.sampling import DEFAULT_EXEC_SLOTS, exec_oneshot, exec_slots, limit_execs
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
    monkeypatch.setattr(sampling_module, "EXEC_SLOT_WAIT_S", 30.0)
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
    monkeypatch.setattr(sampling_module, "EXEC_SLOT_WAIT_S", 0.05)
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


def test_a_worker_reads_in_the_slots_its_activities_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's slots are sized by its flags and owned by its activities: a read in
    them waits for them alone, whatever the process's default pool holds."""
    monkeypatch.setattr(sampling_module, "EXEC_SLOT_WAIT_S", 0.05)
    cfg = WorkerConfig.parse(
        ["--max-concurrent-execs", "1", "--max-concurrent-polls", "3"],
        environ={"RETIRE_MAX_WAITS": "5"},
    )
    slots = cfg.slots()
    assert (slots.execs.size, slots.polls.size, slots.waits.size) == (1, 3, 5)
    assert WorkerConfig.parse([], environ={}).slots().waits.size == DEFAULT_WAIT_SLOTS
    target, m = member()
    api = HeldExecs()
    api.release.set()
    with slots.execs.slot(0.0, target.namespace) as got:
        assert got
        _, error = exec_oneshot(api, target, m, slots=slots.execs)  # type: ignore[arg-type]
        assert (
            error == "no exec slot within 0.05 s (this worker runs 1 reads at once now, at most 1)"
        )
        stdout, error = exec_oneshot(api, target, m)  # type: ignore[arg-type]
        assert error == "" and stdout  # the default pool is another pool
    assert exec_slots().size == DEFAULT_EXEC_SLOTS
