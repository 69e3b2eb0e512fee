"""The activities at the edges of time, against the fake Kubernetes layer and a router
answered offline (SPEC sections 4, 6 and 7):

- the delete's last guard, run immediately before its first delete: the world changed
  after the drain's last round (the label put back, the spec scaling up again, a router
  selecting the victim again, the deployment re-created, the evidence gone stale), and
  nothing is deleted;
- withdrawal asks a router to remove a worker only for an address a live, unlabelled
  member holds now (a deleted member's address may be another Pod's), re-reading the
  label right before the removal;
- an attempt that may have lost its claim (no heartbeat for longer than the server
  allows, or its timeout passed) changes nothing: no label patch, router call or delete.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from activities import RetirementActivities, fencing
from activities.fencing import ClaimLost
from kube.objects import Service
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
from retirement.names import LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ROUTER
from retirement.phases import Verdict
from retirement.protocol import freshness_bound
from tests.helpers import model_deployment
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod

NS, MD = "default", "llm"
VICTIM_IP, OTHER_IP = "198.18.1.21", "198.18.1.9"
VICTIM_URL, OTHER_URL = f"http://{VICTIM_IP}:8000", f"http://{OTHER_IP}:8000"
ROUTER = "sglang-gateway"


def workers(*urls: str) -> dict[str, Any]:
    """The SGLang gateway's ``GET /workers`` answer."""
    return {
        "workers": [
            {"id": f"w-{i}", "url": u, "model_id": "m", "is_healthy": True, "load": 0}
            for i, u in enumerate(urls)
        ]
    }


class Gateway:
    """A router answered offline: it selects ``selected``; every request is logged."""

    def __init__(self, *selected: str) -> None:
        self.selected = list(selected)
        self.log: list[tuple[str, str]] = []
        self.transport = httpx.MockTransport(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        self.log.append((request.method, request.url.path))
        if request.method == "GET":
            return httpx.Response(200, json=workers(*self.selected))
        return httpx.Response(202, json={"status": "accepted"})

    @property
    def removals(self) -> list[tuple[str, str]]:
        return [x for x in self.log if x[0] == "DELETE"]


def router_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "router-0",
            "namespace": NS,
            "uid": "uid-router",
            "labels": {LABEL_INSTANCE: MD, LABEL_ROUTER: ROUTER},
        },
        "spec": {
            "containers": [{"name": "router", "ports": [{"name": "http", "containerPort": 30000}]}]
        },
        "status": {"podIP": "198.18.1.2"},
    }


def victim(**kw: Any) -> dict[str, Any]:
    kw.setdefault("uid", "uid-victim")
    kw.setdefault("ip", VICTIM_IP)
    return member_pod("llm-1-0", deployment=MD, ordinal=1, **kw)


def disqualified(kube: FakeKube | None = None) -> tuple[FakeKube, Target]:
    """Replica 1 of ``llm`` (behind the SGLang gateway, scaled to 1) admitted and
    disqualified; replica 0 keeps serving."""
    kube = kube or FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, router=ROUTER, uid="md-uid"))
    kube.add_pod(member_pod("llm-0-0", deployment=MD, ordinal=0, uid="keep", ip=OTHER_IP))
    kube.add_pod(victim())
    kube.add_pod(router_pod())
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    obs = attempt_env().run(RetirementActivities(kube).disqualify, phase(admission.target))
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    kube.calls.clear()
    return kube, admission.target


def phase(target: Target, *, seconds: float = 0.0, evidence_age_s: float = 0.0) -> PhaseInput:
    """A phase's input (by default its deadline is now: one poll); for the delete, the
    drain's last idle read ``evidence_age_s`` old."""
    now = datetime.now(UTC)
    return PhaseInput(
        target=target,
        deadline=now + timedelta(seconds=seconds),
        poll_interval_s=0.01,
        evidence_at=now - timedelta(seconds=evidence_age_s),
        fresh_s=freshness_bound(Budgets()).total_seconds(),
    )


