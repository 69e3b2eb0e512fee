"""``admit`` under ``ActivityEnvironment`` against the fake Kubernetes layer: it binds the
replica (UIDs, container IDs, the Workload, the deployment's generation) or refuses with a
reason a person can act on, and in every case it only reads.  A Kubernetes error leaves it
as an ``ApplicationError`` whose type and retryability the retry policies rely on."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities import RetirementActivities
from kube.api import ExecResult
from kube.errors import Forbidden, KubeError, NotFound, Unavailable
from retirement.models import (
    Admission,
    AdmitInput,
    IntentKind,
    Observation,
    PhaseInput,
    RestoreResult,
    RetirementRequest,
    Target,
)
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict
from tests.helpers import model_deployment, role
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod, oneshot_stdout

NS = "default"
MD = "llm"
#: The calls admission may make: reads only.
READS = {"get_deployment", "list_pods", "list_namespace_endpoint_slices", "list_workloads"}


def cluster(*pods: dict[str, Any], md: dict[str, Any] | None = None) -> FakeKube:
    """A deployment ``llm`` (vLLM 0.29.0, scaled down to 1 single-member replica: replica 1
    is a count trim) and ``pods``."""
    kube = FakeKube()
    kube.add_deployment(md or model_deployment(MD, namespace=NS, uid="md-uid", replicas=1))
    for p in pods:
        kube.add_pod(p)
    return kube


def replica(ordinal: int = 1, **kw: Any) -> dict[str, Any]:
    """The one member Pod of replica ``ordinal``."""
    kw.setdefault("uid", f"uid-{ordinal}")
    kw.setdefault("ip", f"198.18.1.{10 + ordinal}")
    return member_pod(f"{MD}-{ordinal}", deployment=MD, ordinal=ordinal, **kw)


def admit(
    kube: FakeKube,
    *,
    ordinal: int = 1,
    intent: IntentKind = IntentKind.COUNT_TRIM,
    role_name: str = "server",
    members: list[str] | None = None,
) -> Admission:
    req = RetirementRequest(
        namespace=NS,
        deployment=MD,
        role=role_name,
        ordinal=ordinal,
        intent=intent,
        members=members or [],
    )
    inp = AdmitInput(request=req, workflow_id=f"retirement/{NS}/{MD}")
    result: Admission = attempt_env().run(RetirementActivities(kube).admit, inp)
    return result


def assert_read_only(kube: FakeKube) -> None:
    assert {c.method for c in kube.calls} <= READS, [c.method for c in kube.calls]


# ---------------------------------------------------------------- binding


def test_admit_binds_the_replica_and_only_reads() -> None:
    kube = cluster(replica(0), replica(1))
    admission = admit(kube)
    assert admission.refusal == ""
    t = admission.target
    assert t is not None
    assert (t.namespace, t.deployment, t.role, t.ordinal) == (NS, MD, "server", 1)
    assert (t.engine, t.engine_version, t.shape, t.router) == ("vLLM", "0.29.0", "Single", None)
    assert t.deployment_uid == "md-uid"
    assert t.observed_generation == 1  # no status yet: the generation
    [m] = t.members
    assert (m.pod, m.uid, m.ip) == ("llm-1", "uid-1", "198.18.1.11")
    assert (m.container_id, m.restart_count) == ("containerd://main-1", 0)
    assert m.measured and m.eligible_at_admission
    assert (m.serve_port, m.metrics_port, m.metrics_scheme, m.metrics_path) == (
        8000,
        8000,
        "http",
        "/metrics",
    )
    assert t.workload_name is None and t.workload_uid is None
    assert_read_only(kube)
    # The other replica's Pod is untouched and not bound.
    assert "uid-0" not in t.uids


def test_admit_binds_the_status_observed_generation() -> None:
    md = model_deployment(MD, namespace=NS, uid="md-uid", replicas=1)
    md["status"] = {"observedGeneration": 7}
    admission = admit(cluster(replica(1), md=md))
    assert admission.target is not None
    assert admission.target.observed_generation == 7


def test_admit_binds_the_workload_owned_by_the_replica() -> None:
    kube = cluster(replica(0), replica(1))
    kube.add_workload("wl-0", owners=[("Pod", "uid-0")], uid="wl-uid-0")
    kube.add_workload("wl-1", owners=[("Pod", "uid-1")], uid="wl-uid-1")
    t = admit(kube).target
    assert t is not None
    assert (t.workload_name, t.workload_uid) == ("wl-1", "wl-uid-1")


def test_admit_without_kueue_binds_no_workload() -> None:
    kube = cluster(replica(1))
    kube.kueue_installed = False
    t = admit(kube).target
    assert t is not None
    assert t.workload_name is None and t.workload_uid is None


def test_admit_binds_every_member_of_a_leader_served_group_and_measures_the_leader() -> None:
    md = model_deployment(MD, namespace=NS, replicas=1, size=2)
    pods = [
        # A follower's metrics annotation is not read: a bad one does not refuse.
        member_pod(
            "llm-1-1",
            deployment=MD,
            ordinal=1,
            member=1,
            uid="uid-b",
            ip="198.18.1.21",
            metrics_port="80a",
        ),
        member_pod("llm-1-0", deployment=MD, ordinal=1, member=0, uid="uid-a", ip="198.18.1.20"),
    ]
    t = admit(cluster(*pods, md=md)).target
    assert t is not None
    assert t.shape == "LeaderServed"
    assert [m.pod for m in t.members] == ["llm-1-0", "llm-1-1"]
    assert t.measured == ("llm-1-0",)
    assert t.uids == ["uid-a", "uid-b"]  # the delete binding stays whole
    assert [m.member_index for m in t.members] == [0, 1]


def test_admit_a_surplus_shed_binds_only_the_named_members() -> None:
    md = model_deployment(MD, namespace=NS, replicas=2, size=1)
    pods = [
        member_pod("llm-1-a", deployment=MD, ordinal=1, uid="uid-a", ip="198.18.1.20"),
        member_pod(
            "llm-1-b", deployment=MD, ordinal=1, uid="uid-b", ip="198.18.1.21", eligible=False
        ),
    ]
    admission = admit(cluster(*pods, md=md), intent=IntentKind.SURPLUS_SHED, members=["llm-1-b"])
    t = admission.target
    assert t is not None, admission.refusal
    [m] = t.members
    # Measured by the member-selection rule (the one member at size one answers), whether
    # or not it carries the eligibility label.
    assert (m.pod, m.uid, m.measured, m.eligible_at_admission) == (
        "llm-1-b",
        "uid-b",
        True,
        False,
    )


def test_admit_a_departed_role_reads_its_shape_from_the_pods() -> None:
    md = model_deployment(MD, namespace=NS, role_name="other")
    pod = member_pod("llm-old-0", deployment=MD, role="old", ordinal=0, uid="uid-old")
    admission = admit(
        cluster(pod, md=md), intent=IntentKind.DEPARTED_ROLE, role_name="old", ordinal=0
    )
    t = admission.target
    assert t is not None, admission.refusal
    assert t.role == "old" and t.uids == ["uid-old"] and t.shape == "Single"


# ---------------------------------------------------------------- refusals


def _terminating() -> dict[str, Any]:
    pod = replica(1)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return pod


REFUSALS: dict[str, tuple[Callable[[], FakeKube], dict[str, Any], str]] = {
    "deployment-missing": (lambda: FakeKube(), {}, f"ModelDeployment {NS}/{MD} not found"),
    "deployment-malformed": (
        lambda: cluster(
            replica(1),
            md={
                "metadata": {"name": MD, "namespace": NS},
                "spec": {"engine": {"name": "vLLM"}, "roles": [{"name": "server"}]},
            },
        ),
        {},
        "is malformed: role 'server': replicas is missing",
    ),
    "engine-unknown": (
        lambda: cluster(replica(1), md=model_deployment(MD, namespace=NS, engine="TGI")),
        {},
        "engine 'TGI' is not vLLM or SGLang",
    ),
    "no-pods": (lambda: cluster(replica(0)), {}, "no Pods of role server ordinal 1"),
    "terminating": (lambda: cluster(_terminating()), {}, "already terminating"),
    "no-uid": (lambda: cluster(replica(1, uid="")), {}, "has no UID"),
    "not-started": (
        lambda: cluster(replica(1, container_id=None)),
        {},
        "container main of llm-1 has no container ID (not started)",
    ),
    "no-address": (
        lambda: cluster(_without_ip()),
        {},
        "has no address",
    ),
    "bad-metrics-port": (
        lambda: cluster(replica(1, metrics_port="80a")),
        {},
        "prometheus.io/port '80a' is not a port number",
    ),
    "no-metrics-port": (
        lambda: cluster(replica(1, metrics_port=None)),
        {},
        "no prometheus.io/port annotation",
    ),
    "departed-role-still-declared": (
        lambda: cluster(replica(1)),
        {"intent": IntentKind.DEPARTED_ROLE},
        "role server is still in the spec",
    ),
    "size-mismatch": (
        lambda: cluster(replica(1), md=model_deployment(MD, namespace=NS, replicas=1, size=2)),
        {},
        "declared size 2 != 1 member Pods",
    ),
    "disaggregated": (
        lambda: cluster(
            replica(1, role_kind="Prefill"),
            md=model_deployment(
                MD,
                namespace=NS,
                role_name="other",
                extra_roles=[role("server", replicas=1, kind="Prefill")],
            ),
        ),
        {},
        "shape Disaggregated",
    ),
    "role-kind-disagrees": (
        lambda: cluster(replica(1, role_kind="Decode")),
        {},
        "role kind Server and the Pods'",
    ),
    "leadership-missing": (
        lambda: cluster(
            member_pod("llm-1-a", deployment=MD, ordinal=1, member=1, uid="a", ip="198.18.1.1"),
            member_pod("llm-1-b", deployment=MD, ordinal=1, member=1, uid="b", ip="198.18.1.2"),
            md=model_deployment(MD, namespace=NS, replicas=1, size=2),
        ),
        {},
        "leadership missing",
    ),
    "surplus-not-of-the-replica": (
        lambda: cluster(replica(1)),
        {"intent": IntentKind.SURPLUS_SHED, "members": ["llm-9"]},
        "are not all Pods of the replica",
    ),
}


def _without_ip() -> dict[str, Any]:
    pod = replica(1)
    del pod["status"]["podIP"]
    return pod


@pytest.mark.parametrize(("make", "kw", "reason"), REFUSALS.values(), ids=REFUSALS.keys())
def test_admit_refuses_with_a_reason_and_touches_nothing(
    make: Callable[[], FakeKube], kw: dict[str, Any], reason: str
) -> None:
    kube = make()
    before = {k: v["metadata"]["resourceVersion"] for k, v in kube.pods.items()}
    admission = admit(kube, **kw)
    assert admission.target is None
    assert reason in admission.refusal, admission.refusal
    assert_read_only(kube)
    assert {k: v["metadata"]["resourceVersion"] for k, v in kube.pods.items()} == before


def test_admit_a_replica_that_never_started_is_not_refused() -> None:
    """SPEC section 3: a replica none of whose members ever started serves nothing; it is
    retired (its drain reads "never started"), not refused for ever."""
    admission = admit(cluster(replica(1, container_id=None, ready="False")))
    assert admission.target is not None, admission.refusal
    assert admission.target.members[0].container_id == ""


# ---------------------------------------------------------------- the intent, derived again


def assert_refused(kube: FakeKube, admission: Admission, reason: str) -> None:
    assert admission.target is None
    assert admission.refusal == reason
    assert_read_only(kube)


def test_admit_refuses_a_replica_the_spec_still_declares() -> None:
    """``retire start … --ordinal 0``: replica 0 of a deployment of one replica serves."""
    kube = cluster(replica(0), replica(1))
    assert_refused(
        kube,
        admit(kube, ordinal=0),
        "the spec still declares server ordinal 0 (replicas 1): it is not a removal intent",
    )


def test_admit_refuses_an_ordinal_the_spec_declares_again() -> None:
    md = model_deployment(MD, namespace=NS, replicas=2)  # scaled back up meanwhile
    kube = cluster(replica(0), replica(1), md=md)
    assert_refused(
        kube,
        admit(kube, ordinal=1),
        "the spec still declares server ordinal 1 (replicas 2): it is not a removal intent",
    )


def test_admit_reads_the_pods_as_the_watcher_does() -> None:
    kube = cluster(replica(0), replica(1))
    assert admit(kube).target is not None
    [call] = kube.called("list_pods")
    assert call.args["selector"] == (
        f"app.kubernetes.io/name=model-deployment,app.kubernetes.io/instance={MD}"
    )


def test_admit_a_count_trim_request_for_a_departed_role_is_admitted() -> None:
    """The CLI asks for a count trim; a role gone from the spec is still an intent."""
    md = model_deployment(MD, namespace=NS, role_name="other")
    kube = cluster(member_pod("llm-old-0", deployment=MD, role="old", ordinal=0, uid="u"), md=md)
    admission = admit(kube, role_name="old", ordinal=0)
    assert admission.target is not None, admission.refusal


def surplus_cluster(*names: str) -> FakeKube:
    """Replica 1 of a deployment of 2 single-member replicas, with members ``names``."""
    md = model_deployment(MD, namespace=NS, replicas=2, size=1)
    pods = [
        member_pod(n, deployment=MD, ordinal=1, uid=f"uid-{n}", ip=f"198.18.1.{20 + i}")
        for i, n in enumerate(names)
    ]
    return cluster(replica(0), *pods, md=md)


def test_admit_a_surplus_member_that_is_still_surplus() -> None:
    kube = surplus_cluster("llm-1-a", "llm-1-b")
    admission = admit(kube, intent=IntentKind.SURPLUS_SHED, members=["llm-1-b"])
    assert admission.target is not None, admission.refusal
    assert [m.pod for m in admission.target.members] == ["llm-1-b"]


def test_admit_refuses_a_surplus_whose_kept_member_died() -> None:
    """The kept member went away between the watcher's pass and admission: the surplus
    member is now the replica's only member, and it serves."""
    kube = surplus_cluster("llm-1-a", "llm-1-b")
    kube.remove_pod("llm-1-a")
    assert_refused(
        kube,
        admit(kube, intent=IntentKind.SURPLUS_SHED, members=["llm-1-b"]),
        "replica server ordinal 1 has no surplus member any more: nothing to shed",
    )


