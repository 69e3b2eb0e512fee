"""The watcher's reconcile (``watcher.reconcile.Reconciler``) against the fake Kubernetes
layer, with Temporal as an in-memory fake (``tests/helpers/fake_temporal``) for every
branch, and on the time-skipping test server (real starts, refusals, signals and updates
of ``RetirementWorkflow`` with fake activities) for the paths where Temporal's own answer
matters.

Each branch of the orchestration is covered: the one start per deployment (the first
intent, a second start refused and the intent left pending), a malformed ModelDeployment
skipped with one ``DeploymentInvalid`` Event, the cancel-intent signal, and Kubernetes and
Temporal errors that must not stop the pass or the loop.  The concerns have their own
files: the retry annotation (``test_watcher_retry_delivery.py``), refused intents
(``test_watcher_refused_intents.py``), the eligibility label (``test_watcher_labels.py``),
terminated runs (``test_watcher_terminated.py``); the world they share is
``tests/helpers/watcher_world.py``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from kube.errors import Conflict, Forbidden, KubeError, Unavailable
from retirement.budgets import Budgets
from retirement.models import (
    CancelIntent,
    IntentKind,
    RetirementState,
    RouterlessPolicy,
    workflow_id_for,
)
from retirement.names import ANNOTATION_RETRY
from retirement.phases import Outcome, Phase
from tests.helpers import eventually_async, model_deployment, role
from tests.helpers.fake_kube import FakeKube, member_pod
from tests.helpers.fake_temporal import FakeTemporal, TemporalCall, rpc_error
from tests.helpers.watcher_world import (
    MD,
    MD_UID,
    NS,
    WID,
    World,
    add_md,
    add_replicas,
    cache_without_refresh,
    held,
    make_world,
    request,
    target_of,
)
from tests.workflows.fakes import FakeWorld
from watcher.metrics import WatcherMetrics
from watcher.reconcile import Reconciler, WatcherSettings
from worker.build import workflow_runner
from worker.stale_activations import REFUSED
from workflows.retirement import RetirementWorkflow, initial_search_attributes

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def w() -> World:
    return make_world()


# ---------------------------------------------------------------- starting retirements


async def test_scale_down_starts_one_retirement_the_highest_ordinal_first(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, range(3))
    await w.pass_()
    (start,) = w.temporal.called("start_workflow")
    req = start.arg
    assert start.workflow_id == WID == "retirement/default/llm"
    assert start.name == "run"
    assert (req.namespace, req.deployment, req.role, req.ordinal) == (NS, MD, "server", 2)
    assert req.intent is IntentKind.COUNT_TRIM and req.members == []
    assert start.options["task_queue"] == "retirement"
    assert start.options["search_attributes"] == initial_search_attributes(req)
    assert w.metric("retire_watcher_retirements_started_total") == 1
    assert w.metric("retire_watcher_intents_seen_total") == 2
    assert w.metric("retire_watcher_intents_pending", deployment=f"{NS}/{MD}") == 1
    assert w.events() == []


async def test_a_second_pass_while_one_runs_starts_nothing(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, range(3))
    await w.pass_(times=3)
    assert [r.ordinal for r in w.starts()] == [2]
    assert len(w.temporal.runs[WID]) == 1
    # The first pass starts it without asking (the running set knew of nothing, and the
    # start answers); later passes ask what runs and read its state instead of starting.
    assert len(w.temporal.called("describe")) == 2
    assert len(w.temporal.called("query")) == 2
    assert all(c.name == "state" for c in w.temporal.called("query"))
    assert w.metric("retire_watcher_intents_pending", deployment=f"{NS}/{MD}") == 1


async def test_a_start_refused_by_temporal_leaves_the_intent_pending(w: World) -> None:
    """Another watcher (or ``retire start``) won the race between describe and start: the
    workflow ID is per deployment, so Temporal refuses the second start."""
    add_md(w, replicas=1)
    add_replicas(w, range(3))
    rival = request(1)

    def rival_starts_first(_: TemporalCall) -> None:
        w.temporal.running(rival)

    w.temporal.on("start_workflow", rival_starts_first)
    await w.pass_()
    assert [r.ordinal for r in w.starts()] == [2]  # tried, refused
    assert [r.state.request for r in w.temporal.runs[WID]] == [rival]  # only the rival's
    assert w.metric("retire_watcher_starts_refused_total", reason="already-running") == 1
    assert w.metric("retire_watcher_retirements_started_total") == 0
    # One retirement runs (the rival's): the other intent waits its turn.
    assert w.metric("retire_watcher_intents_pending", deployment=f"{NS}/{MD}") == 1


async def test_a_closed_retirement_frees_the_slot_for_the_next_intent(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, range(3))
    await w.pass_()
    w.temporal.close(WID, outcome=Outcome.COMPLETED, phase=Phase.COMPLETED)
    w.kube.remove_pod(f"{MD}-server-2")
    await w.pass_()
    assert [r.ordinal for r in w.starts()] == [2, 1]
    assert len(w.temporal.runs[WID]) == 2
    assert w.metric("retire_watcher_retirements_started_total") == 2


@pytest.mark.parametrize(
    "status",
    [
        WorkflowExecutionStatus.FAILED,
        WorkflowExecutionStatus.TERMINATED,
        WorkflowExecutionStatus.CANCELED,
        WorkflowExecutionStatus.TIMED_OUT,
    ],
)
async def test_any_closed_status_counts_as_not_running(
    w: World, status: WorkflowExecutionStatus
) -> None:
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    w.temporal.running(request(1))
    w.temporal.close(WID, status)
    await w.pass_()
    assert [r.ordinal for r in w.starts()] == [1]
    assert w.temporal.called("query") == []  # the closed run is not queried


async def test_no_intent_starts_nothing(w: World) -> None:
    add_md(w, replicas=2)
    add_replicas(w, range(2))
    terminating = member_pod(
        f"{MD}-server-2", deployment=MD, ordinal=2, uid="uid-terminating", eligible=False
    )
    terminating["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    w.kube.add_pod(terminating)
    await w.pass_()
    assert w.starts() == []
    assert w.metric("retire_watcher_intents_seen_total") == 0
    assert w.metric("retire_watcher_intents_pending", deployment=f"{NS}/{MD}") == 0
    assert w.eligible(f"{MD}-server-2") is None  # a terminating Pod is never relabelled


async def test_a_departed_role_is_retired_after_the_count_trims(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    add_replicas(w, range(2), role_name="old")
    await w.pass_()
    assert [(r.intent, r.role, r.ordinal) for r in w.starts()] == [
        (IntentKind.COUNT_TRIM, "server", 1)
    ]
    w.temporal.close(WID)
    w.kube.remove_pod(f"{MD}-server-1")
    await w.pass_()
    assert [(r.intent, r.role, r.ordinal) for r in w.starts()][1:] == [
        (IntentKind.DEPARTED_ROLE, "old", 1)
    ]


async def test_a_surplus_member_is_shed_by_name(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, [0])
    w.kube.add_pod(member_pod(f"{MD}-server-0-x", deployment=MD, ordinal=0, uid="uid-dup"))
    await w.pass_()
    (req,) = w.starts()
    assert (req.intent, req.role, req.ordinal) == (IntentKind.SURPLUS_SHED, "server", 0)
    assert req.members == [f"{MD}-server-0-x"]


async def test_the_watcher_settings_go_into_every_request() -> None:
    settings = WatcherSettings(
        task_queue="tq-other",
        budgets=Budgets(overall_s=200, withdrawal_s=20, drain_s=150, settle_s=20),
        routerless_policy=RouterlessPolicy.QUIET_WINDOW,
        quiet_window_s=3.5,
    )
    w = make_world(settings=settings)
    add_md(w, replicas=0)
    add_replicas(w, [0])
    await w.pass_()
    (start,) = w.temporal.called("start_workflow")
    assert start.options["task_queue"] == "tq-other"
    assert start.arg.budgets == settings.budgets
    assert start.arg.routerless_policy is RouterlessPolicy.QUIET_WINDOW
    assert start.arg.quiet_window_s == 3.5


async def test_deployments_are_reconciled_each_on_its_own() -> None:
    w = make_world()
    for ns in ("a", "b"):
        add_md(w, namespace=ns, replicas=0)
        add_replicas(w, [0], namespace=ns)
    await w.pass_()
    assert sorted(c.workflow_id for c in w.temporal.called("start_workflow")) == [
        "retirement/a/llm",
        "retirement/b/llm",
    ]
    assert [c.args for c in w.kube.called("list_deployments")] == [{"namespace": None}]


async def test_watch_namespaces_limit_the_pass() -> None:
    w = make_world(namespaces=["b", "c"])
    for ns in ("a", "b"):
        add_md(w, namespace=ns, replicas=0)
        add_replicas(w, [0], namespace=ns)
    await w.pass_()
    assert [c.workflow_id for c in w.temporal.called("start_workflow")] == ["retirement/b/llm"]
    assert [c.args for c in w.kube.called("list_deployments")] == [
        {"namespace": "b"},
        {"namespace": "c"},
    ]
    assert {c.args["namespace"] for c in w.kube.called("list_pods")} == {"b"}


# ---------------------------------------------------------------- malformed deployments


async def test_a_malformed_deployment_is_skipped_with_one_event(w: World) -> None:
    bad = model_deployment("bad", namespace=NS, uid="bad-uid", replicas=1)
    bad["spec"]["roles"][0]["replicas"] = "two"
    w.kube.add_deployment(bad)
    add_replicas(w, range(3), deployment="bad")
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    await w.pass_(times=2)
    (event,) = w.events()
    assert event["reason"] == "DeploymentInvalid" and event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "bad"
    assert event["involvedObject"]["uid"] == "bad-uid"
    assert event["involvedObject"]["kind"] == "ModelDeployment"
    assert "replicas must be an integer" in event["message"]
    assert len(w.kube.called("create_event")) == 1  # remembered: not posted again
    # Nothing of "bad" is read or touched; the good one is reconciled.
    assert [c.workflow_id for c in w.temporal.called("start_workflow")] == [WID]
    assert all("instance=bad" not in c.args["selector"] for c in w.kube.called("list_pods"))
    assert w.kube.called("patch_pod") == [] and w.kube.called("patch_deployment") == []


async def test_a_malformed_deployment_without_a_name_posts_nothing(w: World) -> None:
    w.kube.deployments[(NS, "")] = {"metadata": {"namespace": NS}, "spec": {"roles": []}}
    add_md(w, replicas=0)
    add_replicas(w, [0])
    await w.pass_()
    assert w.events() == []
    assert [r.deployment for r in w.starts()] == [MD]


async def test_an_event_that_cannot_be_posted_does_not_stop_the_pass(w: World) -> None:
    bad = model_deployment("bad", namespace=NS, replicas=1)
    del bad["spec"]["roles"]
    w.kube.add_deployment(bad)
    add_md(w, replicas=0)
    add_replicas(w, [0])
    w.kube.fail("create_event", Forbidden("create Event", status=403, reason="Forbidden"))
    await w.pass_()
    assert w.events() == []
    assert [r.deployment for r in w.starts()] == [MD]
    await w.pass_()  # the next pass posts it
    assert [e["reason"] for e in w.events()] == ["DeploymentInvalid"]


# ---------------------------------------------------------------- a cache behind the server


async def test_a_scale_back_the_cache_has_not_seen_yet_starts_nothing(w: World) -> None:
    """The cached spec still trims ordinal 1, but the API server's says 2 again (the watch
    event is on its way: the watcher was paused, or its watch lags): one GET before the
    start reads the spec as it is now, and nothing starts (found on the bed: a watcher
    resumed after a terminate and a scale back up started a retirement of a replica that
    was wanted again).  The cache's own event then reconciles it: nothing to start."""
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    cache_without_refresh(w)
    body = w.kube.deployments[(NS, MD)]
    body["spec"]["roles"][0]["replicas"] = 2
    w.kube._bump(body)
    await w.rec.reconcile_key((NS, MD))
    assert w.starts() == []
    assert [c.method for c in w.kube.called("get_deployment")] == ["get_deployment"]
    cache_without_refresh(w)  # the event arrives
    await w.rec.reconcile_key((NS, MD))
    assert w.starts() == []


