"""Issue 10, items 3-4: the patched routers' ``/observer/endpoints`` and llm-d's endpoint
picker, read against the emulations in ``testbed/routers_emulated.py`` (neither router can
be installed here), offline through ``httpx.MockTransport`` and once on loopback.

Every doubt reads UNKNOWN, never "withdrawn": a wrong shape, a stale or restarted router,
a failed, empty or unauthorised scrape.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities import RetirementActivities
from activities.recheck import still_withdrawn
from activities.routers import (
    PATCHED_ENV,
    TOKEN_FILE_ENV,
    Generations,
    LlmdPicker,
    ObserverEndpoints,
    RouterView,
    SGLangGateway,
    VllmRouter,
    observer_for,
)
from activities.routers.patched import parse
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
from testbed.routers_emulated import EndpointPicker, PatchedRouter, PickerPod, serve
from tests.helpers import model_deployment
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod

NS, MD = "default", "llm"
IP, KEPT_IP, ROUTER_IP = "198.18.1.11", "198.18.1.10", "198.18.1.2"
URL, KEPT_URL = f"http://{IP}:8000", f"http://{KEPT_IP}:8000"
BASE = f"http://{ROUTER_IP}:30000"
TOKEN = "reader-token"


def client(handler: Callable[[httpx.Request], httpx.Response]) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler), trust_env=False, timeout=3.0)


def withdrawn(view: RouterView, pods: frozenset[str] = frozenset({"llm-1"})) -> bool:
    """The rule withdrawal applies to one answer."""
    return view.fresh(time.time()) and not view.holding({IP}, pods)


# ================================================================ patched routers


def observe(router: PatchedRouter) -> RouterView:
    obs = ObserverEndpoints(VllmRouter() if router.kind == "vllm-router" else SGLangGateway())
    with client(router.handle) as http:
        return obs.view(http, BASE)


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-gateway"])
def test_a_patched_router_selecting_the_target_is_not_withdrawn(kind: str) -> None:
    router = PatchedRouter(kind, [URL, KEPT_URL])
    view = observe(router)
    assert view.error == "" and set(view.workers) == {URL, KEPT_URL}
    assert view.selecting({IP}) == [URL] and not withdrawn(view)
    assert view.generation == str(router.boot_generation)
    assert view.router_ms is not None and abs(view.router_ms / 1000 - time.time()) < 5
    assert router.calls == [("GET", "/observer/endpoints")]


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-gateway"])
def test_a_patched_router_without_the_target_is_withdrawn(kind: str) -> None:
    view = observe(PatchedRouter(kind, [KEPT_URL]))
    assert withdrawn(view) and view.selecting({KEPT_IP}) == [KEPT_URL]


@pytest.mark.parametrize("flag", ["unhealthy", "circuit-open"])
def test_a_registered_worker_out_of_selection_is_still_held(flag: str) -> None:
    """Out of selection now is not withdrawn: it comes back on a good health check.  Nor is
    it selected again for the restore."""
    router = PatchedRouter("vllm-router", [URL, KEPT_URL])
    if flag == "unhealthy":
        router.workers[URL].healthy = False
    else:
        router.workers[URL].circuit_open = True
    view = observe(router)
    assert not withdrawn(view)
    assert view.selecting({IP}) == []
    assert "out of selection now" in view.describe(view.holding({IP}))


def test_extra_fields_of_the_gateway_build_are_accepted() -> None:
    doc = PatchedRouter("sglang-gateway", [URL]).document()
    doc["workers"][0]["lane"] = {"busy": False, "waiting": 0}
    doc["workers"][0]["last_job"] = {"status": "completed"}
    assert parse(doc, time.time()).selecting({IP}) == [URL]


def _mutations() -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    def w(doc: dict[str, Any]) -> dict[str, Any]:
        worker: dict[str, Any] = doc["workers"][0]
        return worker

    return [
        ("no-router", lambda d: d.pop("router")),
        ("router-null", lambda d: d.update(router=None)),
        ("generation-string", lambda d: d["router"].update(boot_generation="1")),
        ("generation-negative", lambda d: d["router"].update(boot_generation=-1)),
        ("now-bool", lambda d: d["router"].update(now_ms=True)),
        ("now-float", lambda d: d["router"].update(now_ms=1.5)),
        ("no-now", lambda d: d["router"].pop("now_ms")),
        ("revision-missing", lambda d: d.pop("registry_revision")),
        ("revision-null", lambda d: d.update(registry_revision=None)),
        ("workers-object", lambda d: d.update(workers={})),
        ("worker-string", lambda d: d.update(workers=[URL])),
        ("no-url", lambda d: w(d).pop("url")),
        ("url-hostname", lambda d: w(d).update(url="http://llm-1.llm:8000", port="8000")),
        ("port-int", lambda d: w(d).update(port=8000)),
        ("port-other", lambda d: w(d).update(port="9000")),
        ("port-fullwidth", lambda d: w(d).update(port="\uff18\uff10\uff10\uff10")),
        ("port-missing", lambda d: w(d).pop("port")),
        ("no-role", lambda d: w(d).pop("role")),
        ("pod-hint-null", lambda d: w(d).update(pod_hint=None)),
        ("worker-id-int", lambda d: w(d).update(worker_id=7)),
        ("no-selection", lambda d: w(d).pop("selection")),
        ("flag-string", lambda d: w(d)["selection"].update(in_selection="true")),
        ("flag-missing", lambda d: w(d)["selection"].pop("registered")),
        ("selected-unhealthy", lambda d: w(d)["selection"].update(healthy=False)),
        ("selected-unregistered", lambda d: w(d)["selection"].update(registered=False)),
        ("listed-twice", lambda d: d["workers"].append(copy.deepcopy(w(d)))),
    ]


@pytest.mark.parametrize(("name", "mutate"), _mutations(), ids=[n for n, _ in _mutations()])
def test_a_wrongly_shaped_observer_document_reads_unknown(
    name: str, mutate: Callable[[dict[str, Any]], None]
) -> None:
    doc = PatchedRouter("vllm-router", [URL]).document()
    doc["workers"][0]["selection"]["in_selection"] = True
    mutate(doc)
    with client(lambda r: httpx.Response(200, json=doc)) as http:
        view = ObserverEndpoints(VllmRouter()).view(http, BASE)
    assert view.error, name
    assert not withdrawn(view)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, {"detail": "Not Found"}),  # an unpatched vllm-router forwards to an engine
        (200, {"object": "list", "data": []}),  # an engine answering some GET
        (200, {"urls": []}),  # /list_workers' shape
        (200, {"workers": []}),  # the gateway's /workers shape
        (503, {"error": "no workers"}),
    ],
)
def test_an_answer_that_is_not_an_observer_document_reads_unknown(
    status: int, body: dict[str, Any]
) -> None:
    """Never a fallback to another API: which one is read is a worker setting."""
    log: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return httpx.Response(status, json=body)

    with client(handle) as http:
        view = ObserverEndpoints(VllmRouter()).view(http, BASE)
    assert view.error and not withdrawn(view)
    assert [r.url.path for r in log] == ["/observer/endpoints"]


def test_the_router_clock_bounds_freshness() -> None:
    now = time.time()
    for skew, fresh in [(0, True), (-14, True), (-16, False), (14, True), (16, False)]:
        router = PatchedRouter("vllm-router", [KEPT_URL], clock=lambda s=skew: now + s)
        view = observe(router)
        assert view.error == ""
        assert view.fresh(time.time()) is fresh, (skew, view.stale(time.time()))
    stale = observe(PatchedRouter("vllm-router", [], clock=lambda: now - 60))
    assert "s old by its now_ms" in stale.stale(time.time())
    ahead = observe(PatchedRouter("vllm-router", [], clock=lambda: now + 60))
    assert "ahead of this clock" in ahead.stale(time.time())


def test_a_restarted_router_reads_unknown_once_then_counts_again() -> None:
    router = PatchedRouter("vllm-router", [KEPT_URL])
    seen = Generations()
    assert seen.admit("uid-router", observe(router)) == ""
    assert seen.admit("uid-router", observe(router)) == ""
    router.restart()
    why = seen.admit("uid-router", observe(router))
    assert why.startswith("router restarted (boot_generation ")
    assert "earlier answers do not count" in why
    assert seen.admit("uid-router", observe(router)) == ""


def test_a_registry_revision_that_goes_back_reads_unknown() -> None:
    seen = Generations()
    view = observe(PatchedRouter("vllm-router", [KEPT_URL]))
    assert seen.admit("r", view) == ""
    older = RouterView(
        workers={}, fetched_at=time.time(), generation=view.generation, revision=view.revision
    )
    assert seen.admit("r", older) == ""  # the same revision again: unchanged
    back = RouterView(workers={}, fetched_at=time.time(), generation=view.generation, revision=0)
    assert "went back" in seen.admit("r", back)


def test_an_answer_switching_to_or_from_a_generation_is_a_change() -> None:
    seen = Generations()
    plain = RouterView(workers={}, fetched_at=time.time())
    assert seen.admit("r", plain) == ""
    with_one = RouterView(workers={}, fetched_at=time.time(), generation="5", revision=1)
    assert "none -> 5" in seen.admit("r", with_one)
    assert "5 -> none" in seen.admit("r", plain)


@pytest.mark.parametrize(
    ("kind", "call"),
    [("vllm-router", ("POST", "/remove_worker")), ("sglang-gateway", ("DELETE", "/workers/"))],
)
def test_a_patched_router_is_asked_through_its_own_admin_api(
    kind: str, call: tuple[str, str]
) -> None:
    router = PatchedRouter(kind, [URL, KEPT_URL])
    obs = ObserverEndpoints(VllmRouter() if kind == "vllm-router" else SGLangGateway())
    with client(router.handle) as http:
        view = obs.view(http, BASE)
        obs.remove(http, BASE, URL, view.workers[URL])
        assert withdrawn(obs.view(http, BASE))
        assert obs.add(http, BASE, URL).startswith(("HTTP 200", "HTTP 202"))
        assert obs.view(http, BASE).selecting({IP}) == [URL]
    method, path = router.calls[1]
    assert method == call[0] and path.startswith(call[1])


def test_which_kinds_are_patched_is_a_worker_setting() -> None:
    env = {PATCHED_ENV: "vllm-router, sglang-gateway,llm-d"}
    assert isinstance(observer_for("vllm-router", env), ObserverEndpoints)
    assert isinstance(observer_for("sglang-gateway", env), ObserverEndpoints)
    assert isinstance(observer_for("llm-d", env), LlmdPicker)  # no patched picker here
    assert isinstance(observer_for("vllm-router", {}), VllmRouter)
    assert isinstance(observer_for("smg", env), SGLangGateway)


def test_a_patched_router_answers_on_loopback() -> None:
    router = PatchedRouter("vllm-router", [URL])
    with serve(router.handle) as base, httpx.Client(trust_env=False, timeout=3.0) as http:
        view = ObserverEndpoints(VllmRouter()).view(http, base)
    assert view.error == "" and view.selecting({IP}) == [URL]


# ================================================================ llm-d's endpoint picker


@pytest.fixture
def token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The scrape's bearer token, in the file ``RETIRE_LLMD_TOKEN_FILE`` names."""
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    return path