def test_admit_refuses_a_member_that_is_no_longer_the_surplus() -> None:
    """The kept member died and another Pod came up: the requested member is the one kept
    now, the newcomer is the surplus."""
    kube = surplus_cluster("llm-1-b", "llm-1-c")
    assert_refused(
        kube,
        admit(kube, intent=IntentKind.SURPLUS_SHED, members=["llm-1-b"]),
        "llm-1-b of replica server ordinal 1 is no longer surplus (the surplus is now "
        "llm-1-c): it would be retired while it serves",
    )


def test_admit_refuses_a_surplus_whose_kept_member_is_terminating() -> None:
    kube = surplus_cluster("llm-1-a", "llm-1-b")
    kube.pods[(NS, "llm-1-a")]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    admission = admit(kube, intent=IntentKind.SURPLUS_SHED, members=["llm-1-b"])
    assert admission.target is None and "llm-1-a is already terminating" in admission.refusal


def test_admit_refuses_a_departed_role_that_is_declared_again() -> None:
    kube = cluster(
        member_pod("llm-old-0", deployment=MD, role="old", ordinal=0, uid="u"),
        md=model_deployment(MD, namespace=NS, role_name="old", replicas=1),
    )
    assert_refused(
        kube,
        admit(kube, intent=IntentKind.DEPARTED_ROLE, role_name="old", ordinal=0),
        "role old is still in the spec: not a departed role",
    )


