"""A terminated retirement (``watcher.terminated.TerminatedRuns``): terminating a
retirement workflow skips its restore and its last mirror write, so ``status.retirement``
kept saying e.g. ``Draining`` for ever and nothing said which members were left out of
service.  The watcher reads the terminated run once: it clears ``status.retirement`` only
while it names that run (the workflow ID, the deployment the run admitted, no newer run;
the status subresource's merge patch bound to the version read and the admitted UID), and
posts one ``RetirementTerminated`` Warning Event naming the admitted members left without
the eligibility label: single members get it back from the watcher's label repair, group
members need a person (the identity probe).  Counted in
``retire_watcher_retirements_terminated_total{left_unlabelled}``.

Over the fake Kubernetes layer and the fake Temporal of ``tests/helpers/watcher_world.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCStatusCode

from kube.errors import Conflict, Forbidden
from retirement.models import MemberTarget, RetirementRequest, Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Phase
from tests.helpers.fake_kube import member_pod
from tests.helpers.fake_temporal import TemporalCall, rpc_error
from tests.helpers.watcher_world import (
    MD,
    MD_UID,
    NS,
    WID,
    World,
    add_md,
    add_replicas,
    make_world,
    request,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

EXTERNAL_LB = ["--data-parallel-external-lb"]


@pytest.fixture
def w() -> World:
    return make_world()


def target(
    req: RetirementRequest,
    pods: dict[str, str],
    *,
    size: int = 1,
    deployment_uid: str = MD_UID,
) -> Target:
    """What admission bound for ``req``: every member measured and labelled at admission
    (its restore would have put each back), the deployment's UID recorded."""
    return Target(
        namespace=req.namespace,
        deployment=req.deployment,
        role=req.role,
        ordinal=req.ordinal,
        intent=req.intent,
        engine="vLLM",
        shape="Single" if size == 1 else "ExternalDP",
        members=[
            MemberTarget(
                pod=name,
                uid=uid,
                container_id="containerd://main-1",
                ip="198.18.1.9",
                member_index=None if size == 1 else i,
                measured=True,
                eligible_at_admission=True,
            )
            for i, (name, uid) in enumerate(pods.items())
        ],
        deployment_uid=deployment_uid,
        size=size,
    )


def mirror(
    t: Target | None, *, state: str = "Draining", started: str = "2026-01-01T00:00:00Z"
) -> dict[str, Any]:
    """``status.retirement`` as the run's last publish wrote it."""
    return {
        "roleName": "server",
        "replicaOrdinal": 1,
        "observedGeneration": 1,
        "targetMemberUIDs": t.uids if t is not None else [],
        "targetWorkloadUID": "",
        "state": state,
        "reason": "",
        "startedAt": started,
        "deadline": started,
        "phaseStartedAt": started,
        "lastConsumedRetryToken": "",
        "workflowID": WID,
    }


def status_of(w: World) -> dict[str, Any]:
    return dict(w.kube.deployments[(NS, MD)].get("status") or {})


def scale(w: World, replicas: int) -> None:
    w.kube.patch_deployment(
        namespace=NS,
        name=MD,
        patch={"spec": {"roles": [{"name": "server", "replicas": replicas}]}},
    )


async def terminated_mid_drain(w: World, t: Target | None, *, scale_back: bool = True) -> None:
    """The retirement of ordinal 1 runs (the watcher reads it), is terminated mid-drain,
    and the spec declares ordinal 1 again (no intent left: nothing starts behind it)."""
    w.temporal.running(request(1), phase=Phase.DRAINING, target=t)
    await w.pass_()
    assert w.rec.running.may_run((NS, MD))
    w.temporal.close(WID, WorkflowExecutionStatus.TERMINATED)
    if scale_back:
        scale(w, 2)