def epp_with(**pods: dict[str, bool]) -> EndpointPicker:
    """A picker whose datastore holds ``pods`` (``llm_1`` is Pod ``llm-1``)."""
    epp = EndpointPicker()
    for name, state in pods.items():
        epp.pods[name.replace("_", "-")] = PickerPod(**state)
    return epp


def scrape(
    epp: EndpointPicker | Callable[[httpx.Request], httpx.Response],
) -> RouterView:
    handler = epp.handle if isinstance(epp, EndpointPicker) else epp
    with client(handler) as http:
        return LlmdPicker().view(http, BASE)


def test_the_picker_selecting_the_target_is_not_withdrawn(token: Path) -> None:
    epp = epp_with(llm_0={}, llm_1={})
    view = scrape(epp)
    assert view.error == "" and view.endpoints == {"llm-0-rank-0", "llm-1-rank-0"}
    assert view.holding(set(), {"llm-1"}) == ["llm-1-rank-0"]
    assert view.selecting(set(), {"llm-1"}) == ["llm-1-rank-0"]
    assert not withdrawn(view)
    [request] = epp.scrapes
    assert request.headers["authorization"] == f"Bearer {TOKEN}"
    assert request.url.host == ROUTER_IP


@pytest.mark.parametrize(
    "state",
    [{"ready": False}, {"terminating": True}, {"selected": False}],
    ids=["not-ready", "terminating", "unselected"],
)
def test_the_picker_drops_the_target_at_once(token: Path, state: dict[str, bool]) -> None:
    epp = epp_with(llm_0={}, llm_1={})
    assert not withdrawn(scrape(epp))
    for key, value in state.items():
        setattr(epp.pods["llm-1"], key, value)
    view = scrape(epp)
    assert view.endpoints == {"llm-0-rank-0"} and withdrawn(view)