async def test_a_start_reads_the_spec_once_and_starts_when_it_still_trims(w: World) -> None:
    """A newer version of the spec that still trims the ordinal (another field changed):
    the start goes ahead; an unchanged version is not decoded again."""
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    cache_without_refresh(w)
    body = w.kube.deployments[(NS, MD)]
    body["metadata"].setdefault("labels", {})["team"] = "a"
    w.kube._bump(body)
    await w.rec.reconcile_key((NS, MD))
    assert [r.ordinal for r in w.starts()] == [1]


# ---------------------------------------------------------------- cancel-intent


@pytest.mark.parametrize("outcome", [Outcome.RUNNING, Outcome.ABORTED])
async def test_a_redeclared_ordinal_gets_cancel_intent(w: World, outcome: Outcome) -> None:
    add_md(w, replicas=3)
    add_replicas(w, range(3))
    w.temporal.running(request(2), outcome=outcome)
    await w.pass_()
    (sig,) = w.signals()
    assert sig.name == "cancel_intent"
    assert sig.arg == CancelIntent(reason="the spec re-declares server ordinal 2")
    assert w.starts() == []


@pytest.mark.parametrize(
    "outcome", [Outcome.COMPLETED, Outcome.CAPACITY_RETAINED, Outcome.ABANDONED, Outcome.REFUSED]
)
async def test_a_finishing_retirement_gets_no_cancel_intent(w: World, outcome: Outcome) -> None:
    """The run is still open (its last mirror write) but its outcome is decided."""
    add_md(w, replicas=3)
    add_replicas(w, range(3))
    w.temporal.running(request(2), outcome=outcome)
    await w.pass_()
    assert w.signals() == []