def single_member_world(w: World, **status: Any) -> Target:
    """Ordinal 1 of a 1-replica deployment, disqualified by its retirement."""
    t = target(request(1), {f"{MD}-server-1": f"uid-{MD}-server-1"})
    add_md(w, replicas=1, status={"retirement": mirror(t), "retryTokens": {"server:1": "t0"}})
    add_replicas(w, [0])
    add_replicas(w, [1], eligible=False)
    return t


def terminated_events(w: World) -> list[dict[str, Any]]:
    return w.events("RetirementTerminated")


def count(w: World, left: str) -> float:
    return w.metric("retire_watcher_retirements_terminated_total", left_unlabelled=left)


# ---------------------------------------------------------------- status.retirement


async def test_a_terminated_run_s_status_is_cleared_bound_to_the_version_and_uid(
    w: World,
) -> None:
    t = single_member_world(w)
    await terminated_mid_drain(w, t)
    rv = w.kube.deployments[(NS, MD)]["metadata"]["resourceVersion"]
    await w.pass_()
    status = status_of(w)
    assert "retirement" not in status, status
    assert status["retryTokens"] == {"server:1": "t0"}  # other status fields kept
    (patch,) = w.kube.called("patch_deployment_status")
    assert patch.args["patch"] == {
        "metadata": {"resourceVersion": rv, "uid": MD_UID},
        "status": {"retirement": None},
    }
    # Read once: the next passes neither patch nor post again.
    await w.pass_(times=2)
    assert len(w.kube.called("patch_deployment_status")) == 1
    assert len(terminated_events(w)) == 1


async def test_a_newer_run_s_status_is_not_cleared(w: World) -> None:
    """A newer run of the workflow ID started (and published) after the terminated one
    ended and before the watcher read the status: it names the same workflow ID, but it
    is the newer run's, and stays."""
    t = single_member_world(w)
    await terminated_mid_drain(w, t, scale_back=False)
    newer = mirror(t, state="Admitted", started="2026-01-01T00:05:00Z")

    def someone_starts_a_newer_run(call: TemporalCall) -> None:
        if not w.temporal.called("start_workflow") and len(w.temporal.runs[WID]) == 1:
            w.temporal.running(request(1))
            w.kube.patch_deployment_status(
                namespace=NS, name=MD, patch={"status": {"retirement": newer}}
            )

    w.temporal.on("query", someone_starts_a_newer_run)  # the terminated run's state read
    await w.pass_()
    assert status_of(w)["retirement"] == newer
    assert [c.args["patch"] for c in w.kube.called("patch_deployment_status")] == [
        {"status": {"retirement": newer}}  # the newer run's own write, nothing else
    ]
    (event,) = terminated_events(w)
    assert "status.retirement cleared" not in event["message"]


async def test_a_status_another_writer_changes_meanwhile_is_read_again_before_clearing(
    w: World,
) -> None:
    t = single_member_world(w)
    await terminated_mid_drain(w, t)
    describes = 0

    def other_writer(_: TemporalCall) -> None:
        nonlocal describes
        describes += 1
        if describes == 2:  # after the status was read, before it is patched
            w.kube.patch_deployment_status(
                namespace=NS, name=MD, patch={"status": {"observedGeneration": 7}}
            )

    w.temporal.on("describe", other_writer)
    await w.pass_()
    calls = w.kube.called("patch_deployment_status")
    assert len(calls) == 3  # the other writer's, the Conflict, the clear read again
    assert "retirement" not in status_of(w)
    assert status_of(w)["observedGeneration"] == 7


async def test_a_re_created_deployment_s_status_is_not_touched(w: World) -> None:
    """The run admitted a ModelDeployment that has since been re-created under the same
    name: the status there is not the terminated run's."""
    t = single_member_world(w)
    t = t.model_copy(update={"deployment_uid": "the-old-uid"})
    await terminated_mid_drain(w, t)
    await w.pass_()
    assert status_of(w)["retirement"]["workflowID"] == WID
    assert w.kube.called("patch_deployment_status") == []


