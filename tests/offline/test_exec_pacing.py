"""The exec reads at once follow what the node answers in time (``FairSlots.congested``,
``activities.sampling.pace_execs``): an exec past its bound halves them, once per bound;
a quick one adds one back; slots in use are never taken back, and a waiter gets a slot as
soon as the bound allows it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import RetirementActivities
from activities import sampling as sampling_module
from activities.fairslots import FairSlots, WorkerSlots
from activities.oneshot import EXEC_TIMEOUT_S
from activities.sampling import QUICK_S, exec_oneshot, pace_execs
from kube.api import ExecResult
from kube.podexec import OVERRAN
from retirement.models import MemberTarget, PhaseInput, Target
from retirement.phases import Verdict
from retirement.reports import Observation
from tests.helpers.activity_env import attempt_env
from tests.helpers.admission import admitted
from tests.helpers.fake_kube import FakeKube, oneshot_stdout

NS = "default"
IDLE = ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0)


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.01)


def member() -> tuple[Target, MemberTarget]:
    m = MemberTarget(
        pod="llm-1", uid="u1", container_id="c1", ip="198.18.1.11", measured=True, metrics_port=8000
    )
    return Target.model_construct(namespace="default", engine="vLLM", members=[m]), m


class Answers:
    """An API whose execs answer ``result`` at once."""

    def __init__(self, result: ExecResult) -> None:
        self.result = result

    def exec_pod(self, **_: Any) -> ExecResult:
        return self.result


def test_an_overrun_halves_the_slots_once_per_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr("activities.fairslots.time.monotonic", lambda: now[0])
    slots = FairSlots(16)
    slots.congested(hold_s=5)
    assert slots.limit == 8
    slots.congested(hold_s=5)  # an overrun of the reads begun before the cut
    assert slots.limit == 8
    now[0] += 5
    slots.congested(hold_s=5)
    assert slots.limit == 4
    for _ in range(5):
        now[0] += 5
        slots.congested(hold_s=5)
    assert slots.limit == 1  # never none


def test_quick_work_adds_one_back_up_to_the_size() -> None:
    slots = FairSlots(4)
    slots.congested(hold_s=5)
    assert slots.limit == 2
    for _ in range(5):
        slots.uncongested()
    assert slots.limit == 4


def test_the_limit_bounds_what_is_given_and_a_raise_gives_at_once() -> None:
    slots = FairSlots(4)
    slots.congested(hold_s=5)  # 2 at once
    assert slots.acquire(0, "a") and slots.acquire(0, "b")
    assert not slots.acquire(0.01, "a")
    ticket = slots.request("c")
    assert not ticket.wait(0.01)
    slots.uncongested()  # 3 at once: the waiter gets it now
    assert ticket.wait(1)
    assert slots.holding() == {"a": 1, "b": 1, "c": 1}


def test_a_lowered_limit_takes_no_slot_back() -> None:
    slots = FairSlots(4)
    assert all(slots.acquire(0, t) for t in "abcd")
    slots.congested(hold_s=5)  # 2 at once; 4 held
    slots.release("a")
    slots.release("b")
    assert not slots.acquire(0.01, "e")  # 2 still held: none given
    slots.release("c")
    assert slots.acquire(0, "e")


@pytest.mark.parametrize(
    ("took", "overran", "limit"),
    [(EXEC_TIMEOUT_S, True, 4), (QUICK_S / 2, False, 9), (QUICK_S * 2, False, 8)],
)
def test_pace_execs(took: float, overran: bool, limit: int) -> None:
    slots = FairSlots(16)
    slots.congested(hold_s=EXEC_TIMEOUT_S)  # 8
    slots._lowered_at = -float("inf")
    pace_execs(slots, took_s=took, overran=overran)
    assert slots.limit == limit


def test_a_read_that_overran_its_bound_paces_the_reads() -> None:
    """As ``kube.podexec`` reports an exec past its bound: the read is UNKNOWN with that
    reason, and the worker runs half as many reads at once."""
    target, m = member()
    slots = FairSlots(16)
    api = Answers(ExecResult(error=f"{OVERRAN} {EXEC_TIMEOUT_S:g} s"))
    stdout, error = exec_oneshot(api, target, m, slots=slots)  # type: ignore[arg-type]
    assert (stdout, error) == ("", f"exec exceeded {EXEC_TIMEOUT_S:g} s")
    assert slots.limit == 8
    slots._lowered_at = -float("inf")
    api.result = ExecResult(stdout=oneshot_stdout(), exit_code=0)
    stdout, error = exec_oneshot(api, target, m, slots=slots)  # type: ignore[arg-type]
    assert error == "" and stdout and slots.limit == 9


# ------------------------------------------------------------ the drain queues for a slot


def run_drain(kube: FakeKube, target: Target, slots: WorkerSlots, seconds: float) -> Observation:
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=0.01,
    )
    obs: Observation = attempt_env().run(RetirementActivities(kube, slots=slots).drain, inp)
    return obs


def test_a_drain_waits_for_its_exec_slot_without_holding_a_poll_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every exec slot taken for longer than ``EXEC_SLOT_WAIT_S``: the drain's read waits
    in the queue (it used to read UNKNOWN "no exec slot" and poll again, re-listing the
    namespace each time), gives its poll slot to others meanwhile, and reads once a slot
    frees."""
    monkeypatch.setattr(sampling_module, "EXEC_SLOT_WAIT_S", 0.05)
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    slots = WorkerSlots(execs=FairSlots(1), polls=FairSlots(1))
    assert slots.execs.acquire(0, "elsewhere")
    polls_while_waiting: list[dict[str, int]] = []

    def free_later() -> None:
        wait_for(lambda: len(slots.execs._waiting.get(NS, ())) == 1)
        time.sleep(0.3)
        polls_while_waiting.append(slots.polls.holding())
        slots.execs.release("elsewhere")

    helper = threading.Thread(target=free_later)
    helper.start()
    obs = run_drain(kube, target, slots, seconds=10)
    helper.join()
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert polls_while_waiting == [{}]  # the poll slot was lent while queued
    assert obs.polls == 2 and len(kube.called("exec_pod")) == 2  # two idle reads, no empty round


def test_a_drain_that_never_gets_a_slot_reads_unknown_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sampling_module, "EXEC_SLOT_WAIT_S", 0.05)
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    slots = WorkerSlots(execs=FairSlots(1), polls=FairSlots(4))
    assert slots.execs.acquire(0, "elsewhere")
    began = time.monotonic()
    obs = run_drain(kube, target, slots, seconds=1.5)
    assert time.monotonic() - began < 5
    assert obs.verdict is Verdict.UNKNOWN
    assert "no exec slot before the phase deadline" in str(obs.readings), obs.readings
    assert kube.called("exec_pod") == []