async def test_an_ordinal_still_beyond_the_count_gets_no_cancel_intent(w: World) -> None:
    add_md(w, replicas=2)
    add_replicas(w, range(3))
    w.temporal.running(request(2))
    await w.pass_()
    assert w.signals() == []


async def test_a_count_trim_of_a_role_gone_from_the_spec_is_left_to_run(w: World) -> None:
    add_md(w, role_name="other", replicas=1)
    add_replicas(w, range(3))
    w.temporal.running(request(2))
    await w.pass_()
    assert w.signals() == []


async def test_a_signal_that_fails_does_not_stop_the_pass(w: World) -> None:
    add_md(w, replicas=3)
    add_replicas(w, range(3))
    add_md(w, "other", replicas=0)
    add_replicas(w, [0], deployment="other")
    w.temporal.running(request(2))
    w.temporal.fail("signal", rpc_error(RPCStatusCode.UNAVAILABLE))
    await w.pass_()
    assert [r.deployment for r in w.starts()] == ["other"]
    await w.pass_()
    assert [c.name for c in w.signals()] == ["cancel_intent", "cancel_intent"]  # retried


async def test_a_departed_role_declared_again_gets_cancel_intent(w: World) -> None:
    add_md(w, replicas=1, extra_roles=[role("old", replicas=2)])
    add_replicas(w, [0])
    add_replicas(w, range(2), role_name="old")
    w.temporal.running(request(1, role_name="old", intent=IntentKind.DEPARTED_ROLE))
    await w.pass_()
    assert [c.name for c in w.signals()] == ["cancel_intent"]