def test_every_target_port_of_the_pod_counts(token: Path) -> None:
    epp = epp_with(llm_0={}, llm_1={})
    epp.target_ports = 2
    view = scrape(epp)
    assert view.holding(set(), {"llm-1"}) == ["llm-1-rank-0", "llm-1-rank-1"]


@pytest.mark.parametrize(
    ("endpoint", "pod", "match"),
    [
        ("llm-1", "llm-1", True),  # older pickers name the Pod itself
        ("llm-1-rank-3", "llm-1", True),
        ("llm-1-rank-x", "llm-1", False),
        ("llm-10-rank-0", "llm-1", False),
        ("llm-1-rank-0", "llm-1-rank-0", True),  # ambiguous: counts for both
        ("llm-1-rank-", "llm-1", False),
    ],
)
def test_endpoint_names_are_matched_to_pods(endpoint: str, pod: str, match: bool) -> None:
    view = RouterView(workers={}, endpoints=frozenset({endpoint}), fetched_at=time.time())
    assert bool(view.holding(set(), {pod})) is match


def test_an_empty_scrape_reads_unknown(token: Path) -> None:
    view = scrape(epp_with(llm_1={"ready": False}))
    assert "empty scrape" in view.error and not withdrawn(view)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>",
        b"inference_pool_ready_pods 2\n",
        b'inference_pool_per_pod_queue_size{name="pool"} 0\n',
        b'inference_pool_per_pod_queue_size{model_server_pod=""} 0\n',
        b'llm_d_epp_per_endpoint_queue_size{model_server_endpoint="llm-0-rank-0" 0\n',
        b"\xff\xfe",
        b"x" * (17 << 20),
    ],
    ids=[
        "empty",
        "html",
        "no-endpoint-series",
        "no-label",
        "empty-label",
        "broken",
        "binary",
        "huge",
    ],
)
def test_a_scrape_that_cannot_be_read_reads_unknown(token: Path, body: bytes) -> None:
    view = scrape(lambda r: httpx.Response(200, content=body))
    assert view.error and not withdrawn(view)
    assert TOKEN not in view.error