async def test_a_status_naming_no_retirement_or_another_is_not_touched(w: World) -> None:
    t = single_member_world(w)
    other = mirror(t) | {"workflowID": "retirement/default/someone-else"}
    w.kube.patch_deployment_status(namespace=NS, name=MD, patch={"status": {"retirement": other}})
    await terminated_mid_drain(w, t)
    await w.pass_()
    assert status_of(w)["retirement"] == other
    assert w.kube.called("patch_deployment_status")[1:] == []


async def test_a_status_that_cannot_be_cleared_is_read_again_on_the_next_reconcile(
    w: World,
) -> None:
    t = single_member_world(w)
    await terminated_mid_drain(w, t)
    conflict = Conflict("patch status", status=409, reason="Conflict")
    w.kube.fail("patch_deployment_status", conflict, times=3)
    await w.pass_()
    assert status_of(w)["retirement"]["state"] == "Draining"
    assert terminated_events(w) == []
    assert count(w, "single") == 0
    await w.pass_()
    assert "retirement" not in status_of(w)
    assert len(terminated_events(w)) == 1 and count(w, "single") == 1


async def test_a_status_the_watcher_may_not_write_is_said_not_retried_for_ever(
    w: World,
) -> None:
    """RBAC does not let the watcher patch ``modeldeployments/status`` (the deploy/ roles
    grant it no status write): the Event says the status could not be cleared, the label
    is still repaired, and the deployment's reconcile neither fails nor retries it."""
    t = single_member_world(w)
    await terminated_mid_drain(w, t)
    forbidden = Forbidden("patch status of ModelDeployment", status=403, reason="Forbidden")
    w.kube.fail("patch_deployment_status", forbidden, times=5)
    await w.pass_(times=2)
    assert status_of(w)["retirement"]["state"] == "Draining"
    (event,) = terminated_events(w)
    assert "status.retirement could not be cleared: the watcher may not patch" in event["message"]
    assert w.eligible(f"{MD}-server-1") == "true"
    assert w.events("ReconcileFailed") == []
    assert len(w.kube.called("patch_deployment_status")) == 1
    assert count(w, "single") == 1


async def test_without_the_run_s_state_the_status_says_which_members(w: World) -> None:
    """No worker answers the query of the terminated run's state (it replays history):
    the members are read from ``status.retirement``, the clear is bound to the version."""
    t = single_member_world(w)
    await terminated_mid_drain(w, t)
    w.temporal.fail("query", rpc_error(RPCStatusCode.DEADLINE_EXCEEDED))
    rv = w.kube.deployments[(NS, MD)]["metadata"]["resourceVersion"]
    await w.pass_()
    (patch,) = w.kube.called("patch_deployment_status")
    assert patch.args["patch"]["metadata"] == {"resourceVersion": rv}
    (event,) = terminated_events(w)
    assert f"{MD}-server-1" in event["message"]
    assert "members read from status.retirement" in event["message"]
    assert w.eligible(f"{MD}-server-1") == "true"


# ---------------------------------------------------------------- the Event and the metric


async def test_a_single_member_left_unlabelled_is_named_and_relabelled(w: World) -> None:
    t = single_member_world(w)
    await terminated_mid_drain(w, t)
    assert count(w, "single") == 0
    await w.pass_()
    (event,) = terminated_events(w)
    assert event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == MD_UID
    message = event["message"]
    assert message.startswith(f"{WID} (run run-1, replica server:1) was terminated: ")
    assert "its restore was skipped; status.retirement cleared" in message
    assert f"without {LABEL_ELIGIBLE}: {MD}-server-1: the watcher puts the label back" in message
    assert "group" not in message
    assert w.eligible(f"{MD}-server-1") == "true"  # the watcher's own repair, same pass
    assert (count(w, "single"), count(w, "group"), count(w, "none")) == (1, 0, 0)
    assert w.starts() == []  # no intent left


