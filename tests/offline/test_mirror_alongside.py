"""The mirror's snapshots a phase activity carries (``activities.alongside``), against the
fake Kubernetes layer: published in order while the phase runs, counted in the phase's
result; a slow status write is left to the workflow's publish activity after
``END_WAIT_S`` and its thread stops before its next request; a phase that ends in an
error stops them at once; an error of the status subresource stops the rest."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import RetirementActivities
from activities import alongside as alongside_module
from activities.alongside import alongside
from activities.fencing import Claim
from activities.publish import publish
from kube.api import ExecResult
from kube.errors import Invalid
from retirement.models import PhaseInput, PublishInput, Target
from retirement.phases import Outcome, Phase, Verdict
from retirement.reports import Observation
from tests.helpers.activity_env import attempt_env
from tests.helpers.admission import admitted
from tests.helpers.fake_kube import FakeKube, oneshot_stdout

NS = "default"
MD = "llm"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)
IDLE = ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0)


class GatedKube(FakeKube):
    """A status subresource that waits at the write of the phases in ``slow`` until
    ``gate`` is set (a slow API server)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow: set[str] = set()
        self.gate = threading.Event()
        self.waiting = threading.Event()

    def patch_deployment_status(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        state = ((patch.get("status") or {}).get("retirement") or {}).get("state")
        if state in self.slow:
            self.waiting.set()
            assert self.gate.wait(10)
        return super().patch_deployment_status(namespace=namespace, name=name, patch=patch)


def snapshots(target: Target, *phases: Phase) -> list[PublishInput]:
    return [
        PublishInput(
            namespace=NS,
            deployment=MD,
            workflow_id="wf",
            phase=phase,
            outcome=Outcome.RUNNING,
            role="server",
            ordinal=1,
            target=target,
            started_at=T0,
            deadline=T0 + timedelta(seconds=300),
            phase_started_at=T0 + timedelta(seconds=i),
        )
        for i, phase in enumerate(phases)
    ]


def written(kube: FakeKube) -> list[str]:
    """The states the status writes carried, in order."""
    return [
        c.args["patch"]["status"]["retirement"]["state"]
        for c in kube.called("patch_deployment_status")
    ]


def event_reasons(kube: FakeKube) -> list[str]:
    return [c.args["event"]["reason"] for c in kube.called("create_event")]


@pytest.fixture
def cluster() -> tuple[GatedKube, Target]:
    kube, target = admitted(kube=GatedKube())
    kube.calls.clear()
    assert isinstance(kube, GatedKube)
    return kube, target


def test_carried_snapshots_go_out_in_order_and_are_counted(
    cluster: tuple[GatedKube, Target],
) -> None:
    kube, target = cluster
    carried = snapshots(target, Phase.ADMITTED, Phase.DISQUALIFIED, Phase.WITHDRAWING)
    with alongside(kube, carried) as mirror:
        obs = mirror.reported(Observation(verdict=Verdict.VERIFIED))
    assert obs.mirrored == 3 and obs.verdict is Verdict.VERIFIED
    assert written(kube) == ["Admitted", "Disqualified", "Withdrawing"]
    assert event_reasons(kube) == [
        "RetirementAdmitted",
        "RetirementDisqualified",
        "RetirementWithdrawing",
    ]
    # Each write fenced by the resourceVersion of the read that checked the UID.
    assert all(c.args["patch"]["metadata"] for c in kube.called("patch_deployment_status"))


def test_nothing_carried_starts_nothing(cluster: tuple[GatedKube, Target]) -> None:
    kube, _ = cluster
    with alongside(kube, []) as mirror:
        obs = mirror.reported(Observation(verdict=Verdict.UNKNOWN))
    assert obs.mirrored == 0 and kube.calls == []


def test_a_slow_write_is_left_to_the_workflow_and_its_thread_stops(
    cluster: tuple[GatedKube, Target], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The phase waits ``END_WAIT_S`` at its end, reports the snapshots published before
    the slow one, and the thread, once the write answers, sends nothing more: no Event of
    the slow snapshot, no write of the next (the workflow's publish activity sends both)."""
    monkeypatch.setattr(alongside_module, "END_WAIT_S", 0.2)
    kube, target = cluster
    kube.slow = {"Withdrawing"}
    carried = snapshots(target, Phase.DISQUALIFIED, Phase.WITHDRAWING, Phase.DRAINING)
    began = time.monotonic()
    with alongside(kube, carried) as mirror:
        assert kube.waiting.wait(5)
        obs = mirror.reported(Observation(verdict=Verdict.VERIFIED))
    assert time.monotonic() - began < 3
    assert obs.mirrored == 1
    kube.gate.set()
    time.sleep(0.3)
    assert written(kube) == ["Disqualified", "Withdrawing"]
    assert event_reasons(kube) == ["RetirementDisqualified"]


def test_a_phase_ending_in_an_error_stops_them_at_once(
    cluster: tuple[GatedKube, Target],
) -> None:
    kube, target = cluster
    kube.slow = {"Disqualified"}
    carried = snapshots(target, Phase.DISQUALIFIED, Phase.WITHDRAWING)
    began = time.monotonic()
    with pytest.raises(RuntimeError), alongside(kube, carried):
        assert kube.waiting.wait(5)
        raise RuntimeError("the phase failed")
    assert time.monotonic() - began < alongside_module.END_WAIT_S
    kube.gate.set()
    time.sleep(0.3)
    assert written(kube) == ["Disqualified"] and event_reasons(kube) == []


def test_a_refused_write_stops_the_rest(cluster: tuple[GatedKube, Target]) -> None:
    kube, target = cluster
    kube.fail("patch_deployment_status", Invalid("status rejected", status=422, reason="Invalid"))
    carried = snapshots(target, Phase.DISQUALIFIED, Phase.WITHDRAWING)
    with alongside(kube, carried) as mirror:
        obs = mirror.reported(Observation(verdict=Verdict.VERIFIED))
    assert obs.mirrored == 0
    assert len(kube.called("patch_deployment_status")) == 1 and event_reasons(kube) == []


def test_publish_asks_before_each_request(cluster: tuple[GatedKube, Target]) -> None:
    kube, target = cluster
    [snap] = snapshots(target, Phase.DRAINING)
    for allowed in range(3):
        asked = 0

        def go_on(allowed: int = allowed) -> bool:
            nonlocal asked
            asked += 1
            return asked <= allowed

        kube.calls.clear()
        assert publish(kube, snap, go_on=go_on) is False
        made = [c.method for c in kube.calls]
        assert made == ["get_deployment", "patch_deployment_status"][:allowed]
    kube.calls.clear()
    assert publish(kube, snap) is True
    assert [c.method for c in kube.calls] == [
        "get_deployment",
        "patch_deployment_status",
        "create_event",
    ]


def test_the_drain_activity_carries_and_counts_its_snapshots(
    cluster: tuple[GatedKube, Target],
) -> None:
    """Through the registered activity: the drain's verdict as before, and its result
    says the Draining snapshot went out."""
    kube, target = cluster
    kube.script_exec("llm-1", IDLE)
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=5),
        poll_interval_s=0.01,
        mirror=snapshots(target, Phase.DRAINING),
    )
    obs: Observation = attempt_env().run(RetirementActivities(kube).drain, inp)
    assert obs.verdict is Verdict.VERIFIED and obs.mirrored == 1
    assert written(kube) == ["Draining"] and event_reasons(kube) == ["RetirementDraining"]


def test_an_attempt_gone_quiet_stops_its_snapshots(cluster: tuple[GatedKube, Target]) -> None:
    """The phase's own thread is stuck past its heartbeat timeout (the server may have
    timed the attempt out and the workflow moved on): the carried snapshots stop before
    their next request, as the attempt's own changes do (``activities.fencing``)."""
    kube, target = cluster
    now = [0.0]
    claim = Claim(heartbeat_timeout_s=10, clock=lambda: now[0])
    kube.slow = {"Disqualified"}
    carried = snapshots(target, Phase.DISQUALIFIED, Phase.WITHDRAWING)
    with alongside(kube, carried, claim=claim) as mirror:
        assert kube.waiting.wait(5)
        now[0] += 30  # no heartbeat for 30 s
        kube.gate.set()
        time.sleep(0.3)
        assert written(kube) == ["Disqualified"] and event_reasons(kube) == []
        assert claim.lost
        assert mirror.stop(wait_s=1) == 0