@pytest.mark.parametrize("status", [301, 404, 500, 503])
def test_a_failed_scrape_reads_unknown(token: Path, status: int) -> None:
    view = scrape(lambda r: httpx.Response(status, text="no"))
    assert str(status) in view.error and not withdrawn(view)


def test_a_scrape_that_times_out_reads_unknown(token: Path) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("simulated", request=request)

    view = scrape(handle)
    assert view.error.startswith("ReadTimeout") and not withdrawn(view)


@pytest.mark.parametrize(("tokens", "code"), [({}, 401), ({TOKEN: False}, 403)])
def test_an_unauthorised_scrape_reads_unknown(
    token: Path, tokens: dict[str, bool], code: int
) -> None:
    epp = epp_with(llm_0={})
    epp.tokens = tokens
    view = scrape(epp)
    assert view.error == f"unauthorised scrape of the picker's metrics: HTTP {code}"
    assert not withdrawn(view)


@pytest.mark.parametrize("content", [None, "", "two\nlines", "tab\tin"])
def test_without_a_usable_token_nothing_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None
) -> None:
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv(TOKEN_FILE_ENV, str(path))
    epp = epp_with(llm_0={})
    view = scrape(epp)
    assert "metrics token" in view.error and not withdrawn(view)
    assert epp.scrapes == []


