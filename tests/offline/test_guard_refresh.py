"""The delete's guard on stale evidence (``activities.refresh``), under
``ActivityEnvironment`` against the fake Kubernetes layer: evidence older than the
freshness bound is taken again, by the drain's own rule, before anything is deleted; an
engine that does not read idle again, a read that fails, or the label put back refuses
(UNKNOWN: drain again; FAILED: abort) and touches nothing; fresh evidence costs no read."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from activities import RetirementActivities
from activities.fairslots import FairSlots
from activities.sampling import exec_oneshot
from kube.api import ExecResult
from retirement.budgets import Budgets
from retirement.models import DeleteResult, PhaseInput, Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict
from retirement.protocol import freshness_bound
from tests.helpers.activity_env import attempt_env
from tests.helpers.admission import admitted, sibling, victim
from tests.helpers.fake_kube import FakeKube, oneshot_stdout

EXACT = ["--enable-server-load-tracking"]
BOUND_S = freshness_bound(Budgets()).total_seconds()


def reads(*counts: int, in_flight: float = 0.0) -> Callable[[list[str]], ExecResult]:
    """One exec's reads as the one-shot prints them: one read (``exact``) or the exact
    count's double read (``exact2``), each with ``counts[i]`` requests in the front end."""

    def run(argv: list[str]) -> ExecResult:
        mode = argv[6]
        if mode not in ("exact", "exact2"):  # the gauges and counters only
            return ExecResult(stdout=oneshot_stdout(in_flight=in_flight, counters=(5, 7)))
        each = counts if len(counts) == len(mode) - 4 else counts[:1] * (len(mode) - 4)
        out = "".join(oneshot_stdout(in_flight=in_flight, counters=(5, 7), exact=c) for c in each)
        return ExecResult(stdout=out, exit_code=0)

    return run


def delete(
    kube: FakeKube, target: Target, *, evidence_age_s: float, read_again: bool = False
) -> DeleteResult:
    """The delete activity handed a drain whose last idle read is ``evidence_age_s`` old
    (``read_again``: the workflow found it stale on its own clock)."""
    now = datetime.now(UTC)
    inp = PhaseInput(
        target=target,
        deadline=now + timedelta(seconds=5),
        poll_interval_s=0.01,
        evidence_at=now - timedelta(seconds=evidence_age_s),
        fresh_s=BOUND_S,
        read_again=read_again,
    )
    result: DeleteResult = attempt_env().run(RetirementActivities(kube).delete, inp)
    return result


def methods(kube: FakeKube) -> list[str]:
    return [c.method for c in kube.calls]


def test_fresh_evidence_is_acted_on_without_another_read() -> None:
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(0))
    result = delete(kube, target, evidence_age_s=1)
    assert result.deleted == ["llm-1"] and result.refused is None
    assert kube.called("exec_pod") == []


def test_stale_evidence_is_read_again_and_an_idle_engine_is_deleted_after_that_read() -> None:
    """The drain's answer was decided on a minute late (a workflow task in a fleet's herd):
    the guard reads the engine again, idle twice in one exec, then deletes."""
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(0))
    result = delete(kube, target, evidence_age_s=60)
    assert result.deleted == ["llm-1"] and result.refused is None
    calls = methods(kube)
    assert calls.count("exec_pod") == 1
    assert [c.args["argv"][6] for c in kube.called("exec_pod")] == ["exact2"]
    assert calls.index("exec_pod") < calls.index("delete_pod")


def test_a_stale_proof_read_again_busy_deletes_nothing_and_asks_for_the_drain_again() -> None:
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(1))  # a request in the front end
    result = delete(kube, target, evidence_age_s=60)
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert "60 s old" in result.refused.reason and "read again" in result.refused.reason
    assert kube.called("delete_pod") == [] and kube.called("exec_pod")


def test_one_idle_read_again_is_never_the_proof() -> None:
    """Idle at the first read of the exec, a request at the second: not idle twice."""
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(0, 1))
    result = delete(kube, target, evidence_age_s=60)
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert kube.called("delete_pod") == []


def test_a_read_again_that_fails_deletes_nothing() -> None:
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", ExecResult(error="exec exceeded 5 s"))
    result = delete(kube, target, evidence_age_s=60)
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert kube.called("delete_pod") == []


def test_without_the_exact_count_the_read_again_takes_two_rounds() -> None:
    """The gauges' rule: two consecutive idle reads with unchanged counters, each an exec."""
    kube, target = admitted(victim(), sibling())
    kube.script_exec("llm-1", reads(0))
    result = delete(kube, target, evidence_age_s=60)
    assert result.deleted == ["llm-1"]
    assert len(kube.called("exec_pod")) == 2


def test_the_label_put_back_meanwhile_aborts_on_the_read_again() -> None:
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(0))
    kube.set_label("llm-1", LABEL_ELIGIBLE, "true")
    result = delete(kube, target, evidence_age_s=60)
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert "label" in result.refused.reason and kube.called("delete_pod") == []


def test_a_member_replaced_meanwhile_is_never_read_or_deleted() -> None:
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(0))
    kube.add_pod(victim(args=EXACT, uid="uid-new"))
    result = delete(kube, target, evidence_age_s=60)
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert kube.called("delete_pod") == [] and kube.called("exec_pod") == []


def test_evidence_the_workflow_found_stale_is_read_again_whatever_this_clock_says() -> None:
    """The workflow's clock found the evidence past the bound; this worker's clock (behind
    the drain worker's) finds it 1 s old: it is read again all the same, so both clocks
    must find it fresh, as when the workflow drained again instead."""
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(1))
    result = delete(kube, target, evidence_age_s=1, read_again=True)
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert "workflow found the drain's last idle read too old" in result.refused.reason
    assert kube.called("delete_pod") == []
    kube, target = admitted(victim(args=EXACT), sibling())
    kube.script_exec("llm-1", reads(0))
    result = delete(kube, target, evidence_age_s=1, read_again=True)
    assert result.deleted == ["llm-1"] and len(kube.called("exec_pod")) == 1


def test_a_read_heartbeats_between_its_exec_slot_wait_and_its_exec() -> None:
    """A read may wait its exec slot (3 s) and then run its exec (5 s): without a heartbeat
    between them a delete attempt's claim (heartbeat timeout 10 s less its margins) would
    be lost before its first delete (``activities.fencing``)."""
    kube, target = admitted(victim(args=EXACT), sibling())
    [m] = target.members
    began: list[float] = []
    released: list[float] = []
    beats: list[float] = []

    def run(argv: list[str]) -> ExecResult:
        began.append(time.monotonic())
        return reads(0)(argv)

    kube.script_exec("llm-1", run)
    slots = FairSlots(1)
    taken = threading.Event()

    def holder() -> None:
        with slots.slot(5.0, "someone-else") as got:
            assert got
            taken.set()
            time.sleep(0.3)
            released.append(time.monotonic())

    other = threading.Thread(target=holder)
    other.start()
    taken.wait(5)
    env = attempt_env()

    def beat(*_: Any) -> None:
        beats.append(time.monotonic())

    env.on_heartbeat = beat
    out, err = env.run(exec_oneshot, kube, target, m, twice=True, slots=slots)
    other.join()
    assert err == "" and out
    assert any(released[0] <= b <= began[0] for b in beats), (released, beats, began)