async def test_a_resolved_surplus_gets_cancel_intent(w: World) -> None:
    add_md(w, replicas=1)
    add_replicas(w, [0])  # the duplicate member is gone: no surplus any more
    w.temporal.running(request(0, intent=IntentKind.SURPLUS_SHED, members=[f"{MD}-server-0-x"]))
    await w.pass_()
    assert [c.name for c in w.signals()] == ["cancel_intent"]


async def test_a_count_trim_whose_pods_someone_else_deleted_gets_cancel_intent(
    w: World,
) -> None:
    """The intent vanished without the spec changing (the Pods went): the same rule as
    admission's says why; a retirement that was told once is not told again."""
    add_md(w, replicas=2)
    add_replicas(w, range(2))
    held(w, 2)  # its Pod llm-server-2 is gone
    await w.pass_()
    (sig,) = w.signals()
    assert sig.name == "cancel_intent"
    assert sig.arg == CancelIntent(
        reason="replica server ordinal 2 is no longer a removal intent of the live spec and Pods"
    )
    w.temporal.set_state(WID, cancel_intent=sig.arg.reason)
    await w.pass_()
    assert len(w.signals()) == 1


async def test_a_vanished_intent_is_cancelled_only_before_the_point_of_no_return(
    w: World,
) -> None:
    """Deleting, the retirement's own deletes make its Pods terminating: no cancel-intent
    then; before the point of no return a Pod that went terminating cancels it."""
    add_md(w, replicas=1)
    add_replicas(w, [0])
    gone = member_pod(f"{MD}-server-1", deployment=MD, ordinal=1, uid="uid-1")
    gone["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    w.kube.add_pod(gone)
    w.temporal.running(request(1), phase=Phase.DELETING)
    await w.pass_()
    assert w.signals() == []
    w.temporal.set_state(WID, phase=Phase.DRAINING)
    await w.pass_()
    assert [c.arg.reason for c in w.signals()] == [
        "replica server ordinal 1 is no longer a removal intent of the live spec and Pods"
    ]


@pytest.mark.parametrize("outcome", [Outcome.RUNNING, Outcome.ABORTED])
async def test_a_recreated_deployment_gets_cancel_intent(w: World, outcome: Outcome) -> None:
    """The ModelDeployment was deleted and created again under the same name: the
    retirement admitted the old one's UID, so its intent is gone even though the new
    spec trims the same ordinal."""
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    req = request(1)
    target = target_of(req, {f"{MD}-server-1": f"uid-{MD}-server-1"})
    target = target.model_copy(update={"deployment_uid": "the-old-uid"})
    w.temporal.running(req, outcome=outcome, target=target)
    await w.pass_()
    (sig,) = w.signals()
    assert sig.arg.reason == (
        f"ModelDeployment {NS}/{MD} was re-created (UID {MD_UID}; "
        "the retirement admitted UID the-old-uid)"
    )
    # The same deployment (the UID admission bound): its intent stands, no cancel-intent.
    w.temporal.set_state(WID, target=target.model_copy(update={"deployment_uid": MD_UID}))
    await w.pass_()
    assert len(w.signals()) == 1


# ---------------------------------------------------------------- errors


async def test_temporal_unavailable_touches_no_label(w: World) -> None:
    """Without knowing what runs, nothing is protected: so nothing is relabelled."""
    add_md(w, replicas=2)
    names = add_replicas(w, range(2), eligible=False)
    add_md(w, "other", replicas=0)
    add_replicas(w, [0], deployment="other")
    w.temporal.fail("describe", rpc_error(RPCStatusCode.UNAVAILABLE))
    await w.pass_()
    assert [w.eligible(n) for n in names] == [None, None]
    assert [r.deployment for r in w.starts()] == ["other"]


@pytest.mark.parametrize("method", ["query", "start_workflow"])
async def test_a_temporal_rpc_error_skips_only_its_deployment(w: World, method: str) -> None:
    add_md(w, replicas=1)
    names = add_replicas(w, range(2), eligible=False)
    add_md(w, "zz", replicas=0)
    add_replicas(w, [0], deployment="zz")
    if method == "query":
        w.temporal.running(request(1))
    w.temporal.fail(method, rpc_error(RPCStatusCode.DEADLINE_EXCEEDED))
    await w.pass_()
    assert w.eligible(names[0]) is None  # the pass of "llm" stopped before the labels
    assert "retirement/default/zz" in w.temporal.runs
    await w.pass_()
    assert w.eligible(names[0]) == "true"  # and the next pass completes it


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("list_pods", Unavailable("list Pods", status=503, reason="ServiceUnavailable")),
        ("patch_pod", Forbidden("patch Pod", status=403, reason="Forbidden")),
        ("patch_deployment", Conflict("patch ModelDeployment", status=409, reason="Conflict")),
        ("create_event", Forbidden("create Event", status=403, reason="Forbidden")),
    ],
)
async def test_a_kubernetes_error_skips_only_its_deployment(
    w: World, method: str, error: KubeError
) -> None:
    add_md(w, replicas=1, annotations={ANNOTATION_RETRY: "server:1:t1"})
    add_replicas(w, range(2), eligible=False)
    add_md(w, "zz", replicas=0)
    add_replicas(w, [0], deployment="zz")
    w.kube.fail(method, error)
    await w.pass_()
    assert "retirement/default/zz" in w.temporal.runs
    await w.pass_()
    assert w.eligible(f"{MD}-server-0") == "true"
    assert [r.deployment for r in w.starts()].count(MD) == 1