def delete(kube: FakeKube, target: Target, router: Gateway, **kw: Any) -> DeleteResult:
    acts = RetirementActivities(kube, router_transport=router.transport)
    result: DeleteResult = attempt_env().run(acts.delete, phase(target, **kw))
    return result


def withdraw(kube: FakeKube, target: Target, router: Gateway, **env: Any) -> Observation:
    acts = RetirementActivities(kube, router_transport=router.transport)
    obs: Observation = attempt_env(**env).run(acts.withdraw, phase(target))
    return obs


# ------------------------------------------------------------------ the last guard


def test_the_guard_lets_a_delete_through_when_everything_still_holds() -> None:
    kube, target = disqualified()
    result = delete(kube, target, Gateway(OTHER_URL))
    assert result.refused is None and result.deleted == ["llm-1-0"]


def test_a_label_put_back_after_the_last_drain_round_keeps_the_replica() -> None:
    """A person (or another controller) puts the label back between the drain's last
    round and the delete: the replica serves again and is not deleted."""
    kube, target = disqualified()
    kube.set_label("llm-1-0", LABEL_ELIGIBLE, "true")
    result = delete(kube, target, Gateway(OTHER_URL))
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert "label re-added by someone else" in result.refused.reason
    assert result.deleted == [] and kube.called("delete_pod") == []


def test_a_spec_that_declares_the_ordinal_again_keeps_the_replica() -> None:
    kube, target = disqualified()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=2, router=ROUTER, uid="md-uid"))
    result = delete(kube, target, Gateway(OTHER_URL))
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert "still declares server ordinal 1" in result.refused.reason
    assert kube.called("delete_pod") == []


def test_a_re_created_deployment_keeps_the_replica() -> None:
    kube, target = disqualified()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, router=ROUTER, uid="new"))
    result = delete(kube, target, Gateway(OTHER_URL))
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert "re-created" in result.refused.reason and kube.called("delete_pod") == []


def test_a_router_selecting_the_victim_again_sends_it_back_to_draining() -> None:
    kube, target = disqualified()
    router = Gateway(VICTIM_URL, OTHER_URL)
    result = delete(kube, target, router)
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert "router/router-0" in result.refused.readings
    assert kube.called("delete_pod") == [] and router.removals == []  # the guard only reads


def test_a_service_listing_the_victim_again_sends_it_back_to_draining() -> None:
    kube, target = disqualified()
    kube.add_service("llm", selector={LABEL_INSTANCE: MD}, namespace=NS)
    kube.set_endpoints("llm", [VICTIM_IP], namespace=NS)
    result = delete(kube, target, Gateway(OTHER_URL))
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert "service/llm" in result.refused.readings and kube.called("delete_pod") == []


def test_stale_drain_evidence_is_not_deleted_on() -> None:
    kube, target = disqualified()
    result = delete(kube, target, Gateway(OTHER_URL), evidence_age_s=90)
    assert result.refused is not None and result.refused.verdict is Verdict.UNKNOWN
    assert "old" in result.refused.reason and kube.called("delete_pod") == []