def test_the_token_goes_only_to_the_router_pods_address(token: Path) -> None:
    """A redirect is not followed; a client that honours proxy settings is refused; a base
    URL that names no IP address is refused."""
    log: list[httpx.Request] = []

    def redirect(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return httpx.Response(307, headers={"location": "http://198.51.100.7/metrics"})

    assert not withdrawn(scrape(redirect))
    assert [r.url.host for r in log] == [ROUTER_IP]
    with httpx.Client(transport=httpx.MockTransport(redirect), trust_env=True) as http:
        assert "proxy" in LlmdPicker().view(http, BASE).error
    with client(redirect) as http:
        assert "not an IP address" in LlmdPicker().view(http, "http://epp.llm.svc:9090").error
    assert len(log) == 1


def test_the_picker_answers_on_loopback(token: Path) -> None:
    epp = epp_with(llm_1={})
    with serve(epp.handle) as base, httpx.Client(trust_env=False, timeout=3.0) as http:
        view = LlmdPicker().view(http, base)
    assert view.error == "" and view.holding(set(), {"llm-1"}) == ["llm-1-rank-0"]


# ================================================================ through the activities


def router_pod(kind: str, ports: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "router-0",
            "namespace": NS,
            "uid": "uid-router-0",
            "labels": {LABEL_INSTANCE: MD, LABEL_ROUTER: kind},
        },
        "spec": {"containers": [{"name": "router", "ports": ports}]},
        "status": {"podIP": ROUTER_IP},
    }


EPP_PORTS = [
    {"name": "grpc", "containerPort": 9002},
    {"name": "grpc-health", "containerPort": 9003},
    {"name": "metrics", "containerPort": 9090},
]
HTTP_PORTS = [{"name": "http", "containerPort": 30000}, {"name": "metrics", "containerPort": 29000}]


def admitted(kind: str, ports: list[dict[str, Any]]) -> tuple[FakeKube, Target]:
    """Replica 1 of ``llm`` (router ``kind``) admitted and its label taken off."""
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, router=kind))
    kube.add_pod(member_pod("llm-1", deployment=MD, ordinal=1, uid="uid-1", ip=IP))
    kube.add_pod(member_pod("llm-0", deployment=MD, ordinal=0, uid="uid-0", ip=KEPT_IP))
    kube.add_pod(router_pod(kind, ports))
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    kube.set_label("llm-1", LABEL_ELIGIBLE, None)
    return kube, admission.target


def phase(target: Target, seconds: float, removals: list[str] | None = None) -> PhaseInput:
    return PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=0.01,
        routerless_policy=RouterlessPolicy.HOLD,
        router_removals=removals or [],
    )


def withdraw(kube: FakeKube, target: Target, handler: Any, seconds: float = 3.0) -> Observation:
    acts = RetirementActivities(kube, router_transport=httpx.MockTransport(handler))
    obs: Observation = attempt_env().run(acts.withdraw, phase(target, seconds))
    return obs


def restore(
    kube: FakeKube, target: Target, handler: Any, seconds: float = 3.0, **kw: Any
) -> RestoreResult:
    acts = RetirementActivities(kube, router_transport=httpx.MockTransport(handler))
    result: RestoreResult = attempt_env().run(acts.restore, phase(target, seconds, **kw))
    return result


