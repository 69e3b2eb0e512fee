"""Issue 8, defect 2: router removals are undone by the restore, and the restore is complete
only when it is read back (the label, the Services' EndpointSlices, every router Pod).

Offline: ``FakeKube`` for the cluster, and a stateful stand-in of each router behind
``httpx.MockTransport`` that answers the wire formats measured on the released binaries
(``activities/routers.py``): the SGLang gateway's ``POST /workers`` only queues the
addition (202; the worker shows up on a later ``GET /workers``), vllm-router's
``POST /add_worker?url=`` adds it before answering.  Neither router acts on label changes.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import unquote

import httpx
import pytest

from activities import RetirementActivities
from activities.restore import ADD_AGAIN_AFTER_S
from activities.routers import SGLangGateway, VllmRouter
from activities.withdrawal import REMOVALS_READING
from retirement.models import (
    Admission,
    AdmitInput,
    Observation,
    PhaseInput,
    RestoreResult,
    RetirementRequest,
    RouterlessPolicy,
    Target,
)
from retirement.names import LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ROUTER
from retirement.phases import Verdict
from tests.helpers import model_deployment
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod

NS = "default"
MD = "llm"
IP = "198.18.1.11"
URL = f"http://{IP}:8000"
KEPT_URL = "http://198.18.1.10:8000"
ROUTER_IP = "198.18.1.2"
ROUTER_IP_2 = "198.18.1.3"


# ---------------------------------------------------------------- stand-in routers


class Gateway:
    """A router at one address, answering as ``kind`` does; ``lag`` GETs pass before a
    queued SGLang addition shows (the real gateway queues it as a job)."""

    def __init__(self, kind: str, urls: list[str], *, lag: int = 1) -> None:
        self.kind = kind
        self.workers = {u: str(uuid.uuid4()) for u in urls}
        self.lag = lag
        self.queued: list[tuple[int, str]] = []  # (GETs left, url)
        self.calls: list[tuple[str, str]] = []
        self.refuse_adds: int | None = None  # answer adds with this status, adding nothing
        self.broken = False  # answer GETs with garbage

    def _tick(self) -> None:
        left = []
        for n, url in self.queued:
            if n <= 1:
                self.workers.setdefault(url, str(uuid.uuid4()))
            else:
                left.append((n - 1, url))
        self.queued = left

    def handle(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        self.calls.append((method, path if method == "GET" else str(request.url)))
        if method == "GET":
            self._tick()
            if self.broken:
                return httpx.Response(200, content=b"<html>")
            if self.kind == "sglang-gateway" and path == "/workers":
                body = [{"id": i, "url": u} for u, i in self.workers.items()]
                return httpx.Response(200, json={"workers": body, "total": len(body)})
            if self.kind == "vllm-router" and path == "/list_workers":
                return httpx.Response(200, json={"urls": list(self.workers)})
            return httpx.Response(404)
        if self.refuse_adds is not None and path in ("/workers", "/add_worker"):
            return httpx.Response(self.refuse_adds, json={"error": "refused"})
        if self.kind == "sglang-gateway":
            if method == "POST" and path == "/workers":
                url = json.loads(request.content)["url"]
                self.queued.append((self.lag, url))
                return httpx.Response(202, json={"status": "accepted", "url": url})
            if method == "DELETE" and path.startswith("/workers/"):
                wid = unquote(path[len("/workers/") :])
                self.workers = {u: i for u, i in self.workers.items() if i != wid}
                return httpx.Response(202, json={"status": "accepted", "worker_id": wid})
        if self.kind == "vllm-router" and method == "POST":
            url = request.url.params.get("url", "")
            if path == "/add_worker":
                if url in self.workers:
                    return httpx.Response(400, text=f"Worker {url} already exists")
                self.workers[url] = ""
                return httpx.Response(200, text=f"Successfully added worker: {url}")
            if path == "/remove_worker":
                self.workers.pop(url, None)
                return httpx.Response(200, text=f"Successfully removed worker: {url}")
        return httpx.Response(404)

    def adds(self) -> list[str]:
        return [u for m, u in self.calls if m == "POST" and ("/workers" in u or "add_worker" in u)]


def transport(*gateways: tuple[str, Gateway]) -> httpx.MockTransport:
    """Route each request to the gateway at its host."""
    by_host = dict(gateways)
    return httpx.MockTransport(lambda request: by_host[request.url.host].handle(request))


# ---------------------------------------------------------------- the cluster


def router_pod(name: str, kind: str, ip: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {LABEL_INSTANCE: MD, LABEL_ROUTER: kind},
        },
        "spec": {
            "containers": [{"name": "router", "ports": [{"name": "http", "containerPort": 30000}]}]
        },
        "status": {"podIP": ip},
    }


def cluster(kind: str, *routers: tuple[str, str]) -> tuple[FakeKube, Target]:
    """Replica 1 of ``llm`` (router ``kind``) admitted and its label taken off, with
    router Pods ``(name, ip)``."""
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, router=kind))
    kube.add_pod(member_pod("llm-1", deployment=MD, ordinal=1, uid="uid-1", ip=IP))
    kube.add_pod(member_pod("llm-0", deployment=MD, ordinal=0, uid="uid-0", ip="198.18.1.10"))
    for name, ip in routers:
        kube.add_pod(router_pod(name, kind, ip))
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    kube.set_label("llm-1", LABEL_ELIGIBLE, None)
    kube.calls.clear()
    return kube, admission.target


def phase(target: Target, seconds: float, removals: list[str] | None = None) -> PhaseInput:
    return PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=0.01,
        routerless_policy=RouterlessPolicy.HOLD,
        router_removals=removals or [],
    )


def restore(
    kube: FakeKube,
    target: Target,
    mock: httpx.MockTransport,
    *,
    seconds: float = 3.0,
    removals: list[str] | None = None,
    heartbeats: list[Any] | None = None,
) -> RestoreResult:
    env = attempt_env()
    if heartbeats is not None:
        env.on_heartbeat = lambda *d: heartbeats.extend(d)
    acts = RetirementActivities(kube, router_transport=mock)
    result: RestoreResult = env.run(acts.restore, phase(target, seconds, removals))
    return result


def withdraw(kube: FakeKube, target: Target, mock: httpx.MockTransport) -> Observation:
    acts = RetirementActivities(kube, router_transport=mock)
    obs: Observation = attempt_env().run(acts.withdraw, phase(target, 3.0))
    return obs


KINDS = pytest.mark.parametrize("kind", ["sglang-gateway", "vllm-router"])


# ---------------------------------------------------------------- the router add calls


def test_sglang_add_posts_the_url_as_json_to_workers() -> None:
    log: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return httpx.Response(202, json={"status": "accepted", "worker_id": "w"})

    with httpx.Client(transport=httpx.MockTransport(handle)) as http:
        answer = SGLangGateway().add(http, "http://198.18.1.2:30000", URL)
    [r] = log
    assert (r.method, r.url.path, json.loads(r.content)) == ("POST", "/workers", {"url": URL})
    assert answer.startswith("HTTP 202")


def test_vllm_add_posts_the_url_as_a_query_parameter() -> None:
    log: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return httpx.Response(200, text=f"Successfully added worker: {URL}")

    with httpx.Client(transport=httpx.MockTransport(handle)) as http:
        answer = VllmRouter().add(http, "http://198.18.1.2:30000", URL)
    [r] = log
    assert (r.method, r.url.path, dict(r.url.params)) == ("POST", "/add_worker", {"url": URL})
    assert answer == f"HTTP 200 Successfully added worker: {URL}"


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
@pytest.mark.parametrize("exc", [httpx.ReadTimeout, httpx.ConnectError, httpx.RemoteProtocolError])
def test_an_add_that_fails_in_transport_does_not_raise(
    observer: Any, exc: type[httpx.TransportError]
) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise exc("simulated", request=request)

    with httpx.Client(transport=httpx.MockTransport(handle)) as http:
        assert observer.add(http, "http://198.18.1.2:30000", URL).startswith(exc.__name__)


# ---------------------------------------------------------------- the restore


@KINDS
def test_the_restore_adds_the_member_back_to_a_router_that_dropped_it(kind: str) -> None:
    """Level-based: no record of the removal is needed; the router does not act on the
    label, so only the add call brings the worker back, and only a read-back completes."""
    kube, target = cluster(kind, ("router-0", ROUTER_IP))
    gw = Gateway(kind, [KEPT_URL])  # withdrawal removed URL earlier
    beats: list[Any] = []
    result = restore(kube, target, transport((ROUTER_IP, gw)), heartbeats=beats)
    assert result.restored == ["llm-1"] and result.held == {} and result.failed == {}
    assert kube.pod_labels("llm-1")[LABEL_ELIGIBLE] == "true"
    assert URL in gw.workers
    assert len(gw.adds()) == 1
    assert result.router_adds == [f"router-0|{URL}"]
    first = beats[0]
    assert first.verdict is Verdict.UNKNOWN
    assert f"router router-0 does not select {URL} yet (asked to add" in first.reason
    assert gw.calls[-1][0] == "GET"  # completed on a read-back, not on the add's answer


def test_every_router_pod_must_select_the_member_again() -> None:
    """Only the router that dropped the member is asked; one that selects it is not."""
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP), ("router-1", ROUTER_IP_2))
    selects, dropped = Gateway("sglang-gateway", [KEPT_URL, URL]), Gateway("sglang-gateway", [])
    result = restore(kube, target, transport((ROUTER_IP, selects), (ROUTER_IP_2, dropped)))
    assert result.restored == ["llm-1"]
    assert selects.adds() == [] and len(dropped.adds()) == 1
    assert URL in dropped.workers


def test_the_restore_holds_while_a_router_never_selects_the_member() -> None:
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP))
    gw = Gateway("sglang-gateway", [KEPT_URL], lag=10**9)  # the addition never lands
    result = restore(kube, target, transport((ROUTER_IP, gw)), seconds=0.2)
    assert result.restored == []
    assert result.held["llm-1"].startswith("label back; router router-0 does not select")
    assert kube.pod_labels("llm-1")[LABEL_ELIGIBLE] == "true"
    assert len(gw.adds()) == 1  # asked once; not again before ADD_AGAIN_AFTER_S
    assert ADD_AGAIN_AFTER_S > 0.2


@pytest.mark.parametrize("status", [400, 404, 409, 500])
def test_a_refused_add_holds_and_does_not_raise(status: int) -> None:
    kube, target = cluster("vllm-router", ("router-0", ROUTER_IP))
    gw = Gateway("vllm-router", [KEPT_URL])
    gw.refuse_adds = status
    result = restore(kube, target, transport((ROUTER_IP, gw)), seconds=0.1)
    assert result.restored == [] and f"HTTP {status}" in result.held["llm-1"]


def test_a_router_answer_that_cannot_be_read_holds() -> None:
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP))
    gw = Gateway("sglang-gateway", [KEPT_URL, URL])
    gw.broken = True
    result = restore(kube, target, transport((ROUTER_IP, gw)), seconds=0.1)
    assert result.restored == []
    assert "router router-0: no fresh answer" in result.held["llm-1"]
    assert gw.adds() == []


def test_a_worker_named_by_hostname_holds_the_restore() -> None:
    kube, target = cluster("vllm-router", ("router-0", ROUTER_IP))
    gw = Gateway("vllm-router", [KEPT_URL, URL, "http://llm-1.llm.default.svc:8000"])
    result = restore(kube, target, transport((ROUTER_IP, gw)), seconds=0.1)
    assert result.restored == []
    assert "host is not an IP address" in result.held["llm-1"]


def test_a_declared_router_without_a_pod_holds_the_restore() -> None:
    kube, target = cluster("sglang-gateway")
    result = restore(kube, target, transport(), seconds=0.1)
    assert result.held == {
        "llm-1": "label back; router sglang-gateway declared but no router Pod found"
    }


def test_the_recorded_removal_url_is_the_one_added_back() -> None:
    """vllm-router keeps a URL verbatim: the worker removed as ``…:8000/`` comes back as
    that, not as a URL built from the address and port."""
    kube, target = cluster("vllm-router", ("router-0", ROUTER_IP))
    gw = Gateway("vllm-router", [KEPT_URL])
    removed = f"{URL}/"
    result = restore(kube, target, transport((ROUTER_IP, gw)), removals=[f"uid-router-0|{removed}"])
    assert result.restored == ["llm-1"]
    assert set(gw.workers) == {KEPT_URL, removed}


def test_the_port_of_the_other_workers_is_used_when_nothing_was_recorded() -> None:
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP))
    gw = Gateway("sglang-gateway", ["http://198.18.1.10:9000"])  # discovered on 9000
    result = restore(kube, target, transport((ROUTER_IP, gw)))
    assert result.restored == ["llm-1"]
    assert f"http://{IP}:9000" in gw.workers


def test_the_restore_waits_for_the_services_and_the_routers_together() -> None:
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP))
    kube.add_service("llm", selector={LABEL_INSTANCE: MD, LABEL_ELIGIBLE: "true"})
    kube.set_endpoints("llm", ["198.18.1.10"])
    gw = Gateway("sglang-gateway", [KEPT_URL])
    beats: list[Any] = []

    def endpoints_catch_up(request: httpx.Request) -> httpx.Response:
        if len(beats) >= 3:  # the endpoints controller lists it, by targetRef only
            kube.set_endpoints("llm", ["198.18.1.10", "198.18.9.9"], target_uids=["uid-0", "uid-1"])
        return gw.handle(request)

    result = restore(kube, target, httpx.MockTransport(endpoints_catch_up), heartbeats=beats)
    assert result.restored == ["llm-1"]
    assert "service llm does not list it yet" in beats[0].reason
    assert len(beats) >= 4


# ---------------------------------------------------------------- withdraw, then abort


@KINDS
def test_an_abort_after_an_active_removal_leaves_the_router_selecting_the_member(
    kind: str,
) -> None:
    """The offline twin of the bed test: withdrawal actively removes the worker, the
    retirement aborts, and the restore leaves the router selecting it again."""
    kube, target = cluster(kind, ("router-0", ROUTER_IP))
    gw = Gateway(kind, [KEPT_URL, URL])
    mock = transport((ROUTER_IP, gw))
    obs = withdraw(kube, target, mock)
    assert obs.verdict is Verdict.VERIFIED
    assert URL not in gw.workers
    assert obs.router_removals == [f"uid-router-0|{URL}"]  # recorded in the Observation
    assert obs.readings[REMOVALS_READING] == f"uid-router-0|{URL}"
    kube.set_label("llm-1", LABEL_ELIGIBLE, "true")  # the label alone brings nothing back
    assert URL not in gw.workers
    kube.set_label("llm-1", LABEL_ELIGIBLE, None)
    result = restore(kube, target, mock, removals=obs.router_removals)
    assert result.restored == ["llm-1"]
    assert URL in gw.workers


def test_withdrawal_records_each_removal_it_asked_for_even_while_unverified() -> None:
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP))
    gw = Gateway("sglang-gateway", [KEPT_URL, URL])

    def ignore_deletes(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            return httpx.Response(202, json={"status": "accepted"})  # queued, never done
        return gw.handle(request)

    acts = RetirementActivities(kube, router_transport=httpx.MockTransport(ignore_deletes))
    obs: Observation = attempt_env().run(acts.withdraw, phase(target, 0.05))
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.router_removals == [f"uid-router-0|{URL}"]


def test_models_stay_backward_compatible() -> None:
    """Payloads of the previous build (no new fields) still decode."""
    Observation.model_validate({"verdict": "VERIFIED", "reason": "", "readings": {}, "polls": 1})
    RestoreResult.model_validate({"restored": ["a"], "held": {}, "failed": {}})
    old = phase(cluster("sglang-gateway")[1], 1.0).model_dump(mode="json")
    del old["router_removals"]
    assert PhaseInput.model_validate(old).router_removals == []


class PendingDrainSmg:
    """smg as measured on the bed: a worker whose label came off is ``draining``, and the
    drain job removes it a moment later even if it was re-added in between (``POST
    /workers`` makes it ``ready`` again at once).  ``fire_after`` GETs pass before the job
    fires."""

    def __init__(self, fire_after: int) -> None:
        self.workers = {KEPT_URL: "ready", URL: "draining"}
        self.pending = {URL: fire_after}  # the drain job started when the label came off
        self.adds = 0

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/workers":
            for url in list(self.pending):
                self.pending[url] -= 1
                if self.pending[url] <= 0:
                    del self.pending[url]
                    self.workers.pop(url, None)
            body = [
                {"id": f"w{i}", "url": u, "status": st, "labels": {}}
                for i, (u, st) in enumerate(self.workers.items())
            ]
            return httpx.Response(200, json={"workers": body, "total": len(body)})
        if request.method == "POST" and request.url.path == "/workers":
            self.adds += 1
            self.workers[json.loads(request.content)["url"]] = "ready"
            return httpx.Response(202, json={"status": "accepted"})
        return httpx.Response(404)


def test_smg_must_keep_selecting_a_re_added_worker_before_it_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the bed the restore read smg selecting the worker again and counted it restored;
    smg's drain job, started when the label came off, then removed it (until smg's 60 s
    reconcile).  Now smg must select it for ``SMG_CONFIRM_S``: the job fires within that
    window, the worker is added again, and the restore ends with smg selecting it for
    good."""
    monkeypatch.setattr("activities.routers.sglang.SMG_CONFIRM_S", 0.3)
    monkeypatch.setattr("activities.restore.ADD_AGAIN_AFTER_S", 0.05)
    kube, target = cluster("sglang-gateway", ("router-0", ROUTER_IP))
    smg = PendingDrainSmg(fire_after=5)
    mock = httpx.MockTransport(smg.handle)
    result = restore(kube, target, mock, seconds=5.0)
    assert result.restored == ["llm-1"] and result.held == {}
    assert smg.adds == 2  # once while the job was pending, once after it removed the worker
    assert smg.pending == {} and smg.workers[URL] == "ready"  # nothing left to remove it
