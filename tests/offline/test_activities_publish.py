"""``publish`` under ``ActivityEnvironment`` against the fake Kubernetes layer: it writes
``status.retirement`` through the status subresource (a merge patch: other status fields
stay), marks the phase with one Event (a retried publish posts no second one), clears the
status when asked, does nothing on a deployment that is gone, and lets a Kubernetes error
out as its ``ApplicationError``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities import RetirementActivities
from activities.publish import WRITE_TRIES
from kube.errors import Conflict, Forbidden, KubeError, NotFound, Unavailable
from retirement.models import IntentKind, MemberTarget, PublishInput, Target
from retirement.names import GROUP, KIND, VERSION
from retirement.phases import Outcome, Phase
from tests.helpers import model_deployment
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube

NS = "default"
MD = "llm"
WF = f"retirement/{NS}/{MD}"
T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def target(deployment_uid: str = "md-uid") -> Target:
    return Target(
        namespace=NS,
        deployment=MD,
        role="server",
        ordinal=1,
        intent=IntentKind.COUNT_TRIM,
        engine="vLLM",
        engine_version="0.29.0",
        shape="Single",
        members=[
            MemberTarget(pod="llm-1", uid="uid-1", container_id="c://1", ip="198.18.1.11"),
        ],
        workload_name="wl",
        workload_uid="wl-uid",
        observed_generation=3,
        deployment_uid=deployment_uid,
    )


def snapshot(
    phase: Phase = Phase.DRAINING,
    outcome: Outcome = Outcome.RUNNING,
    *,
    reason: str = "",
    clear: bool = False,
    with_target: bool = True,
    deployment_uid: str = "md-uid",
    at: datetime = T0 + timedelta(seconds=20),
) -> PublishInput:
    return PublishInput(
        namespace=NS,
        deployment=MD,
        workflow_id=WF,
        phase=phase,
        outcome=outcome,
        reason=reason,
        role="server",
        ordinal=1,
        target=target(deployment_uid) if with_target else None,
        started_at=T0,
        deadline=T0 + timedelta(seconds=300),
        phase_started_at=at,
        last_consumed_retry_token="tok-1",
        clear=clear,
    )


def cluster(uid: str = "md-uid") -> FakeKube:
    kube = FakeKube()
    md = model_deployment(MD, namespace=NS, uid=uid)
    md["status"] = {"observedGeneration": 3, "replicas": 2}
    kube.add_deployment(md)
    kube.calls.clear()
    return kube


def publish(kube: FakeKube, inp: PublishInput) -> None:
    result: None = attempt_env().run(RetirementActivities(kube).publish, inp)
    assert result is None


def status(kube: FakeKube) -> dict[str, Any]:
    body = kube.deployments[(NS, MD)]
    return dict(body.get("status") or {})


def events(kube: FakeKube) -> list[dict[str, Any]]:
    return [e for (ns, _), e in sorted(kube.events.items()) if ns == NS]


# ---------------------------------------------------------------- status.retirement


def test_publish_writes_status_retirement_and_keeps_the_other_status_fields() -> None:
    kube = cluster()
    publish(kube, snapshot(reason="reading the engines"))
    st = status(kube)
    assert st["observedGeneration"] == 3 and st["replicas"] == 2  # a merge, not a replace
    assert st["retirement"] == {
        "roleName": "server",
        "replicaOrdinal": 1,
        "observedGeneration": 3,
        "targetMemberUIDs": ["uid-1"],
        "targetWorkloadUID": "wl-uid",
        "state": "Draining",
        "reason": "reading the engines",
        "startedAt": "2026-03-01T12:00:00Z",
        "deadline": "2026-03-01T12:05:00Z",
        "phaseStartedAt": "2026-03-01T12:00:20Z",
        "lastConsumedRetryToken": "tok-1",
        "workflowID": WF,
    }
    [call] = kube.called("patch_deployment_status")
    # The write is fenced by the resourceVersion of the read whose UID was checked.
    assert len(kube.called("get_deployment")) == 1
    assert call.args["patch"]["metadata"] == {"resourceVersion": "1"}
    assert kube.called("patch_deployment") == []  # never the main resource


def test_publish_before_admission_writes_an_empty_binding() -> None:
    kube = cluster()
    publish(kube, snapshot(Phase.ADMITTED, with_target=False))
    st = status(kube)["retirement"]
    assert st["targetMemberUIDs"] == [] and st["targetWorkloadUID"] == ""
    assert st["observedGeneration"] == 0 and st["state"] == "Admitted"


def test_a_long_reason_is_capped() -> None:
    kube = cluster()
    publish(kube, snapshot(Phase.ABORTED, Outcome.ABORTED, reason="x" * 5000))
    assert len(status(kube)["retirement"]["reason"]) == 1024
    [event] = events(kube)
    assert len(event["message"]) <= 1000


def test_clear_removes_status_retirement_only() -> None:
    kube = cluster()
    publish(kube, snapshot())
    publish(kube, snapshot(Phase.COMPLETED, Outcome.COMPLETED, clear=True))
    st = status(kube)
    assert "retirement" not in st
    assert st["replicas"] == 2


# ---------------------------------------------------------------- Events


@pytest.mark.parametrize(
    ("phase", "outcome", "reason", "kind"),
    [
        (Phase.WITHDRAWING, Outcome.RUNNING, "RetirementWithdrawing", "Normal"),
        (Phase.COMPLETED, Outcome.COMPLETED, "RetirementCompleted", "Normal"),
        (Phase.COMPLETED, Outcome.COMPLETED_UNSETTLED, "RetirementCompletedUnsettled", "Warning"),
        (Phase.ABORTED, Outcome.ABORTED, "RetirementAborted", "Warning"),
        (Phase.ABORTED, Outcome.RUNNING, "RetirementAborted", "Warning"),
        (Phase.ADMITTED, Outcome.REFUSED, "RetirementRefused", "Warning"),
    ],
)
def test_each_phase_change_is_marked_by_an_event(
    phase: Phase, outcome: Outcome, reason: str, kind: str
) -> None:
    kube = cluster()
    publish(kube, snapshot(phase, outcome, reason="why"))
    [event] = events(kube)
    assert event["reason"] == reason
    assert event["type"] == kind
    assert event["message"] == f"role server ordinal 1: {phase} (why)"
    assert event["involvedObject"] == {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": MD,
        "namespace": NS,
        "uid": "md-uid",
    }


def test_a_retried_publish_posts_no_second_event() -> None:
    kube = cluster()
    publish(kube, snapshot())
    publish(kube, snapshot())
    assert len(events(kube)) == 1
    assert len(kube.called("create_event")) == 2  # the second got a Conflict, swallowed


def test_a_new_phase_or_a_new_phase_start_is_a_new_event() -> None:
    kube = cluster()
    publish(kube, snapshot(Phase.WITHDRAWING))
    publish(kube, snapshot(Phase.DRAINING))
    publish(kube, snapshot(Phase.DRAINING, at=T0 + timedelta(seconds=99)))  # a fresh attempt
    assert [e["reason"] for e in events(kube)].count("RetirementDraining") == 2
    assert len(events(kube)) == 3


# ---------------------------------------------------------------- the deployment is gone


def test_publish_on_a_deleted_deployment_does_nothing() -> None:
    kube = FakeKube()
    publish(kube, snapshot())
    assert kube.deployments == {} and kube.events == {}
    assert kube.called("create_event") == []


def test_publish_does_not_mirror_onto_a_recreated_deployment() -> None:
    """The status subresource writes whatever UID a patch names (the fake as the API server,
    twin-tested): the UID is read and checked, never sent as a precondition."""
    kube = cluster(uid="md-new")
    publish(kube, snapshot(deployment_uid="md-old"))
    assert "retirement" not in status(kube)
    assert kube.called("patch_deployment_status") == []


def test_a_deployment_recreated_between_the_read_and_the_write_gets_no_status() -> None:
    kube = cluster(uid="md-uid")
    read = kube.get_deployment

    def read_then_recreate(*, namespace: str, name: str) -> dict[str, Any]:
        raw = read(namespace=namespace, name=name)
        kube.add_deployment(model_deployment(MD, namespace=NS, uid="md-new"))  # meanwhile
        return raw

    kube.get_deployment = read_then_recreate  # type: ignore[method-assign]
    publish(kube, snapshot(deployment_uid="md-uid"))
    # The write on the first read's version was refused (409); the second read saw the
    # new UID: nothing written, no Event.
    assert len(kube.called("patch_deployment_status")) == 1
    assert "retirement" not in status(kube)
    assert kube.called("create_event") == []


def test_a_status_written_in_between_every_time_fails_the_publish() -> None:
    kube = cluster(uid="md-uid")
    kube.fail("patch_deployment_status", Conflict("x", status=409), times=WRITE_TRIES)
    with pytest.raises(ApplicationError, match="written in between"):
        publish(kube, snapshot())
    assert kube.called("create_event") == []


# ---------------------------------------------------------------- Kubernetes errors


@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (Unavailable("patch ModelDeployment status", status=503), True),
        (Unavailable("patch ModelDeployment status", reason="TimeoutError"), True),
        (Forbidden("patch ModelDeployment status", status=403), False),
    ],
    ids=["503", "timeout", "forbidden"],
)
def test_a_failed_status_write_raises_and_posts_no_event(error: KubeError, retryable: bool) -> None:
    kube = cluster()
    kube.fail("patch_deployment_status", error)
    with pytest.raises(ApplicationError) as info:
        publish(kube, snapshot())
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not retryable
    assert "retirement" not in status(kube)
    assert kube.called("create_event") == []


@pytest.mark.parametrize(
    "error",
    [Forbidden("create Event", status=403), Unavailable("create Event", status=500)],
    ids=["forbidden", "unavailable"],
)
def test_a_failed_event_post_raises_after_the_status_is_written(error: KubeError) -> None:
    kube = cluster()
    kube.fail("create_event", error)
    with pytest.raises(ApplicationError) as info:
        publish(kube, snapshot())
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not error.retryable
    assert status(kube)["retirement"]["state"] == "Draining"
    # The retry writes the same status again and posts the Event once.
    publish(kube, snapshot())
    assert len(events(kube)) == 1


def test_a_not_found_event_post_is_not_taken_for_a_gone_deployment() -> None:
    kube = cluster()
    kube.fail("create_event", NotFound("create Event", status=404))
    with pytest.raises(ApplicationError) as info:
        publish(kube, snapshot())
    assert info.value.type == "NotFound" and info.value.non_retryable


def test_the_consumed_token_is_kept_per_role_ordinal_across_retirements() -> None:
    """``status.retryTokens`` outlives ``status.retirement``: cleared at the end of one
    retirement, the token still makes a re-applied annotation a replay for the next."""
    kube = cluster()
    publish(kube, snapshot())
    publish(kube, snapshot(clear=True))
    st = status(kube)
    assert st["retryTokens"] == {"server:1": "tok-1"}
    assert st.get("retirement") is None