async def test_group_members_left_unlabelled_need_a_person(w: World) -> None:
    add_md(w, replicas=1, size=2, extra_args=EXTERNAL_LB)
    for i in range(2):
        w.kube.add_pod(member_pod(f"{MD}-0-{i}", deployment=MD, ordinal=0, member=i, uid=f"k{i}"))
        w.kube.add_pod(
            member_pod(
                f"{MD}-1-{i}", deployment=MD, ordinal=1, member=i, uid=f"u{i}", eligible=False
            )
        )
    t = target(request(1), {f"{MD}-1-0": "u0", f"{MD}-1-1": "u1"}, size=2)
    w.kube.patch_deployment_status(
        namespace=NS, name=MD, patch={"status": {"retirement": mirror(t)}}
    )
    w.temporal.running(request(1), phase=Phase.WITHDRAWING, target=t)
    await w.pass_()
    w.temporal.close(WID, WorkflowExecutionStatus.TERMINATED)
    w.kube.patch_deployment(
        namespace=NS,
        name=MD,
        patch={
            "spec": {
                "roles": [{"name": "server", "replicas": 2, "size": 2, "extraArgs": EXTERNAL_LB}]
            }
        },
    )
    await w.pass_(times=2)
    (event,) = terminated_events(w)
    message = event["message"]
    assert f"group members without {LABEL_ELIGIBLE}: {MD}-1-0, {MD}-1-1" in message
    assert "the watcher cannot put it back (a group member needs the identity probe)" in message
    assert f"kubectl label pod <name> -n {NS} {LABEL_ELIGIBLE}=true" in message
    assert "docs/runbook.md" in message
    assert [w.eligible(f"{MD}-1-{i}") for i in range(2)] == [None, None]
    assert (count(w, "single"), count(w, "group")) == (0, 1)
    assert "retirement" not in status_of(w)


async def test_a_run_terminated_before_admission_left_nothing_unlabelled(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, [0, 1])
    await terminated_mid_drain(w, None)
    await w.pass_()
    (event,) = terminated_events(w)
    assert f"no admitted member is left without {LABEL_ELIGIBLE}" in event["message"]
    assert count(w, "none") == 1
    assert w.kube.called("patch_deployment_status") == []  # nothing was mirrored


async def test_a_run_that_ended_otherwise_is_not_read_as_terminated(w: World) -> None:
    t = single_member_world(w)
    w.temporal.running(request(1), phase=Phase.DRAINING, target=t)
    await w.pass_()
    w.temporal.close(WID, WorkflowExecutionStatus.FAILED)
    scale(w, 2)
    await w.pass_()
    assert terminated_events(w) == []
    assert w.kube.called("patch_deployment_status") == []


async def test_every_terminated_series_starts_at_zero() -> None:
    """``increase()`` over a series that appears at 1 sees no increase: the alert on this
    counter needs each label value exported from the start."""
    w = make_world()
    for left in ("none", "single", "group"):
        assert (
            w.metrics.registry.get_sample_value(
                "retire_watcher_retirements_terminated_total", {"left_unlabelled": left}
            )
            == 0
        )


async def test_the_event_message_fits_and_names_at_most_eight_members() -> None:
    from kube.objects import Pod
    from watcher.terminated import terminated_message as _terminated_message

    pods = [Pod.from_raw(member_pod(f"p{i:02d}", deployment=MD, uid=f"u{i}")) for i in range(20)]
    md = w_md()
    text = _terminated_message(
        WID,
        "run-1",
        md=md,
        replica="server:1",
        cleared=True,
        single=pods,
        group=pods,
        source="",
    )
    assert "p07" in text and "p08" not in text and "and 12 more" in text
    assert len(text) <= 1000


def w_md() -> Any:
    from kube.deployment import parse_deployment
    from tests.helpers import model_deployment

    body = model_deployment(MD, namespace=NS, uid=MD_UID)
    body["metadata"].setdefault("resourceVersion", "1")
    return parse_deployment(body)