@pytest.fixture
def patched(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(PATCHED_ENV, "vllm-router,sglang-gateway")
    yield


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-gateway"])
def test_withdrawal_through_a_patched_router_removes_and_verifies(patched: None, kind: str) -> None:
    kube, target = admitted(kind, HTTP_PORTS)
    router = PatchedRouter(kind, [URL, KEPT_URL])
    obs = withdraw(kube, target, router.handle)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert obs.router_removals == [f"uid-router-0|{URL}"]
    assert URL not in router.workers
    assert {p for _, p in router.calls if p.startswith("/observer")} == {"/observer/endpoints"}
    result = restore(kube, target, router.handle, removals=obs.router_removals)
    assert result.restored == ["llm-1"] and URL in router.workers


def test_withdrawal_does_not_count_an_answer_across_a_router_restart(patched: None) -> None:
    kube, target = admitted("vllm-router", HTTP_PORTS)
    router = PatchedRouter("vllm-router", [URL, KEPT_URL])
    beats: list[Any] = []

    def handle(request: httpx.Request) -> httpx.Response:
        answer = router.handle(request)
        if request.url.path == "/remove_worker":
            router.restart()  # the router restarts right after the removal
        return answer

    acts = RetirementActivities(kube, router_transport=httpx.MockTransport(handle))
    env = attempt_env()
    env.on_heartbeat = lambda *d: beats.extend(d)
    obs: Observation = env.run(acts.withdraw, phase(target, 3.0))
    assert obs.verdict is Verdict.VERIFIED
    readings: list[str] = []
    for b in beats:  # each poll's reading once (a wait heartbeats the last one again)
        reading = b.last.readings.get("router/router-0", "")
        if not readings or readings[-1] != reading:
            readings.append(reading)
    assert readings[0].startswith("still selects")
    assert readings[1].startswith("no fresh answer: router restarted")
    assert readings[2] == "selects no target"


def test_withdrawal_holds_on_a_stale_patched_router(patched: None) -> None:
    kube, target = admitted("vllm-router", HTTP_PORTS)
    router = PatchedRouter("vllm-router", [KEPT_URL], clock=lambda: time.time() - 30)
    obs = withdraw(kube, target, router.handle, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert "s old by its now_ms" in obs.readings["router/router-0"]


def test_the_drain_recheck_does_not_count_a_restarted_router(patched: None) -> None:
    kube, target = admitted("vllm-router", HTTP_PORTS)
    router = PatchedRouter("vllm-router", [KEPT_URL])
    with client(router.handle) as http:
        assert still_withdrawn(kube, target, http).verdict is Verdict.VERIFIED
        router.restart()
        check = still_withdrawn(kube, target, http)
        assert check.verdict is Verdict.UNKNOWN
        assert check.readings["router/router-0"].startswith(
            "gave no fresh answer: router restarted"
        )
        assert still_withdrawn(kube, target, http).verdict is Verdict.VERIFIED
    with client(router.handle) as http:  # another drain attempt starts afresh
        assert still_withdrawn(kube, target, http).verdict is Verdict.VERIFIED


def test_withdrawal_through_the_picker_is_passive(token: Path) -> None:
    kube, target = admitted("llm-d", EPP_PORTS)
    epp = epp_with(llm_0={}, llm_1={})
    log: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        log.append(request)
        if len(log) == 3:  # the picker drops the de-labelled Pod
            epp.pods["llm-1"].selected = False
        return epp.handle(request)

    obs = withdraw(kube, target, handle)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert obs.router_removals == []
    assert {(r.method, r.url.port, r.url.path) for r in log} == {("GET", 9090, "/metrics")}


def test_withdrawal_through_the_picker_holds_while_it_selects_the_target(token: Path) -> None:
    kube, target = admitted("llm-d", EPP_PORTS)
    obs = withdraw(kube, target, epp_with(llm_0={}, llm_1={}).handle, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["router/router-0"] == "still selects llm-1-rank-0"


def test_the_restore_waits_for_the_picker_to_pick_the_member_up(token: Path) -> None:
    kube, target = admitted("llm-d", EPP_PORTS)
    epp = epp_with(llm_0={}, llm_1={"selected": False})
    held = restore(kube, target, epp.handle, seconds=0.05)
    assert held.restored == [] and "passive: waiting" in held.held["llm-1"]
    assert held.router_adds == []
    epp.pods["llm-1"].selected = True  # the label is back: the pool selects it again
    assert restore(kube, target, epp.handle).restored == ["llm-1"]
    assert {r.method for r in epp.scrapes} == {"GET"}
