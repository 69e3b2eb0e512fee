"""The exec reads at once follow what the node answers in time (``FairSlots.congested``,
``activities.sampling.pace_execs``): an exec past its bound halves them, once per bound;
a quick one adds one back; slots in use are never taken back, and a waiter gets a slot as
soon as the bound allows it."""

from __future__ import annotations

from typing import Any

import pytest

from activities.fairslots import FairSlots
from activities.oneshot import EXEC_TIMEOUT_S
from activities.sampling import QUICK_S, exec_oneshot, pace_execs
from kube.api import ExecResult
from kube.podexec import OVERRAN
from retirement.models import MemberTarget, Target
from tests.helpers.fake_kube import oneshot_stdout


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