async def test_a_hostile_ordinal_label_does_not_stop_other_deployments(w: World) -> None:
    add_md(w, "aa", replicas=1)
    w.kube.add_pod(member_pod("aa-x", deployment="aa", ordinal=1_000_000, uid="ux"))
    add_md(w, replicas=0)
    add_replicas(w, [0])
    await w.pass_()
    assert [r.deployment for r in w.starts()] == [MD]


async def test_a_failing_query_does_not_stop_other_deployments(w: World) -> None:
    add_md(w, "aa", replicas=0)
    add_replicas(w, [0], deployment="aa")
    w.temporal.running(request(0, deployment="aa"))
    w.temporal.fail("query", WorkflowQueryFailedError("nondeterminism"))
    add_md(w, replicas=0)
    add_replicas(w, [0])
    await w.pass_()
    assert [r.deployment for r in w.starts()] == [MD]


async def test_a_failing_deployment_is_counted_and_posted_once_per_message(w: World) -> None:
    add_md(w, "aa", replicas=0)
    add_replicas(w, [0], deployment="aa")
    w.temporal.running(request(0, deployment="aa"))
    add_md(w, replicas=1)  # nothing to retire: only "aa" queries
    add_replicas(w, [0], eligible=False)
    w.temporal.fail("query", WorkflowQueryFailedError("nondeterminism"), times=3)
    await w.pass_(times=3)
    (event,) = w.events("ReconcileFailed")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["name"] == "aa"
    assert event["message"] == "not reconciled: WorkflowQueryFailedError: nondeterminism"
    assert len(w.kube.called("create_event")) == 1  # not re-posted on every pass
    assert w.metric("retire_watcher_reconcile_errors_total", error="WorkflowQueryFailedError") == 3
    assert w.eligible(f"{MD}-server-0") == "true"  # the other deployment was reconciled
    w.temporal.fail("query", WorkflowQueryFailedError("another"))
    await w.pass_()
    assert sorted(e["message"] for e in w.events("ReconcileFailed")) == [
        "not reconciled: WorkflowQueryFailedError: another",
        "not reconciled: WorkflowQueryFailedError: nondeterminism",
    ]
    # Temporal unreachable is no fact about the deployment: counted, not posted.
    w.temporal.fail("query", rpc_error(RPCStatusCode.UNAVAILABLE))
    await w.pass_()
    assert len(w.events("ReconcileFailed")) == 2
    assert w.metric("retire_watcher_reconcile_errors_total", error="RPCError") == 1