# ---------------------------------------------------------------- Kubernetes errors


@pytest.mark.parametrize(
    ("method", "error", "retryable"),
    [
        ("get_deployment", Unavailable("read ModelDeployment", status=503), True),
        ("get_deployment", Forbidden("read ModelDeployment", status=403), False),
        ("list_pods", Unavailable("list Pods", reason="ConnectionRefusedError"), True),
        ("list_pods", Forbidden("list Pods", status=403), False),
        ("list_workloads", Unavailable("list Workloads", status=500), True),
        ("list_workloads", Forbidden("list Workloads", status=403), False),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_kubernetes_error_leaves_admit_as_its_application_error(
    method: str, error: KubeError, retryable: bool
) -> None:
    kube = cluster(replica(1))
    kube.fail(method, error)
    with pytest.raises(ApplicationError) as info:
        admit(kube)
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not retryable
    assert info.value.__cause__ is error
    assert_read_only(kube)


def test_a_not_found_pod_list_is_not_read_as_kueue_missing() -> None:
    """Only the Workload list's NotFound means "Kueue is not installed"."""
    kube = cluster(replica(1))
    kube.fail("list_pods", NotFound("list Pods", status=404))
    with pytest.raises(ApplicationError) as info:
        admit(kube)
    assert info.value.type == "NotFound" and info.value.non_retryable


def test_the_serving_port_is_the_one_a_service_routes_to() -> None:
    """The identity probe goes where traffic really goes: the port an EndpointSlice
    routes to the member (``http`` first), not only what the container declares."""
    kube = cluster(replica(0), replica(1))
    kube.set_endpoints(
        MD,
        ["198.18.1.11"],
        namespace=NS,
        target_uids=["uid-1"],
        ports=[{"name": "metrics", "port": 9100}, {"name": "http", "port": 30000}],
    )
    t = admit(kube).target
    assert t is not None and t.members[0].serve_port == 30000
    kube.fail("list_namespace_endpoint_slices", Unavailable("list EndpointSlices", status=503))
    t = admit(kube).target
    assert t is not None and t.members[0].serve_port == 8000  # the declared port


# ---------------------------------------------------------------- surplus sheds (issue 9)
#
# A surplus member is measured by the member-selection rule (``retirement.shape``), not by
# its eligibility label: a member without the label still answers (and may still have
# requests in flight, through a per-replica headless Service or a client that kept its
# address).  A surplus member that never started is retired without a drain read.


def surplus_group(
    *pods: dict[str, Any], size: int = 1, extra_args: list[str] | None = None
) -> FakeKube:
    """Replica 1 of a deployment of 2 replicas of ``size`` members, with ``pods``."""
    md = model_deployment(MD, namespace=NS, replicas=2, size=size, extra_args=extra_args)
    return cluster(*pods, md=md)


def pod_of_1(name: str, i: int, member: int | None = None, **kw: Any) -> dict[str, Any]:
    """A member Pod of replica 1 (a fresh UID and address per ``i``)."""
    kw.setdefault("uid", f"uid-{name}")
    kw.setdefault("ip", f"198.18.1.{20 + i}")
    return member_pod(name, deployment=MD, ordinal=1, member=member, **kw)


def never_started(name: str, i: int, member: int | None = None, **kw: Any) -> dict[str, Any]:
    """A Pod whose engine never started: Pending (no container ID, not Ready, no address,
    never labelled)."""
    pod = pod_of_1(name, i, member, container_id=None, ready="False", eligible=False, **kw)
    del pod["status"]["podIP"]
    return pod


def shed(kube: FakeKube, *members: str) -> Admission:
    return admit(kube, intent=IntentKind.SURPLUS_SHED, members=list(members))


def disqualified_drain(kube: FakeKube, target: Target, *, seconds: float = 3.0) -> Observation:
    """Disqualify, then drain (10 ms polls) until ``seconds`` from now, as the workflow
    runs them."""

    def phase(seconds: float) -> PhaseInput:
        deadline = datetime.now(UTC) + timedelta(seconds=seconds)
        return PhaseInput(target=target, deadline=deadline, poll_interval_s=0.01)

    acts = RetirementActivities(kube)
    dq: Observation = attempt_env().run(acts.disqualify, phase(seconds))
    assert dq.verdict is Verdict.VERIFIED, dq.reason
    kube.calls.clear()
    obs: Observation = attempt_env().run(acts.drain, phase(seconds))
    return obs


def test_an_unlabelled_surplus_member_is_drained_not_held() -> None:
    """The bug of issue 9: an unlabelled surplus member was bound with no measured member,
    so its drain read "no member to measure" until the budget, then aborted and held."""
    kube = surplus_group(replica(0), pod_of_1("llm-1-a", 0), pod_of_1("llm-1-b", 1, eligible=False))
    admission = shed(kube, "llm-1-b")
    t = admission.target
    assert t is not None, admission.refusal
    kube.script_exec("llm-1-b", ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0))
    obs = disqualified_drain(kube, t)
    assert (obs.verdict, obs.reason) == (
        Verdict.VERIFIED,
        "idle on two consecutive complete reads, counters unchanged",
    )
    assert {c.args["name"] for c in kube.called("exec_pod")} == {"llm-1-b"}
    assert t.measured == ("llm-1-b",)
    assert t.members[0].container_id == "containerd://main-1"


def test_a_busy_unlabelled_surplus_member_is_not_drained() -> None:
    """The safety path stays whole: a surplus member still working reads busy, never idle."""
    kube = surplus_group(replica(0), pod_of_1("llm-1-a", 0), pod_of_1("llm-1-b", 1, eligible=False))
    t = shed(kube, "llm-1-b").target
    assert t is not None
    kube.script_exec("llm-1-b", ExecResult(stdout=oneshot_stdout(in_flight=2), exit_code=0))
    obs = disqualified_drain(kube, t, seconds=0.3)
    assert obs.verdict is Verdict.UNKNOWN and obs.reason == "llm-1-b: 2 in flight"


def test_a_surplus_member_that_never_started_is_retired_without_a_drain_read() -> None:
    """SPEC section 3 for one member: nothing ever ran in it, so nothing is in flight; it is
    bound with no container ID and its drain says so, with no exec tried."""
    kube = surplus_group(replica(0), pod_of_1("llm-1-a", 0), never_started("llm-1-b", 1))
    admission = shed(kube, "llm-1-b")
    t = admission.target
    assert t is not None, admission.refusal
    [m] = t.members
    assert (m.pod, m.container_id, m.ip, m.measured) == ("llm-1-b", "", "", True)
    obs = disqualified_drain(kube, t)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert obs.readings["llm-1-b"].endswith("(never started: nothing to drain)")
    assert kube.called("exec_pod") == []


def test_a_never_started_surplus_member_that_starts_meanwhile_fails_the_drain() -> None:
    kube = surplus_group(replica(0), pod_of_1("llm-1-a", 0), never_started("llm-1-b", 1))
    t = shed(kube, "llm-1-b").target
    assert t is not None
    kube.add_pod(pod_of_1("llm-1-b", 1, eligible=False, container_id="containerd://late"))
    obs = disqualified_drain(kube, t)
    assert obs.verdict is Verdict.FAILED and "started since admission" in obs.reason


def test_a_ready_surplus_member_without_a_container_id_is_not_read_as_never_started() -> None:
    """Ready without a container ID is an inconsistency, not proof that nothing runs."""
    kube = surplus_group(
        replica(0), pod_of_1("llm-1-a", 0), pod_of_1("llm-1-b", 1, container_id=None)
    )
    admission = shed(kube, "llm-1-b")
    assert admission.target is None
    assert "container main of llm-1-b has no container ID (not started)" in admission.refusal
    assert_read_only(kube)


def test_a_surplus_group_measures_its_leader_only() -> None:
    """A duplicated leader-served group: the duplicate leader answers, its follower does
    not (the delete binding stays whole)."""
    kube = surplus_group(
        pod_of_1("llm-1-a0", 0, 0),
        pod_of_1("llm-1-a1", 1, 1),
        pod_of_1("llm-1-b0", 2, 0, eligible=False),
        pod_of_1("llm-1-b1", 3, 1, eligible=False),
        size=2,
    )
    admission = shed(kube, "llm-1-b0", "llm-1-b1")
    t = admission.target
    assert t is not None, admission.refusal
    assert t.shape == "LeaderServed"
    assert t.measured == ("llm-1-b0",)
    assert t.uids == ["uid-llm-1-b0", "uid-llm-1-b1"]


def test_a_surplus_rank_of_an_external_dp_replica_is_measured() -> None:
    """Every rank of an External-DP replica serves, a rank beyond the size as well."""
    kube = surplus_group(
        pod_of_1("llm-1-a0", 0, 0),
        pod_of_1("llm-1-a1", 1, 1),
        pod_of_1("llm-1-a2", 2, 2, eligible=False),
        size=2,
        extra_args=["--data-parallel-external-lb"],
    )
    admission = shed(kube, "llm-1-a2")
    t = admission.target
    assert t is not None, admission.refusal
    assert (t.shape, t.measured) == ("ExternalDP", ("llm-1-a2",))


def test_a_started_surplus_follower_alone_is_refused() -> None:
    """A follower answers through a leader; with no surplus leader that started, it may be
    working for the kept leader, which goes on serving: nothing can be read to show that it
    stopped.  Refused (nothing touched), not admitted to hold."""
    kube = surplus_group(
        pod_of_1("llm-1-a0", 0, 0),
        pod_of_1("llm-1-a1", 1, 1),
        pod_of_1("llm-1-b1", 2, 1, eligible=False),
        size=2,
    )
    assert_refused(
        kube,
        shed(kube, "llm-1-b1"),
        "surplus member llm-1-b1 does not answer for the replica (shape LeaderServed: only "
        "the leader, member-index 0, answers) and no surplus member that answers has "
        "started: no read can show that it stopped working for the replica's leader",
    )


def test_a_surplus_follower_that_never_started_is_retired() -> None:
    kube = surplus_group(
        pod_of_1("llm-1-a0", 0, 0),
        pod_of_1("llm-1-a1", 1, 1),
        never_started("llm-1-b1", 2, 1),
        size=2,
    )
    admission = shed(kube, "llm-1-b1")
    t = admission.target
    assert t is not None, admission.refusal
    assert t.measured == ("llm-1-b1",) and t.members[0].container_id == ""
    obs = disqualified_drain(kube, t)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert "never started: nothing to drain" in obs.readings["llm-1-b1"]


def test_a_started_surplus_member_whose_leadership_cannot_be_decided_is_refused() -> None:
    kube = surplus_group(
        pod_of_1("llm-1-a0", 0, 0),
        pod_of_1("llm-1-a1", 1, 1),
        pod_of_1("llm-1-x", 2, None, eligible=False),
        size=2,
    )
    assert_refused(
        kube,
        shed(kube, "llm-1-x"),
        "surplus member llm-1-x has no valid modeldeployment.gpustack.ai/member-index "
        "label: whether it leads the replica cannot be decided",
    )


def test_an_aborted_surplus_shed_does_not_put_an_unlabelled_member_in_service() -> None:
    """The restore puts back what served: a surplus member without the label at admission
    is measured, but the abort does not add it to routing (the watcher never labels a
    surplus member either)."""
    kube = surplus_group(replica(0), pod_of_1("llm-1-a", 0), pod_of_1("llm-1-b", 1, eligible=False))
    t = shed(kube, "llm-1-b").target
    assert t is not None and t.measured == ("llm-1-b",)
    kube.calls.clear()
    inp = PhaseInput(target=t, deadline=datetime.now(UTC) + timedelta(seconds=2))
    result: RestoreResult = attempt_env().run(RetirementActivities(kube).restore, inp)
    assert result == RestoreResult()
    assert LABEL_ELIGIBLE not in kube.pod_labels("llm-1-b")
    assert_read_only(kube)


# ---------------------------------------------------------------- declared and rendered wiring
#
# The gpustack operator renders a role's extraArgs into every member's ``main`` command line
# ("vllm serve <model> <extraArgs> --host … --port …"), its env into the container's env, and
# the replica size into GPUSTACK_REPLICA_SIZE.  Admission reads both sides with one reader;
# where they disagree about the wiring, the shape cannot be decided and it refuses, naming both.

GPUSTACK_VLLM = ["vllm", "serve", "/models"]
BIND = ["--host", "0.0.0.0", "--port", "8000"]


def running(
    pod: dict[str, Any],
    command: list[str],
    *,
    args: list[str] | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``pod`` with its ``main`` container running ``command`` (and ``args``, ``env``)."""
    main = pod["spec"]["containers"][0]
    main["command"] = command
    if args is not None:
        main["args"] = args
    if env is not None:
        main["env"] = env
    return pod


def rendered_env(size: int, *extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The env the operator renders into a member above size one."""
    return [
        *extra,
        {"name": "GPUSTACK_REPLICA_LEADER_ADDRESS", "value": "llm-server-r1-m0.llm-server-r1"},
        {"name": "GPUSTACK_REPLICA_SIZE", "value": str(size)},
        {
            "name": "GPUSTACK_MEMBER_INDEX",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['member-index']"}},
        },
    ]


def external_dp(*, declared: list[str], ran: list[list[str]], env: Any = None) -> FakeKube:
    """Replica 1 of 2 two-member replicas declared with ``declared``, member ``i`` running
    the operator's command line with ``ran[i]``."""
    md = model_deployment(MD, namespace=NS, replicas=1, size=2, extra_args=declared)
    if env is not None:
        md["spec"]["roles"][0]["env"] = env
    pods = [
        running(
            pod_of_1(f"llm-1-{i}", i, i),
            [*GPUSTACK_VLLM, *args, *BIND],
            env=rendered_env(2, *(env or [])),
        )
        for i, args in enumerate(ran)
    ]
    return cluster(*pods, md=md)


EXTERNAL = ["--data-parallel-size", "2", "--data-parallel-rank", "$(GPUSTACK_MEMBER_INDEX)"]


def test_admit_reads_the_rendered_command_line_in_any_spelling_the_engine_accepts() -> None:
    kube = external_dp(
        declared=EXTERNAL,
        ran=[["-dp=2", "-dpn", "$(GPUSTACK_MEMBER_INDEX)"]] * 2,
    )
    admission = admit(kube)
    t = admission.target
    assert t is not None, admission.refusal
    assert (t.shape, t.measured) == ("ExternalDP", ("llm-1-0", "llm-1-1"))
    assert_read_only(kube)


def test_admit_refuses_a_pod_that_runs_another_wiring_than_declared() -> None:
    """The role now declares an External-DP group; the Pods still run a leader-served one
    (built from an earlier spec): which members answer cannot be decided."""
    kube = external_dp(declared=EXTERNAL, ran=[["--data-parallel-size", "4"]] * 2)
    assert_refused(
        kube,
        admit(kube),
        "role server declares one wiring and Pod llm-1-0 runs another: "
        "--data-parallel-size '2' (declared) against '4' (running); "
        "--data-parallel-rank '$(GPUSTACK_MEMBER_INDEX)' (declared) against (unset) (running); "
        "which shape the replica has cannot be decided",
    )


def test_admit_refuses_a_pod_whose_environment_wires_another_data_parallel_size() -> None:
    kube = external_dp(
        declared=[],
        ran=[[], []],
        env=[{"name": "VLLM_DP_SIZE", "value": "1"}],
    )
    kube.pods[(NS, "llm-1-1")]["spec"]["containers"][0]["env"].append(
        {"name": "VLLM_DP_SIZE", "value": "2"}
    )
    admission = admit(kube)
    assert admission.target is None
    assert admission.refusal == (
        "role server declares one wiring and Pod llm-1-1 runs another: "
        "VLLM_DP_SIZE '1' (declared) against '2' (running); "
        "which shape the replica has cannot be decided"
    )


def test_admit_refuses_a_pod_rendered_for_another_size() -> None:
    kube = external_dp(declared=EXTERNAL, ran=[EXTERNAL, EXTERNAL])
    env = kube.pods[(NS, "llm-1-0")]["spec"]["containers"][0]["env"]
    next(e for e in env if e["name"] == "GPUSTACK_REPLICA_SIZE")["value"] = "3"
    assert_refused(
        kube,
        admit(kube),
        "role server declares size 2 and Pod llm-1-0 was rendered for size '3' "
        "(GPUSTACK_REPLICA_SIZE): which shape the replica has cannot be decided",
    )


def test_admit_refuses_a_pod_whose_command_line_cannot_be_read() -> None:
    kube = external_dp(declared=EXTERNAL, ran=[[*EXTERNAL, "-dp2"], EXTERNAL])
    admission = admit(kube)
    assert admission.target is None
    assert admission.refusal.startswith("the command line Pod llm-1-0 runs cannot be read: ")
    assert "'-dp2': vLLM refuses a value glued to -dp" in admission.refusal


def test_admit_refuses_a_pod_that_runs_a_shell_for_a_managed_role() -> None:
    kube = external_dp(declared=EXTERNAL, ran=[EXTERNAL, EXTERNAL])
    kube.pods[(NS, "llm-1-1")]["spec"]["containers"][0]["command"] = ["bash", "-c", "vllm serve"]
    admission = admit(kube)
    assert admission.target is None
    assert admission.refusal == (
        "role server declares one wiring and Pod llm-1-1 runs another: the command line is "
        "vLLM's own (declared) against 'bash -c vllm serve' (running); "
        "which shape the replica has cannot be decided"
    )


def test_a_declared_shape_the_engine_refuses_is_refused_before_the_pods_are_compared() -> None:
    kube = external_dp(declared=["--data-parallel-external-lb=true"], ran=[[], []])
    admission = admit(kube)
    assert admission.target is None
    assert admission.refusal.startswith("shape Undecidable: the command line cannot be read: ")


def departed(*pods: dict[str, Any]) -> FakeKube:
    """Role ``old`` is gone from the spec; ``pods`` are its replica 0."""
    return cluster(*pods, md=model_deployment(MD, namespace=NS, role_name="other"))


def old_member(i: int, command: list[str], **kw: Any) -> dict[str, Any]:
    pod = member_pod(
        f"llm-old-{i}",
        deployment=MD,
        role="old",
        ordinal=0,
        member=i,
        uid=f"uid-old-{i}",
        ip=f"198.18.1.{30 + i}",
    )
    return running(pod, command, **kw)


def admit_departed(kube: FakeKube) -> Admission:
    return admit(kube, intent=IntentKind.DEPARTED_ROLE, role_name="old", ordinal=0)


def test_a_departed_role_reads_its_shape_from_the_rendered_command() -> None:
    """gpustack renders the engine's whole command line into ``command`` (no ``args``): an
    External-DP replica of a departed role measures every rank, not only the leader."""
    kube = departed(*(old_member(i, [*GPUSTACK_VLLM, "-dp", "2", "-dpe", *BIND]) for i in range(2)))
    admission = admit_departed(kube)
    t = admission.target
    assert t is not None, admission.refusal
    assert (t.shape, t.measured) == ("ExternalDP", ("llm-old-0", "llm-old-1"))


def test_a_departed_role_whose_members_run_different_wirings_is_refused() -> None:
    kube = departed(
        old_member(0, [*GPUSTACK_VLLM, "-dp", "2", "-dpe"]),
        old_member(1, [*GPUSTACK_VLLM, "-dp", "2"]),
    )
    assert_refused(
        kube,
        admit_departed(kube),
        "members llm-old-0 and llm-old-1 of departed role run different wirings: "
        "--data-parallel-external-lb 'true' (llm-old-0) against 'false' (llm-old-1); "
        "which shape the replica has cannot be decided",
    )


def test_a_departed_role_whose_pod_runs_a_shell_is_unmanaged() -> None:
    kube = departed(old_member(0, ["sh", "-c", "exec vllm serve /models -dpe"]))
    admission = admit_departed(kube)
    assert admission.target is None
    assert admission.refusal == (
        "shape Unmanaged: the Pod's main container runs 'sh -c exec vllm serve /models -dpe', "
        "not vLLM's own command line; its shape cannot be read"
    )
