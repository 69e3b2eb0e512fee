"""``delete`` and ``settle`` under ``ActivityEnvironment`` against the fake Kubernetes
layer: every delete carries the admitted UID as a precondition (a replacement is recorded
and never touched), the Workload goes only when it owns no other Pod, a retried delete is
idempotent; settling holds (UNKNOWN) until the admitted Pods are gone and the capacity is
released, and never waits on a replacement."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities import RetirementActivities
from kube.errors import Conflict, Forbidden, Invalid, KubeError, Unavailable
from retirement.budgets import Budgets
from retirement.models import (
    Admission,
    AdmitInput,
    DeleteResult,
    Observation,
    PhaseInput,
    RetirementRequest,
    Target,
)
from retirement.phases import Verdict
from retirement.protocol import freshness_bound
from tests.helpers import model_deployment
from tests.helpers.activity_env import attempt_env, recording_env
from tests.helpers.fake_kube import FakeKube, member_pod

NS = "default"
MD = "llm"


def member(index: int, **kw: Any) -> dict[str, Any]:
    kw.setdefault("uid", f"uid-{index}")
    kw.setdefault("ip", f"198.18.1.{20 + index}")
    return member_pod(f"llm-1-{index}", deployment=MD, ordinal=1, member=index, **kw)


def admitted(
    *, workload: str | None = None, kube: FakeKube | None = None
) -> tuple[FakeKube, Target]:
    """Replica 1 of ``llm`` (two members; with ``workload``, a Workload owned by both)
    admitted, beside replica 0 that must never be touched."""
    kube = kube or FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, size=2))
    kube.add_pod(member(0))
    kube.add_pod(member(1))
    kube.add_pod(
        member_pod("llm-0-0", deployment=MD, ordinal=0, member=0, uid="keep", ip="198.18.1.9")
    )
    if workload:
        kube.add_workload(workload, owners=[("Pod", "uid-0"), ("Pod", "uid-1")], uid="wl-uid")
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    # Disqualified, as the retirement leaves it before its delete.
    done = attempt_env().run(RetirementActivities(kube).disqualify, phase(admission.target))
    assert done.verdict is Verdict.VERIFIED, done.reason
    kube.calls.clear()
    return kube, admission.target


def phase(target: Target, seconds: float = 5.0, *, evidence_age_s: float = 0.0) -> PhaseInput:
    """A phase's input; for the delete, a drain whose last idle read is ``evidence_age_s``
    old, with the default freshness bound."""
    now = datetime.now(UTC)
    return PhaseInput(
        target=target,
        deadline=now + timedelta(seconds=seconds),
        poll_interval_s=0.01,
        evidence_at=now - timedelta(seconds=evidence_age_s),
        fresh_s=freshness_bound(Budgets()).total_seconds(),
    )


def delete(
    kube: FakeKube, target: Target, *, attempt: int = 1, evidence_age_s: float = 0.0
) -> DeleteResult:
    """Run the delete activity's ``attempt`` (above 1: a retry, after an earlier attempt
    may have deleted members)."""
    env = attempt_env(attempt=attempt)
    inp = phase(target, evidence_age_s=evidence_age_s)
    result: DeleteResult = env.run(RetirementActivities(kube).delete, inp)
    return result


def settle(
    kube: FakeKube,
    target: Target,
    *,
    seconds: float = 5.0,
    heartbeats: list[Any] | None = None,
    on_beat: Any = None,
) -> Observation:
    beats: list[Any] = [] if heartbeats is None else heartbeats
    env = recording_env(beats, on_beat=on_beat)
    obs: Observation = env.run(RetirementActivities(kube).settle, phase(target, seconds))
    return obs


def uid_of(kube: FakeKube, name: str) -> str | None:
    body = kube.pods.get((NS, name))
    return None if body is None else str(body["metadata"]["uid"])


# ---------------------------------------------------------------- delete


def test_delete_removes_each_admitted_pod_with_its_uid_as_precondition() -> None:
    kube, target = admitted()
    result = delete(kube, target)
    assert result == DeleteResult(deleted=["llm-1-0", "llm-1-1"], workload="none")
    assert [(c.args["name"], c.args["uid"]) for c in kube.called("delete_pod")] == [
        ("llm-1-0", "uid-0"),
        ("llm-1-1", "uid-1"),
    ]
    assert uid_of(kube, "llm-1-0") is None and uid_of(kube, "llm-1-1") is None
    assert uid_of(kube, "llm-0-0") == "keep"


def test_a_member_replaced_before_the_first_delete_refuses_it_touching_nothing() -> None:
    kube, target = admitted()
    kube.add_pod(member(1, uid="uid-new"))
    result = delete(kube, target)
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert "llm-1-1 was replaced" in result.refused.reason
    assert result.deleted == [] and kube.called("delete_pod") == []
    assert uid_of(kube, "llm-1-1") == "uid-new"


def test_a_replaced_member_is_recorded_and_never_touched_once_the_deletion_began() -> None:
    kube, target = admitted()
    kube.remove_pod("llm-1-0")  # an earlier attempt deleted it
    kube.add_pod(member(1, uid="uid-new"))
    result = delete(kube, target, attempt=2)
    assert result.refused is None
    assert result.already_gone == ["llm-1-0"] and result.replaced == ["llm-1-1"]
    assert uid_of(kube, "llm-1-1") == "uid-new"


def test_a_retried_delete_is_idempotent() -> None:
    kube, target = admitted(workload="wl")
    first = delete(kube, target)
    assert first == DeleteResult(deleted=["llm-1-0", "llm-1-1"], workload="deleted")
    again = delete(kube, target, attempt=2)
    assert again == DeleteResult(already_gone=["llm-1-0", "llm-1-1"], workload="gone")
    assert uid_of(kube, "llm-0-0") == "keep"


def test_the_workload_is_deleted_with_its_uid_when_it_owns_only_the_replica() -> None:
    kube, target = admitted(workload="wl")
    assert (target.workload_name, target.workload_uid) == ("wl", "wl-uid")
    assert delete(kube, target).workload == "deleted"
    [call] = kube.called("delete_workload")
    assert call.args == {"namespace": NS, "name": "wl", "uid": "wl-uid"}
    assert (NS, "wl") not in kube.workloads


def test_a_workload_that_owns_another_pod_is_kept() -> None:
    kube, target = admitted(workload="wl")
    kube.add_workload("wl", owners=[("Pod", "uid-0"), ("Pod", "keep")], uid="wl-uid")
    assert delete(kube, target).workload == "kept (owns other Pods)"
    assert (NS, "wl") in kube.workloads
    assert kube.called("delete_workload") == []


def test_a_replaced_workload_is_not_deleted() -> None:
    kube, target = admitted(workload="wl")
    kube.add_workload("wl", owners=[("Pod", "uid-0")], uid="wl-other")
    assert delete(kube, target).workload == "gone"
    assert kube.workloads[(NS, "wl")]["metadata"]["uid"] == "wl-other"
    assert kube.called("delete_workload") == []


def test_a_workload_replaced_between_read_and_delete_is_not_deleted() -> None:
    kube, target = admitted(workload="wl")
    kube.fail("delete_workload", Conflict("delete Workload", status=409))
    assert delete(kube, target).workload == "gone"
    assert (NS, "wl") in kube.workloads


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (Unavailable("delete Pod", status=503), True),
        (Unavailable("delete Pod", reason="ConnectionRefusedError"), True),
        # Past the point of no return RBAC without delete is retried (a person mends it).
        (Forbidden("delete Pod", status=403), True),
    ],
    ids=["503", "refused", "forbidden"],
)
def test_a_failed_delete_raises_and_a_retry_finishes_the_job(
    error: KubeError, retryable: bool
) -> None:
    kube, target = admitted()
    kube.fail("delete_pod", error)
    with pytest.raises(ApplicationError) as info:
        delete(kube, target)
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not retryable
    assert uid_of(kube, "llm-1-0") == "uid-0"  # the first delete failed
    assert uid_of(kube, "llm-1-1") is None  # the second was attempted all the same
    assert len(kube.called("delete_pod")) == 2
    result = delete(kube, target, attempt=2)
    assert result == DeleteResult(deleted=["llm-1-0"], already_gone=["llm-1-1"], workload="none")
    assert uid_of(kube, "llm-0-0") == "keep"


def test_a_refused_delete_does_not_stop_the_remaining_deletes() -> None:
    """After the point of no return a 422 on one member's delete (the server refuses the
    request as written) must not leave the other members serving: every delete is
    attempted, then the failure is reported, naming the member."""
    kube, target = admitted(workload="wl")
    kube.fail("delete_pod", Invalid("delete Pod default/llm-1-0", status=422, reason="Invalid"))
    with pytest.raises(ApplicationError) as info:
        delete(kube, target)
    assert [c.args["name"] for c in kube.called("delete_pod")] == ["llm-1-0", "llm-1-1"]
    assert uid_of(kube, "llm-1-1") is None and uid_of(kube, "llm-1-0") == "uid-0"
    assert info.value.type == "Invalid"
    message = info.value.message
    assert message.startswith("delete 1 of 2 admitted Pods: HTTP 422 Invalid")
    assert "llm-1-0: delete Pod default/llm-1-0: HTTP 422" in message
    assert "(deleted or gone: llm-1-1)" in message
    # The Workload is left for the retry: a member it owns is still there.
    assert kube.called("delete_workload") == [] and (NS, "wl") in kube.workloads
    result = delete(kube, target, attempt=2)
    assert result == DeleteResult(deleted=["llm-1-0"], already_gone=["llm-1-1"], workload="deleted")


@pytest.mark.parametrize("status", [400, 422])
def test_every_refused_delete_is_named(status: int) -> None:
    kube, target = admitted()
    kube.fail("delete_pod", Invalid("delete Pod", status=status), times=2)
    with pytest.raises(ApplicationError) as info:
        delete(kube, target)
    assert len(kube.called("delete_pod")) == 2
    assert info.value.type == "Invalid" and info.value.non_retryable
    assert "delete 2 of 2 admitted Pods" in str(info.value)
    assert "llm-1-0: " in str(info.value) and "llm-1-1: " in str(info.value)


def test_a_retryable_failure_among_the_deletes_asks_for_a_retry() -> None:
    kube, target = admitted()
    kube.fail("delete_pod", Invalid("delete Pod", status=422))
    kube.fail("delete_pod", Unavailable("delete Pod", status=503))
    with pytest.raises(ApplicationError) as info:
        delete(kube, target)
    assert info.value.type == "Unavailable" and not info.value.non_retryable
    assert "delete 2 of 2 admitted Pods" in str(info.value)


def test_a_replaced_member_is_named_when_another_delete_fails() -> None:
    kube, target = admitted()
    kube.add_pod(member(1, uid="uid-new"))  # a retry finds it replaced: the deletion began
    kube.fail("delete_pod", Forbidden("delete Pod", status=403))
    with pytest.raises(ApplicationError) as info:
        delete(kube, target, attempt=2)
    assert "(replaced, not touched: llm-1-1)" in str(info.value)
    assert uid_of(kube, "llm-1-1") == "uid-new"


class SecondDeleteFails(FakeKube):
    """The API server goes away after the first Pod delete."""

    def delete_pod(self, *, namespace: str, name: str, uid: str) -> None:
        if len(self.called("delete_pod")) == 1:
            self.fail("delete_pod", Unavailable("delete Pod", status=503))
        super().delete_pod(namespace=namespace, name=name, uid=uid)


def test_a_failure_midway_leaves_a_retry_to_delete_the_rest() -> None:
    kube, target = admitted(kube=SecondDeleteFails())
    with pytest.raises(ApplicationError) as info:
        delete(kube, target)
    assert info.value.type == "Unavailable" and not info.value.non_retryable
    assert uid_of(kube, "llm-1-0") is None and uid_of(kube, "llm-1-1") == "uid-1"
    result = delete(kube, target, attempt=2)
    assert result == DeleteResult(already_gone=["llm-1-0"], deleted=["llm-1-1"], workload="none")
    assert uid_of(kube, "llm-0-0") == "keep"


# ---------------------------------------------------------------- settle


def test_settle_verifies_once_the_pods_are_gone_and_the_capacity_released() -> None:
    kube, target = admitted(workload="wl")
    delete(kube, target)
    kube.calls.clear()
    beats: list[Any] = []
    obs = settle(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 1
    assert obs.reason == "Pods gone, capacity released"
    assert [b.verdict for b in beats] == [Verdict.VERIFIED]
    assert {c.method for c in kube.calls} <= {"read_pod", "get_workload"}  # reads only


def test_settle_holds_while_a_pod_terminates_then_verifies() -> None:
    kube, target = admitted()
    kube.remove_pod("llm-1-1")  # llm-1-0 is still there (terminating, say)
    beats: list[Any] = []

    def finished(n: int) -> None:
        if n == 3:
            kube.remove_pod("llm-1-0")

    obs = settle(kube, target, heartbeats=beats, on_beat=finished)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 4
    assert beats[0].verdict is Verdict.UNKNOWN
    assert beats[0].readings == {"llm-1-0": "still present"}
    assert beats[0].reason == "waiting for llm-1-0"
    assert kube.called("delete_pod") == []  # settling never deletes


def test_settle_holds_until_its_deadline() -> None:
    kube, target = admitted(workload="wl")
    obs = settle(kube, target, seconds=0.1)
    assert obs.verdict is Verdict.UNKNOWN and obs.polls >= 2
    assert obs.readings == {
        "llm-1-0": "still present",
        "llm-1-1": "still present",
        "workload": "still holds the capacity",
    }
    assert kube.called("delete_pod") == [] and kube.called("delete_workload") == []


def test_settle_does_not_wait_for_a_replacement() -> None:
    kube, target = admitted()
    delete(kube, target)
    kube.add_pod(member(0, uid="uid-new"))  # the operator created a new Pod of that name
    obs = settle(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert uid_of(kube, "llm-1-0") == "uid-new"


def test_settle_holds_on_a_workload_that_still_holds_the_capacity() -> None:
    kube, target = admitted(workload="wl")
    kube.remove_pod("llm-1-0")
    kube.remove_pod("llm-1-1")
    obs = settle(kube, target, seconds=0.03)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings == {"workload": "still holds the capacity"}


def test_settle_does_not_wait_for_a_workload_that_owns_other_pods() -> None:
    kube, target = admitted(workload="wl")
    kube.add_workload("wl", owners=[("Pod", "uid-0"), ("Pod", "keep")], uid="wl-uid")
    kube.remove_pod("llm-1-0")
    kube.remove_pod("llm-1-1")
    assert settle(kube, target).verdict is Verdict.VERIFIED


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (Unavailable("read Pod", status=503), "read failed: 503"),
        (Unavailable("read Pod", reason="TimeoutError"), "read failed: Unavailable"),
        (Forbidden("read Pod", status=403), "read failed: 403"),
    ],
    ids=["503", "timeout", "forbidden"],
)
def test_a_failed_pod_read_is_unknown_not_gone(error: KubeError, shown: str) -> None:
    kube, target = admitted()
    kube.remove_pod("llm-1-0")
    kube.remove_pod("llm-1-1")
    kube.fail("read_pod", error, times=2)
    beats: list[Any] = []
    obs = settle(kube, target, heartbeats=beats)
    assert [(b.verdict, b.reason) for b in beats[:2]] == [(Verdict.UNKNOWN, shown)] * 2
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 3


def test_a_failed_workload_read_leaves_settle_as_a_retryable_error() -> None:
    kube, target = admitted(workload="wl")
    kube.remove_pod("llm-1-0")
    kube.remove_pod("llm-1-1")
    kube.fail("get_workload", Unavailable("read Workload", status=503))
    with pytest.raises(ApplicationError) as info:
        settle(kube, target)
    assert info.value.type == "Unavailable" and not info.value.non_retryable
    assert kube.called("delete_workload") == []
