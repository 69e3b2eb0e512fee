"""The fault campaign's judge: each invariant catches the violation it exists for, and the
audit log reader reads the API server's own event format."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from chaos import audit, campaign
from chaos.oracle import (
    HISTORY_BOUND,
    WAIT_BOUND_S,
    ClientFailure,
    Fault,
    Journal,
    Rest,
    Settled,
    admitted_delete,
    attributed,
    bounded,
    converged,
    cut_after_delete,
    in_flight_at_delete,
    judge,
)
from chaos.schedule import draw
from retirement.names import GROUP, LABEL_COMPONENT, LABEL_INSTANCE, LABEL_ORDINAL

T = 1_800_000_000.0  # the delete's time in these cases
UID = "0f1e2d3c-aaaa-bbbb-cccc-000000000001"


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def delete_event(
    t: float = T,
    *,
    agent: str = "retire-worker/0.1.0",
    precondition: str | None = UID,
    code: int = 200,
    ordinal: str = "1",
    started: bool = True,
) -> str:
    """A Pod DELETE as the API server records it at RequestResponse level (``started``:
    its status shows the container the kubelet created, and Ready; else it is Pending with
    neither)."""
    status: dict[str, Any] = (
        {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "main", "containerID": "containerd://0123"}],
        }
        if started
        else {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
    )
    ev: dict[str, Any] = {
        "kind": "Event",
        "level": "RequestResponse",
        "stage": "ResponseComplete",
        "verb": "delete",
        "userAgent": agent,
        "objectRef": {"resource": "pods", "namespace": "chaos", "name": "c00-server-1"},
        "responseStatus": {"metadata": {}, "code": code},
        "requestObject": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/__internal"},
        "responseObject": {
            "kind": "Pod",
            "metadata": {
                "name": "c00-server-1",
                "uid": UID,
                "labels": {
                    LABEL_INSTANCE: "c00",
                    LABEL_COMPONENT: "server",
                    LABEL_ORDINAL: ordinal,
                },
            },
            "status": status,
        }
        if code == 200
        else {"kind": "Status", "code": code},
        "requestReceivedTimestamp": stamp(t),
        "stageTimestamp": stamp(t + 0.01),
    }
    if precondition is not None:
        ev["requestObject"]["preconditions"] = {"uid": precondition}
    return json.dumps(ev)


def spec_event(t: float, replicas: int | None, verb: str = "patch") -> str:
    obj = {"kind": "ModelDeployment", "spec": {"roles": [{"name": "server", "replicas": replicas}]}}
    return json.dumps(
        {
            "stage": "ResponseComplete",
            "verb": "delete" if replicas is None else verb,
            "objectRef": {
                "resource": "modeldeployments",
                "namespace": "chaos",
                "name": "c00",
                "apiGroup": GROUP,
            },
            "responseStatus": {"code": 200},
            "responseObject": obj,
            "requestReceivedTimestamp": stamp(t),
        }
    )


def one_delete(*lines: str) -> audit.PodDelete:
    (d,) = audit.read(lines).deletes
    return d


# ---------------------------------------------------------------- the audit log


def test_a_delete_is_read_with_its_uid_labels_agent_and_precondition() -> None:
    d = one_delete(delete_event())
    assert (d.namespace, d.name, d.uid, d.deployment, d.role, d.ordinal) == (
        "chaos",
        "c00-server-1",
        UID,
        "c00",
        "server",
        1,
    )
    assert d.by_worker and d.precondition_uid == UID
    assert d.at == pytest.approx(T, abs=1e-3)
    assert d.hub_name == "c00-server-1.0f1e2d3c"


def test_refused_deletes_other_stages_and_garbage_are_not_deletes() -> None:
    received = json.loads(delete_event())
    received["stage"] = "RequestReceived"
    a = audit.read([delete_event(code=409), json.dumps(received), "not json", "", '{"no": "ref"}'])
    assert a.deletes == [] and a.refused_deletes == 1 and a.unreadable == 2


def test_the_spec_declared_at_a_time_is_the_last_write_before_it() -> None:
    a = audit.read([spec_event(T - 10, 3, "create"), spec_event(T - 5, 2), spec_event(T + 1, 1)])
    assert a.declared("chaos", "c00", T - 20) is None
    assert a.declared("chaos", "c00", T - 6) == {"server": 3}
    assert a.declared("chaos", "c00", T) == {"server": 2}
    assert audit.read([spec_event(T - 1, None)]).declared("chaos", "c00", T) is None


# ---------------------------------------------------------------- 1: in flight


def test_a_request_in_flight_at_the_delete_breaks_invariant_one() -> None:
    d = one_delete(delete_event())
    assert in_flight_at_delete(d, Journal([(T - 3, T + 0.5, False)]), window_s=1) is not None
    assert in_flight_at_delete(d, Journal([], open=[T - 2]), window_s=1) is not None


def test_a_request_admitted_inside_the_window_breaks_it_too() -> None:
    d = one_delete(delete_event())
    v = in_flight_at_delete(d, Journal([(T - 0.6, T - 0.1, True)]), window_s=1)
    assert v is not None and "last sent a request" in v.evidence


def test_requests_done_before_the_window_and_after_the_delete_are_fine() -> None:
    d = one_delete(delete_event())
    journal = Journal([(T - 9, T - 2, True), (T + 1, T + 2, False)], open=[T + 3])
    assert in_flight_at_delete(d, journal, window_s=1) is None


def test_a_delete_without_a_journal_cannot_pass() -> None:
    v = in_flight_at_delete(one_delete(delete_event()), None, window_s=1)
    assert v is not None and "no engine journal" in v.evidence
    assert cut_after_delete(one_delete(delete_event()), None) is not None


def test_a_pod_that_never_started_has_no_engine_and_nothing_in_flight() -> None:
    """The server's record of the deleted Pod (no container, never Ready) is the witness
    that no engine ran in it: no journal is expected (the hub starts an engine only for a
    Ready Pod)."""
    d = one_delete(delete_event(started=False))
    assert not d.started and one_delete(delete_event()).started
    assert in_flight_at_delete(d, None, window_s=1) is None
    assert cut_after_delete(d, None) is None


def test_a_graceful_delete_is_judged_at_the_engines_end_not_at_the_call() -> None:
    """The preStop baseline gives the Pod its grace: a request in flight at the call that
    then finishes is fine; one cut after the call (SIGTERM, SIGKILL) breaks invariant 1."""
    d = one_delete(delete_event())
    finished = Journal([(T - 2, T + 3, True), (T - 9, T - 8, False)])
    assert cut_after_delete(d, finished) is None
    cut = cut_after_delete(d, Journal([(T - 2, T + 5.2, False)]))
    assert cut is not None and "1 request(s) cut" in cut.evidence and "5.2 s" in cut.evidence
    assert cut_after_delete(d, Journal([], open=[T - 1])) is not None
    assert cut_after_delete(d, None) is not None
    a = audit.read([spec_event(T - 5, 1), delete_event(agent="prestop-scaledown/1")])
    v = judge(
        audit=a,
        journals={"c00-server-1.0f1e2d3c": Journal([(T - 1, T + 4, False)])},
        admitted_uids={UID},
        faults=[],
        failures=[],
        settled=[],
        agent="prestop-scaledown/",
        graceful=True,
    )
    assert [x.invariant for x in v.violations] == ["in-flight"]


# ---------------------------------------------------------------- 2: admitted


def test_a_delete_without_the_uid_precondition_breaks_invariant_two() -> None:
    a = audit.read([spec_event(T - 5, 1), delete_event(precondition=None)])
    v = admitted_delete(a.deletes[0], a, {UID})
    assert v is not None and "precondition" in v.evidence


def test_a_delete_of_a_pod_no_retirement_admitted_breaks_it() -> None:
    a = audit.read([spec_event(T - 5, 1), delete_event()])
    assert admitted_delete(a.deletes[0], a, {"another"}) is not None


def test_a_delete_of_a_declared_ordinal_breaks_it() -> None:
    a = audit.read([spec_event(T - 5, 2), delete_event()])
    v = admitted_delete(a.deletes[0], a, {UID})
    assert v is not None and "replicas=2" in v.evidence


def test_a_delete_after_the_scale_down_is_admitted() -> None:
    a = audit.read([spec_event(T - 9, 2), spec_event(T - 5, 1), delete_event()])
    assert admitted_delete(a.deletes[0], a, {UID}) is None


# ---------------------------------------------------------------- 3 and 4


def test_a_client_failure_needs_a_fault_on_its_own_path() -> None:
    fail = ClientFailure("c00", T, T + 1, "stream cut")
    assert attributed(fail, []) is not None
    assert attributed(fail, [Fault("kill-router", T - 30, T - 20, "c01")]) is not None
    assert attributed(fail, [Fault("kill-router", T - 5, T - 2, "c00")]) is None
    assert attributed(fail, [Fault("kill-router", T - 3, T + 3, "*")]) is None
    assert attributed(fail, [Fault("stall-router", T - 5, T - 2, "c00")]) is None
    assert attributed(fail, [Fault("stall-router", T - 5, T - 2, "c01")]) is not None
    assert attributed(fail, [Fault("engine-silent", T - 5, T - 2, "c00")]) is None
    assert attributed(fail, [Fault("unlabel", T - 5, T - 2, "c00")]) is None
    # The deployment deleted and re-created (its router went with its Pod).
    assert attributed(fail, [Fault("recreate", T - 5, T - 2, "c00")]) is None
    assert attributed(fail, [Fault("recreate", T - 5, T - 2, "c01")]) is not None
    # Off the request's path: these must cost no request, so they excuse none.
    for kind in ("stall-apiserver", "kill-worker", "pause-worker", "kill-watcher", "relabel"):
        assert attributed(fail, [Fault(kind, T - 3, T + 3, "*")]) is not None
        assert attributed(fail, [Fault(kind, T - 3, T + 3, "c00")]) is not None
    assert attributed(fail, [Fault("kill-router", T - 60, T - 40, "c00")]) is not None


def test_convergence_needs_declared_present_eligible_and_nothing_running() -> None:
    assert converged(Settled("c00", 2, 2, 2, 0)) is None
    missing = converged(Settled("c00", 0, 0, 0, 0, missing=True))
    assert missing is not None and "missing" in missing.evidence
    assert converged(Settled("c00", 1, 2, 2, 0)) is not None
    assert converged(Settled("c00", 2, 2, 1, 0)) is not None
    assert converged(Settled("c00", 2, 2, 2, 1)) is not None


def test_judge_checks_only_the_workers_deletes_and_collects_every_violation() -> None:
    a = audit.read(
        [
            spec_event(T - 5, 2),
            delete_event(),  # the worker, an ordinal still declared, a request in flight
            delete_event(T + 5, agent="kwok/v0.7"),  # not the product's: not judged
        ]
    )
    v = judge(
        audit=a,
        journals={"c00-server-1.0f1e2d3c": Journal([(T - 1, T + 1, False)])},
        admitted_uids={UID},
        faults=[],
        failures=[ClientFailure("c00", T, T + 1, "HTTP 502")],
        settled=[Settled("c00", 2, 2, 2, 0)],
    )
    assert v.checked == {
        "evidence": 1,
        "in-flight": 1,
        "admitted": 1,
        "attributed": 1,
        "converged": 1,
        "bounded": 0,
    }
    assert sorted(x.invariant for x in v.violations) == ["admitted", "attributed", "in-flight"]
    assert not v.ok


# ---------------------------------------------------------------- 5: bounded


def rest(*phases: tuple[str, float], history: int = 40, closed: float | None = None) -> Rest:
    return Rest("retirement/chaos/c00 run", list(phases), history, closed)


def test_a_retirement_must_come_to_rest_within_the_bound_after_the_faults() -> None:
    over = T
    quick = rest(("Admitted", T - 50), ("Withdrawing", T - 40), ("Completed", T + 20))
    assert bounded(quick, faults_over=over, ended=T + 900) == []
    slow = rest(("Admitted", T - 50), ("Draining", T - 40), ("Completed", T + WAIT_BOUND_S + 5))
    assert "came to rest" in bounded(slow, faults_over=over, ended=T + 900)[0].evidence
    stuck = rest(("Admitted", T - 50), ("Withdrawing", T - 40))
    assert "not at rest" in bounded(stuck, faults_over=over, ended=T + 900)[0].evidence
    assert bounded(stuck, faults_over=over, ended=T + 60) == []


def test_a_hold_is_rest_and_an_ended_run_is_at_rest_whatever_its_phase() -> None:
    """Held (Aborted) before the faults ended and retried later by a person: it waited
    for the person, not for the product.  A run that closed (refused, capacity retained)
    is at rest from its close."""
    held = rest(("Admitted", T - 50), ("Aborted", T - 10), ("Admitted", T + 400))
    assert bounded(held, faults_over=T, ended=T + 900) == []
    closed = rest(("Admitted", T - 50), ("Withdrawing", T - 40), closed=T + 12)
    assert bounded(closed, faults_over=T, ended=T + 900) == []
    late = rest(("Admitted", T - 50), ("Withdrawing", T - 40), closed=T + WAIT_BOUND_S + 1)
    assert len(bounded(late, faults_over=T, ended=T + 900)) == 1


def test_a_history_past_the_bound_breaks_invariant_five() -> None:
    done = rest(("Admitted", T), ("Completed", T + 5), history=HISTORY_BOUND + 1)
    v = bounded(done, faults_over=T, ended=T + 10)
    assert [x.invariant for x in v] == ["bounded"] and "history events" in v[0].evidence


# ---------------------------------------------------------------- the plan


def test_a_plan_is_the_same_for_the_same_seed_and_keeps_replicas_in_bounds() -> None:
    one, two = draw(seed=7, seconds=600, deployments=6), draw(seed=7, seconds=600, deployments=6)
    assert one == two and one != draw(seed=8, seconds=600, deployments=6)
    replicas = {d.name: 2 for d in one.deployments}
    for a in one.actions:
        if a.kind == "scale":
            assert abs(a.value - replicas[a.target]) == 1
            replicas[a.target] = int(a.value)
            assert 1 <= a.value <= 3
    assert {a.kind for a in one.actions} >= {"scale", "kill-worker", "kill-watcher", "relabel"}
    with pytest.raises(ValueError):
        draw(seed=1, seconds=0, deployments=3)


def test_a_replica_held_by_the_routerless_hold_policy_counts_as_converged() -> None:
    # declared 1, the held replica kept and serving: 2 Pods, both eligible, one run held
    assert converged(Settled("c03", 1, 2, 2, 1, held_by_policy=1)) is None
    assert converged(Settled("c03", 1, 2, 1, 1, held_by_policy=1)) is not None  # not serving
    assert converged(Settled("c03", 1, 2, 2, 2, held_by_policy=1)) is not None  # another runs


def spec_stored(received: float, stored: float, replicas: int) -> str:
    ev = json.loads(spec_event(received, replicas))
    ev["stageTimestamp"] = stamp(stored)
    return json.dumps(ev)


def test_a_spec_write_counts_from_when_it_was_stored() -> None:
    a = audit.read([spec_event(T - 9, 1), spec_stored(T - 0.2, T + 0.1, 2)])
    assert a.declared("chaos", "c00", T) == {"server": 1}  # received before, stored after


def test_a_scale_up_stored_just_before_the_delete_is_a_race_not_a_violation() -> None:
    a = audit.read([spec_event(T - 9, 1), spec_stored(T - 0.4, T - 0.3, 2), delete_event()])
    v = judge(
        audit=a,
        journals={"c00-server-1.0f1e2d3c": Journal([(T - 5, T - 3, True)])},
        admitted_uids={UID},
        faults=[],
        failures=[],
        settled=[],
    )
    assert v.ok and [r.invariant for r in v.races] == ["race"]
    late = audit.read([spec_event(T - 9, 1), spec_stored(T - 3, T - 2, 2), delete_event()])
    assert admitted_delete(late.deletes[0], late, {UID}) is not None  # 2 s: the product's miss


def test_the_evidence_must_be_there() -> None:
    a = audit.read([spec_event(T - 9, 2, "create")])
    v = judge(
        audit=a,
        journals={},
        admitted_uids=set(),
        faults=[],
        failures=[],
        settled=[],
        deployments=["c00", "c01"],
        completed=3,
        unreadable=["retirement/chaos/c00"],
    )
    assert sorted(x.subject for x in v.failed("evidence")) == [
        "*",
        "c01",
        "retirement/chaos/c00",
    ]


def test_a_leader_served_group_converges_with_its_leaders_eligible_only() -> None:
    """Two replicas of two members: four Pods, the two leaders serving."""
    assert converged(Settled("c04", 4, 4, 2, 0, serving=2)) is None
    assert converged(Settled("c04", 4, 4, 4, 0, serving=2)) is not None
    assert converged(Settled("c04", 4, 4, 1, 0, serving=2)) is not None


def test_the_plan_puts_groups_of_both_shapes_after_the_first_four() -> None:
    plan = draw(seed=3, seconds=60, deployments=12)
    shapes = {d.name: (d.size, d.serving_members) for d in plan.deployments}
    assert all(shapes[f"c{i:02d}"] == (1, 1) for i in range(4))
    assert shapes["c04"] == (2, 1) and shapes["c05"] == (2, 2)
    assert {d.router for d in plan.deployments} >= {"vllm-router-0.1.15", None}


def test_routed_deployments_are_deleted_and_recreated_too() -> None:
    plan = draw(seed=3, seconds=24 * 60, deployments=12, pace=2)  # `make chaos`'s plan
    routed = {d.name for d in plan.deployments if d.router}
    assert {a.target for a in plan.actions if a.kind == "recreate"} & routed


@pytest.mark.parametrize(
    ("program", "body", "expected"),
    [
        ("vllm-router", {"urls": ["http://198.19.0.5:8000"]}, {"198.19.0.5"}),
        (
            "smg",
            {"workers": [{"url": "http://198.19.0.6:8000", "status": "ready"}]},
            {"198.19.0.6"},
        ),
        ("sglang-router", {"workers": []}, set()),
        ("sglang-router", "not a listing", set()),
    ],
)
def test_the_addresses_a_router_lists(
    monkeypatch: pytest.MonkeyPatch, program: str, body: object, expected: set[str]
) -> None:
    """What a Pod deleted by hand waits on: its address gone from its router's list."""
    monkeypatch.setattr(campaign.jsonhttp, "call", lambda *_a, **_k: body)
    assert campaign.addresses("http://r", program) == expected


def test_an_unreadable_router_lists_nothing_known(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*_a: object, **_k: object) -> None:
        raise OSError("refused")

    monkeypatch.setattr(campaign.jsonhttp, "call", down)
    assert campaign.addresses("http://r", "smg") is None


@pytest.mark.parametrize(
    ("program", "body", "expected"),
    [
        ("smg", {"workers": [{"url": "http://a:1", "status": "pending"}]}, False),
        ("smg", {"workers": [{"url": "http://a:1", "status": "ready"}]}, True),
        ("sglang-router", {"workers": [{"url": "http://a:1"}]}, True),
        ("vllm-router", {"urls": ["http://a:1"]}, True),
        ("vllm-router", {"urls": []}, False),
        ("smg", "not a listing", False),
    ],
)
def test_a_router_routes_when_it_lists_a_ready_worker(
    monkeypatch: pytest.MonkeyPatch, program: str, body: object, expected: bool
) -> None:
    monkeypatch.setattr(campaign.jsonhttp, "call", lambda *_a, **_k: body)
    assert campaign.routes("http://r", program) is expected