def test_a_member_someone_else_is_deleting_is_not_taken_for_the_deletion_begun() -> None:
    """On the delete's first attempt nothing of this retirement was deleted: a member
    terminating is someone else's delete, a definite fault."""
    kube, target = disqualified()
    body = victim(eligible=False)
    body["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    kube.add_pod(body)
    result = delete(kube, target, Gateway(OTHER_URL))
    assert result.refused is not None and result.refused.verdict is Verdict.FAILED
    assert "terminating" in result.refused.reason and kube.called("delete_pod") == []


# ------------------------------------------------------------------ withdrawal removals


def test_withdrawal_asks_a_router_to_remove_the_live_victims_address() -> None:
    kube, target = disqualified()
    router = Gateway(VICTIM_URL, OTHER_URL)
    obs = withdraw(kube, target, router)
    assert obs.verdict is Verdict.UNKNOWN and router.removals == [("DELETE", "/workers/w-0")]


def test_an_address_a_deleted_victim_left_to_another_pod_is_never_removed() -> None:
    """The victim was deleted (by someone else) and its address handed to another
    replica's new Pod, which the router selects: removing that worker would take a
    serving replica out of routing."""
    kube, target = disqualified()
    kube.remove_pod("llm-1-0")
    kube.add_pod(member_pod("llm-0-1", deployment=MD, ordinal=0, uid="reuse", ip=VICTIM_IP))
    router = Gateway(VICTIM_URL, OTHER_URL)
    obs = withdraw(kube, target, router)
    assert obs.verdict is Verdict.FAILED and "llm-1-0 is gone" in obs.reason
    assert router.removals == []


class LabelBackWhileReading(FakeKube):
    """Someone puts the victim's label back while withdrawal lists the Services (after its
    poll began, before it asks the router to remove the worker)."""

    def list_services(self, *, namespace: str) -> list[Service]:
        if self.pods.get((NS, "llm-1-0")) is not None and self.called("list_services") == []:
            self.set_label("llm-1-0", LABEL_ELIGIBLE, "true", namespace=NS)
        return super().list_services(namespace=namespace)


def test_the_label_is_read_again_right_before_a_router_removal() -> None:
    kube, target = disqualified(LabelBackWhileReading())
    kube.calls.clear()
    router = Gateway(VICTIM_URL, OTHER_URL)
    obs = withdraw(kube, target, router)
    assert obs.verdict is Verdict.FAILED and "label re-added" in obs.reason
    assert router.removals == []


# ------------------------------------------------------------------ orphaned attempts

#: An attempt the server started this long ago, its thread just running now (a worker
#: whose executor was saturated): the server may have timed it out already.
LONG_AGO = timedelta(seconds=20)


def orphan() -> dict[str, Any]:
    return {"started_time": datetime.now(UTC) - LONG_AGO}


def test_an_orphaned_withdrawal_asks_no_router_to_remove_anything() -> None:
    kube, target = disqualified()
    router = Gateway(VICTIM_URL, OTHER_URL)
    with pytest.raises(ClaimLost, match="without a heartbeat"):
        withdraw(kube, target, router, **orphan())
    assert router.removals == []


def test_an_orphaned_disqualify_patches_no_label() -> None:
    kube, target = disqualified()
    kube.set_label("llm-1-0", LABEL_ELIGIBLE, "true")
    kube.calls.clear()
    with pytest.raises(ClaimLost):
        attempt_env(**orphan()).run(RetirementActivities(kube).disqualify, phase(target))
    assert kube.called("patch_pod") == []


def test_an_orphaned_restore_puts_nothing_back() -> None:
    """A restore attempt that lost its claim must not label a member a later attempt (the
    retry's disqualify) took the label off again."""
    kube, target = disqualified()
    router = Gateway(OTHER_URL)
    acts = RetirementActivities(kube, router_transport=router.transport)
    with pytest.raises(ClaimLost):
        attempt_env(**orphan()).run(acts.restore, phase(target))
    assert kube.called("patch_pod") == [] and [m for m, _ in router.log if m != "GET"] == []


def test_an_orphaned_delete_deletes_nothing() -> None:
    kube, target = disqualified()
    router = Gateway(OTHER_URL)
    acts = RetirementActivities(kube, router_transport=router.transport)
    with pytest.raises(ClaimLost):
        attempt_env(**orphan()).run(acts.delete, phase(target))
    assert kube.called("delete_pod") == []


class SlowServices(FakeKube):
    """Listing the Services takes ``slow_s`` seconds (on the claims' clock): an API server
    answering slowly, with no heartbeat in between."""

    def __init__(self, clock: list[float], slow_s: float) -> None:
        super().__init__()
        self.clock, self.slow_s = clock, slow_s

    def list_services(self, *, namespace: str) -> list[Service]:
        self.clock[0] += self.slow_s
        return super().list_services(namespace=namespace)


@pytest.mark.parametrize(("slow_s", "removed"), [(3.0, True), (8.0, False)])
def test_a_call_that_outlasts_the_heartbeat_gap_loses_the_claim_before_the_removal(
    monkeypatch: pytest.MonkeyPatch, slow_s: float, removed: bool
) -> None:
    """``withdraw``'s poll went quiet in one slow call for longer than the server allows
    between heartbeats: it may have been timed out and the workflow moved on to the
    restore; the removal it was about to ask for is not asked."""
    clock = [1000.0]
    monkeypatch.setattr(fencing, "monotonic", lambda: clock[0])
    kube, target = disqualified(SlowServices(clock, slow_s))
    router = Gateway(VICTIM_URL, OTHER_URL)
    if removed:
        assert withdraw(kube, target, router).verdict is Verdict.UNKNOWN
        assert router.removals == [("DELETE", "/workers/w-0")]
    else:
        with pytest.raises(ClaimLost, match=r"8\.0 s passed without a heartbeat"):
            withdraw(kube, target, router)
        assert router.removals == []


# ------------------------------------------------------------------ leaving routers


class TwoGateways:
    """Two router Pods of the deployment: ``router-0`` selects ``first``, the other one,
    terminating (a rollout of the router's Deployment), still selects ``second``."""

    def __init__(self, first: list[str], second: list[str]) -> None:
        self.selected = {"198.18.1.2": first, "198.18.1.3": second}
        self.log: list[tuple[str, str, str]] = []
        self.transport = httpx.MockTransport(self._answer)

    def _answer(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host
        self.log.append((host, request.method, request.url.path))
        if request.method == "GET":
            return httpx.Response(200, json=workers(*self.selected[host]))
        return httpx.Response(202, json={"status": "accepted"})


def leaving_router_pod() -> dict[str, Any]:
    body = router_pod()
    body["metadata"] |= {
        "name": "router-1",
        "uid": "uid-router-1",
        "deletionTimestamp": "2026-12-04T00:00:00Z",
    }
    body["status"] = {"podIP": "198.18.1.3"}
    return body


def test_a_terminating_router_pod_still_routes_so_withdrawal_asks_it_too() -> None:
    kube, target = disqualified()
    kube.add_pod(leaving_router_pod())
    routers = TwoGateways([OTHER_URL], [VICTIM_URL, OTHER_URL])
    acts = RetirementActivities(kube, router_transport=routers.transport)
    obs: Observation = attempt_env().run(acts.withdraw, phase(target))
    assert obs.verdict is Verdict.UNKNOWN and "router router-1" in obs.reason
    assert ("198.18.1.3", "DELETE", "/workers/w-0") in routers.log
    # The delete's guard does not let it through either.
    result: DeleteResult = attempt_env().run(acts.delete, phase(target))
    assert result.refused is not None and "router/router-1" in result.refused.readings
    assert kube.called("delete_pod") == []


def test_a_cancellation_during_the_withdrawal_recheck_is_never_read_as_an_answer() -> None:
    """Temporal delivers a cancellation into the activity's thread as an exception (a
    subclass of Exception): the drain's per-round re-check must let it through, not read
    it as an unreadable router answer and go on."""
    from temporalio.exceptions import CancelledError

    from activities.recheck import still_withdrawn

    kube, target = disqualified()

    def cancelled(_: httpx.Request) -> httpx.Response:
        raise CancelledError("the attempt was cancelled")

    with (
        httpx.Client(transport=httpx.MockTransport(cancelled)) as http,
        pytest.raises(CancelledError),
    ):
        still_withdrawn(kube, target, http)