async def test_an_unexpected_error_of_one_deployment_does_not_stop_the_others(
    w: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever one deployment's reconcile raises (here a bug in the eligibility code),
    the pass goes on; the next pass completes once it is gone."""
    add_md(w, "aa", replicas=0)
    add_replicas(w, [0], deployment="aa")
    add_md(w, replicas=0)
    add_replicas(w, [0])
    original = Reconciler._maintain_eligibility
    calls: list[str] = []

    async def broken(self: Reconciler, md: Any, pods: Any, state: Any, **kw: Any) -> None:
        calls.append(md.name)
        if md.name == "aa" and calls.count("aa") == 1:
            raise KeyError("boom")
        await original(self, md, pods, state, **kw)

    monkeypatch.setattr(Reconciler, "_maintain_eligibility", broken)
    result = await w.rec.reconcile_all()
    assert (result.reconciled, result.failed, result.unreachable) == (1, 1, 0)
    assert result.healthy
    assert sorted(r.deployment for r in w.starts()) == ["aa", MD]
    assert [e["message"] for e in w.events("ReconcileFailed")] == [
        "not reconciled: KeyError: 'boom'"
    ]


# ---------------------------------------------------------------- on the time-skipping server


@dataclass
class Live:
    """A reconciler over FakeKube and the time-skipping server, with a worker running
    ``RetirementWorkflow`` on fake activities (``tests/workflows/fakes.py``)."""

    env: WorkflowEnvironment
    world: FakeWorld
    w: World
    md: str

    @property
    def wid(self) -> str:
        return workflow_id_for(namespace=NS, deployment=self.md)

    def handle(self) -> WorkflowHandle[Any, Any]:
        return self.env.client.get_workflow_handle(self.wid, result_type=RetirementState)

    async def state(self) -> RetirementState:
        st: RetirementState = await self.handle().query(RetirementWorkflow.state)
        return st

    def set_replicas(self, replicas: int) -> None:
        self.w.kube.patch_deployment(
            namespace=NS,
            name=self.md,
            patch={"spec": {"roles": [role("server", replicas=replicas)]}},
        )


@pytest.fixture
async def live(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Live]:
    world, queue = FakeWorld(), f"tq-{uuid.uuid4()}"
    kube, metrics = FakeKube(), WatcherMetrics()
    rec = Reconciler(
        kube=kube,
        temporal=time_skipping_env.client,
        settings=WatcherSettings(task_queue=queue),
        metrics=metrics,
    )
    w = World(kube, FakeTemporal(), metrics, rec)  # FakeTemporal unused: the server answers
    md = f"md-{uuid.uuid4().hex[:8]}"
    async with Worker(
        time_skipping_env.client,
        task_queue=queue,
        workflows=[RetirementWorkflow],
        workflow_runner=workflow_runner(converter=time_skipping_env.client.data_converter),
        activities=cast("list[Callable[..., Any]]", world.activities()),
    ):
        yield Live(time_skipping_env, world, w, md)


async def wait_for(live: Live, ok: Callable[[RetirementState], bool], what: str) -> RetirementState:
    async def check() -> RetirementState | None:
        st = await live.state()
        return st if ok(st) else None

    return await eventually_async(check, what=what, timeout=10, interval=0.05)


async def end(live: Live) -> RetirementState:
    """Re-declare every ordinal and reconcile: cancel-intent ends the run, capacity kept."""
    live.set_replicas(3)
    await live.w.pass_()
    st: RetirementState = await asyncio.wait_for(live.handle().result(), 20)
    return st


class RacingClient:
    """The real client, except that ``describe`` answers NOT_FOUND: the state of a
    watcher that looked just before another one started the retirement."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_workflow_handle(self, workflow_id: str, **kw: Any) -> Any:
        handle = self._client.get_workflow_handle(workflow_id, **kw)

        class Stale:
            async def describe(self, **_: Any) -> Any:
                raise rpc_error(RPCStatusCode.NOT_FOUND, "not yet")

            def __getattr__(self, name: str) -> Any:
                return getattr(handle, name)

        return Stale()


async def test_live_one_start_a_refused_second_and_cancel_intent(live: Live) -> None:
    """The retirement is held after an abort (running, keeping the slot): a held run ends
    on cancel-intent at once, where a hanging activity would wait out its heartbeat."""
    live.world.behaviour["drain"] = "failed"
    add_md(live.w, live.md, replicas=1)
    add_replicas(live.w, range(3), deployment=live.md)
    await live.w.pass_()
    st = await wait_for(live, lambda s: s.outcome is Outcome.ABORTED, "held")
    assert (st.request.role, st.request.ordinal, st.request.intent) == (
        "server",
        2,
        IntentKind.COUNT_TRIM,
    )
    first = (await live.handle().describe()).run_id
    await live.w.pass_()  # it runs: no second start
    assert (await live.handle().describe()).run_id == first
    # A watcher that missed it tries to start: Temporal refuses (one ID per deployment).
    racer = Reconciler(
        kube=live.w.kube,
        temporal=RacingClient(live.env.client),  # type: ignore[arg-type]
        settings=live.w.rec.settings,
        metrics=live.w.metrics,
    )
    await racer.reconcile_all()
    assert live.w.metric("retire_watcher_starts_refused_total", reason="already-running") == 1
    assert live.w.metric("retire_watcher_retirements_started_total") == 1
    assert (await live.handle().describe()).run_id == first
    final = await end(live)
    assert final.outcome is Outcome.CAPACITY_RETAINED
    assert final.cancel_intent == "the spec re-declares server ordinal 2"
    assert "delete" not in live.world.calls and live.world.admissions == 1


async def test_live_retry_annotation_starts_a_fresh_attempt(live: Live) -> None:
    live.world.behaviour["drain"] = "failed"
    add_md(live.w, live.md, replicas=1)
    add_replicas(live.w, range(2), deployment=live.md)
    await live.w.pass_()
    await wait_for(
        live, lambda s: s.outcome is Outcome.ABORTED and s.phase is Phase.ABORTED, "held"
    )
    annotate = {"metadata": {"annotations": {ANNOTATION_RETRY: "server:1:t1"}}}
    live.w.kube.patch_deployment(namespace=NS, name=live.md, patch=annotate)
    await live.w.pass_()
    (event,) = live.w.events("RetryDelivered")
    assert event["message"] == "token t1: Accept"
    assert ANNOTATION_RETRY not in live.w.annotations(live.md)
    # No query while the run continues as new (the test server can time out a query that
    # meets a run whose first workflow task has not completed): wait for its restore.
    await eventually_async(
        lambda: asyncio.sleep(0, result=live.world.calls.count("restore") == 2),
        what="the second attempt restored",
        timeout=10,
        interval=0.05,
    )
    st = await wait_for(
        live, lambda s: s.attempt == 2 and s.outcome is Outcome.ABORTED, "the second attempt held"
    )
    assert st.last_consumed_retry_token == "t1"
    # The same token again is a replay: not delivered, the attempt stays.
    live.w.kube.patch_deployment(namespace=NS, name=live.md, patch=annotate)
    await live.w.pass_()
    assert ANNOTATION_RETRY not in live.w.annotations(live.md)
    history = await live.handle().fetch_history()  # this attempt's run
    assert not [
        e
        for e in history.events
        if e.HasField("workflow_execution_update_accepted_event_attributes")
    ]
    assert (await live.state()).attempt == 2
    final = await end(live)
    assert final.outcome is Outcome.CAPACITY_RETAINED
    assert live.world.admissions == 2


async def test_a_retirement_whose_deployment_was_deleted_gets_cancel_intent_once(
    w: World,
) -> None:
    """SPEC section 3 ('deployment deleted'): the held retirement would otherwise hold for
    ever, and a deployment re-created under that name could never retire anything."""
    held(w)  # retirement/<ns>/<md>, its ModelDeployment never listed: deleted
    add_md(w, "other", replicas=1)
    add_replicas(w, [0, 1], deployment="other")  # ordinal 1 is still a count trim
    w.temporal.running(request(1).model_copy(update={"deployment": "other"}))
    await w.pass_()
    [sig] = w.signals()
    assert sig.name == "cancel_intent" and "was deleted" in sig.arg.reason
    assert w.signals(workflow_id=f"retirement/{NS}/other") == []  # its deployment exists
    await w.pass_()
    assert len(w.signals()) == 1  # told once


async def test_a_state_query_the_worker_refused_as_stale_is_no_fact_about_the_deployment(
    w: World,
) -> None:
    """The worker's guard refuses a query that raced a workflow task (the run is evicted
    and replays).  Refused once, the watcher asks again and goes on; refused twice, the
    pass fails as Temporal unreachable would: counted as ``QueryRefused``, no Warning Event
    on the deployment, and the next pass reads the state."""
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    w.temporal.running(request(1), outcome=Outcome.ABORTED, phase=Phase.ABORTED)
    w.temporal.fail("query", WorkflowQueryFailedError(REFUSED))
    await w.pass_()
    assert w.metric("retire_watcher_reconcile_errors_total", error="QueryRefused") == 0
    w.temporal.fail("query", WorkflowQueryFailedError(REFUSED), times=2)
    await w.pass_()
    assert w.metric("retire_watcher_reconcile_errors_total", error="QueryRefused") == 1
    assert w.events("ReconcileFailed") == []
    await w.pass_()
    assert w.metric("retire_watcher_reconcile_errors_total", error="QueryRefused") == 1
    assert w.starts() == [] and w.events("ReconcileFailed") == []
