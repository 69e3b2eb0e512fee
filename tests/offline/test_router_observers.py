"""The router observers (``activities/routers.py``) and the withdrawal that calls them
(``activities/withdrawal.py``), offline against ``httpx.MockTransport``.

A router answer counts as "withdrawn" only when it is fresh and selects no target address;
every error, timeout, wrong shape or unknown router kind must leave the withdrawal UNKNOWN.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from activities import withdrawal
from activities.routers import (
    FRESHNESS_S,
    OBSERVERS,
    LlmdPicker,
    RouterObserver,
    RouterView,
    SGLangGateway,
    VllmRouter,
    observer_for,
    router_base,
)
from kube.objects import Pod
from retirement.models import (
    IntentKind,
    MemberTarget,
    Observation,
    PhaseInput,
    RouterlessPolicy,
    Target,
    WithdrawProgress,
)
from retirement.names import LABEL_INSTANCE, LABEL_ROUTER
from retirement.phases import Verdict
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod

BASE = "http://198.18.1.2:30000"
TARGET_IP = "198.18.1.5"
OTHER_IP = "198.18.1.6"
TARGET_URL = f"http://{TARGET_IP}:8000"
OTHER_URL = f"http://{OTHER_IP}:8000"

Handler = Callable[[httpx.Request], httpx.Response]


def http_client(handler: Handler) -> httpx.Client:
    """A client whose every request is answered by ``handler``, never by the network."""
    return httpx.Client(transport=httpx.MockTransport(handler), trust_env=False, timeout=3.0)


def answering(status: int, body: Any, *, log: list[httpx.Request] | None = None) -> Handler:
    """A handler that records the request and answers ``body`` (JSON unless bytes)."""

    def handle(request: httpx.Request) -> httpx.Response:
        if log is not None:
            log.append(request)
        if isinstance(body, bytes):
            return httpx.Response(status, content=body)
        return httpx.Response(status, json=body)

    return handle


def raising(exc: type[httpx.TransportError]) -> Handler:
    """A handler whose transport fails with ``exc`` (what a real timeout or refusal raises)."""

    def handle(request: httpx.Request) -> httpx.Response:
        raise exc("simulated", request=request)

    return handle


def sglang_workers(*urls: str) -> dict[str, Any]:
    """The SGLang model gateway's ``GET /workers`` answer (sglang-router 0.3 shape)."""
    return {
        "workers": [
            {
                "id": f"w-{i}",
                "url": u,
                "model_id": "m",
                "priority": 50,
                "cost": 1.0,
                "worker_type": "regular",
                "is_healthy": True,
                "load": 0,
                "connection_mode": "Http",
            }
            for i, u in enumerate(urls)
        ],
        "total": len(urls),
        "stats": {"prefill_count": 0, "decode_count": 0, "regular_count": len(urls)},
    }


def vllm_urls(*urls: str) -> dict[str, Any]:
    """vllm-router's ``GET /list_workers`` answer."""
    return {"urls": list(urls)}


def withdrawn(view: RouterView, addresses: set[str]) -> bool:
    """The rule withdrawal applies to one router's answer."""
    return view.fresh(time.time()) and not view.selecting(addresses)


# ------------------------------------------------------------------ wire formats


def test_sglang_gateway_reads_urls_and_ids_from_get_workers() -> None:
    log: list[httpx.Request] = []
    with http_client(answering(200, sglang_workers(TARGET_URL, OTHER_URL), log=log)) as http:
        view = SGLangGateway().view(http, BASE)
    assert [(r.method, str(r.url)) for r in log] == [("GET", f"{BASE}/workers")]
    assert view.error == ""
    assert view.workers == {TARGET_URL: "w-0", OTHER_URL: "w-1"}
    assert view.selecting({TARGET_IP}) == [TARGET_URL]
    assert not withdrawn(view, {TARGET_IP})


def test_sglang_gateway_worker_without_id_reads_empty_id() -> None:
    with http_client(answering(200, {"workers": [{"url": OTHER_URL}]})) as http:
        view = SGLangGateway().view(http, BASE)
    assert view.workers == {OTHER_URL: ""}
    assert withdrawn(view, {TARGET_IP})


def test_vllm_router_reads_urls_from_list_workers() -> None:
    log: list[httpx.Request] = []
    with http_client(answering(200, vllm_urls(OTHER_URL, TARGET_URL), log=log)) as http:
        view = VllmRouter().view(http, BASE)
    assert [(r.method, str(r.url)) for r in log] == [("GET", f"{BASE}/list_workers")]
    assert view.workers == {OTHER_URL: "", TARGET_URL: ""}
    assert view.selecting({TARGET_IP}) == [TARGET_URL]


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
def test_an_empty_worker_list_is_a_fresh_answer_selecting_nothing(observer: RouterObserver) -> None:
    body = sglang_workers() if observer.kind == "sglang-gateway" else vllm_urls()
    with http_client(answering(200, body)) as http:
        view = observer.view(http, BASE)
    assert view.workers == {} and view.error == ""
    assert withdrawn(view, {TARGET_IP})


def test_vllm_router_workers_endpoint_is_not_read_as_list_workers() -> None:
    """vllm-router answers ``/workers`` too (SPEC section 6), but the observer reads only
    ``/list_workers``: a router without it reads UNKNOWN, never withdrawn."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/workers":
            return httpx.Response(200, json=sglang_workers(OTHER_URL))
        return httpx.Response(404, text="not found")

    with http_client(handle) as http:
        view = VllmRouter().view(http, BASE)
    assert "404" in view.error
    assert not withdrawn(view, {TARGET_IP})


def test_a_huge_valid_answer_is_read_whole() -> None:
    urls = [f"http://198.18.{i // 250 + 10}.{i % 250 + 1}:8000" for i in range(50_000)]
    with http_client(answering(200, vllm_urls(*urls, TARGET_URL))) as http:
        started = time.monotonic()
        view = VllmRouter().view(http, BASE)
    assert time.monotonic() - started < 5
    assert view.selecting({TARGET_IP}) == [TARGET_URL]


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
@pytest.mark.parametrize("status", [301, 307, 400, 404, 429, 500, 503])
def test_a_non_2xx_answer_reads_unknown(observer: RouterObserver, status: int) -> None:
    with http_client(answering(status, vllm_urls() | sglang_workers())) as http:
        view = observer.view(http, BASE)
    assert str(status) in view.error and view.workers == {}
    assert not view.fresh(time.time())
    assert not withdrawn(view, {TARGET_IP})


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
@pytest.mark.parametrize(
    "exc",
    [
        httpx.ConnectError,
        httpx.ConnectTimeout,
        httpx.ReadTimeout,
        httpx.PoolTimeout,
        httpx.RemoteProtocolError,
        httpx.ReadError,
    ],
)
def test_a_transport_failure_reads_unknown_naming_it(
    observer: RouterObserver, exc: type[httpx.TransportError]
) -> None:
    with http_client(raising(exc)) as http:
        view = observer.view(http, BASE)
    assert view.error.startswith(exc.__name__)
    assert not withdrawn(view, {TARGET_IP})


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"<html>",
        b'{"urls": [',
        b"\xff\xfe\x00",
        b"null",
        b"[]",
        b'"workers"',
        b"{}",
        b"x" * (4 << 20),
    ],
    ids=[
        "empty",
        "html",
        "truncated",
        "binary",
        "null",
        "list",
        "string",
        "object",
        "huge-garbage",
    ],
)
def test_non_json_and_wrong_shapes_read_unknown(observer: RouterObserver, body: bytes) -> None:
    with http_client(answering(200, body)) as http:
        view = observer.view(http, BASE)
    assert view.error, view
    assert len(view.error) <= 200
    assert not withdrawn(view, {TARGET_IP})


def test_each_observer_refuses_the_other_routers_shape() -> None:
    with http_client(answering(200, vllm_urls(OTHER_URL))) as http:
        assert SGLangGateway().view(http, BASE).error.startswith("KeyError")
    with http_client(answering(200, sglang_workers(OTHER_URL))) as http:
        assert VllmRouter().view(http, BASE).error.startswith("KeyError")


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
def test_deeply_nested_json_reads_unknown(observer: RouterObserver) -> None:
    with http_client(answering(200, b"[" * 100_000)) as http:
        view = observer.view(http, BASE)
    assert view.error


def test_vllm_urls_as_a_string_reads_unknown() -> None:
    with http_client(answering(200, {"urls": TARGET_URL})) as http:
        view = VllmRouter().view(http, BASE)
    assert not withdrawn(view, {TARGET_IP})


def test_sglang_worker_with_null_url_reads_unknown() -> None:
    with http_client(answering(200, {"workers": [{"url": None, "id": "w-0"}]})) as http:
        view = SGLangGateway().view(http, BASE)
    assert not withdrawn(view, {TARGET_IP})


# ------------------------------------------------------------------ worker hosts


@pytest.mark.parametrize(
    "url",
    [
        f"http://{TARGET_IP}:8000",
        f"https://{TARGET_IP}",
        f"http://user@{TARGET_IP}:8000/v1",
        f"http://{TARGET_IP}",
    ],
)
def test_selecting_matches_the_host_whatever_the_port_path_or_userinfo(url: str) -> None:
    view = RouterView(workers={url: "", OTHER_URL: ""}, fetched_at=time.time())
    assert view.selecting({TARGET_IP}) == [url]


def test_selecting_matches_an_ipv6_member() -> None:
    view = RouterView(workers={"http://[fd00::5]:8000": ""}, fetched_at=time.time())
    assert view.selecting({"fd00::5"}) == ["http://[fd00::5]:8000"]


@pytest.mark.parametrize(
    "url",
    ["http://llm-0.llm.demo.svc.cluster.local:8000", "http://llm-0:8000", f"{TARGET_IP}:8000"],
)
def test_a_worker_url_whose_host_is_not_an_ip_reads_unknown(url: str) -> None:
    with http_client(answering(200, vllm_urls(url))) as http:
        view = VllmRouter().view(http, BASE)
    assert not withdrawn(view, {TARGET_IP})


def test_an_unparsable_worker_url_reads_unknown() -> None:
    with http_client(answering(200, vllm_urls("http://[::1"))) as http:
        view = VllmRouter().view(http, BASE)
    assert not withdrawn(view, {TARGET_IP})


def test_an_ipv6_router_pod_is_observed() -> None:
    pod = Pod.from_raw(router_pod(name="router-v6", kind="vllm-router", ip="fd00::2"))
    base = router_base(pod, VllmRouter())
    assert base == "http://[fd00::2]:30000"
    with http_client(answering(200, vllm_urls(OTHER_URL))) as http:
        view = VllmRouter().view(http, base)
    assert view.error == "" and view.workers == {OTHER_URL: ""}


# ------------------------------------------------------------------ freshness


def test_an_answer_is_fresh_for_exactly_the_freshness_bound() -> None:
    now = time.time()
    assert RouterView(workers={}, fetched_at=now - FRESHNESS_S).fresh(now)
    assert not RouterView(workers={}, fetched_at=now - FRESHNESS_S - 0.01).fresh(now)
    assert not RouterView(workers={}, fetched_at=now, error="x").fresh(now)


# ------------------------------------------------------------------ removal calls


def test_sglang_removal_deletes_by_id_or_else_by_quoted_url() -> None:
    log: list[httpx.Request] = []
    with http_client(answering(200, {}, log=log)) as http:
        SGLangGateway().remove(http, BASE, TARGET_URL, "w-0/x")
        SGLangGateway().remove(http, BASE, TARGET_URL, "")
    assert [(r.method, r.url.raw_path.decode()) for r in log] == [
        ("DELETE", "/workers/w-0%2Fx"),
        ("DELETE", "/workers/http%3A%2F%2F198.18.1.5%3A8000"),
    ]


def test_vllm_removal_posts_the_url_as_a_query_parameter() -> None:
    log: list[httpx.Request] = []
    with http_client(answering(200, {}, log=log)) as http:
        VllmRouter().remove(http, BASE, TARGET_URL, "")
    assert [(r.method, r.url.path, dict(r.url.params)) for r in log] == [
        ("POST", "/remove_worker", {"url": TARGET_URL})
    ]


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
@pytest.mark.parametrize("status", [404, 405, 500])
def test_a_refused_removal_is_left_to_the_next_view(observer: RouterObserver, status: int) -> None:
    log: list[httpx.Request] = []
    with http_client(answering(status, {"error": "no"}, log=log)) as http:
        observer.remove(http, BASE, TARGET_URL, "w-0")
    assert len(log) == 1


@pytest.mark.parametrize("observer", [SGLangGateway(), VllmRouter()], ids=lambda o: o.kind)
def test_a_removal_that_times_out_does_not_raise(observer: RouterObserver) -> None:
    with http_client(raising(httpx.ReadTimeout)) as http:
        observer.remove(http, BASE, TARGET_URL, "w-0")


# ------------------------------------------------------------------ router kinds


def test_observers_exist_for_exactly_the_known_router_kinds() -> None:
    assert set(OBSERVERS) == {"sglang-gateway", "smg", "vllm-router", "llm-d", "llm-d-router"}
    assert isinstance(observer_for("sglang-gateway", {}), SGLangGateway)
    assert isinstance(observer_for("smg", {}), SGLangGateway)
    assert isinstance(observer_for("vllm-router", {}), VllmRouter)
    assert isinstance(observer_for("llm-d", {}), LlmdPicker)
    assert isinstance(observer_for("llm-d-router", {}), LlmdPicker)
    assert {k: o.active for k, o in OBSERVERS.items()} == {
        "sglang-gateway": True,
        "smg": True,
        "vllm-router": True,
        "llm-d": False,
        "llm-d-router": False,
    }


@pytest.mark.parametrize(
    "kind",
    [
        "",
        "llm_d",
        "SGLang-Gateway",
        "vllm_router",
        "sglang",
        "vllm-router ",
        "sglang\u2010gateway",
        "x" * 1000,
    ],
)
def test_an_unknown_router_kind_has_no_observer(kind: str) -> None:
    assert observer_for(kind) is None


# ------------------------------------------------------------------ withdrawal, offline

DEPLOYMENT = "llm"
NAMESPACE = "default"


def member(ip: str = TARGET_IP) -> MemberTarget:
    return MemberTarget(
        pod="llm-worker-1",
        uid="uid-1",
        container_id="containerd://c1",
        ip=ip,
        measured=True,
        labels={LABEL_INSTANCE: DEPLOYMENT},
    )


def target(router: str | None = "sglang-gateway") -> Target:
    return Target(
        namespace=NAMESPACE,
        deployment=DEPLOYMENT,
        role="worker",
        ordinal=1,
        intent=IntentKind.COUNT_TRIM,
        engine="vLLM",
        shape="Single",
        router=router,
        members=[member()],
    )


def router_pod(
    *,
    name: str = "router-0",
    kind: str | None = "sglang-gateway",
    ip: str | None = "198.18.1.2",
    port_name: str | None = "http",
) -> dict[str, Any]:
    """The raw body of a router Pod of the deployment."""
    labels = {LABEL_INSTANCE: DEPLOYMENT}
    if kind is not None:
        labels[LABEL_ROUTER] = kind
    port: dict[str, Any] = {"containerPort": 30000}
    if port_name is not None:
        port["name"] = port_name
    status: dict[str, Any] = {} if ip is None else {"podIP": ip}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}", "labels": labels},
        "spec": {"containers": [{"name": "router", "ports": [port]}]},
        "status": status,
    }


def cluster(*routers: dict[str, Any], services: dict[str, list[str]] | None = None) -> FakeKube:
    """A fake cluster with the router Pods and Services (name -> listed addresses)."""
    kube = FakeKube()
    # The admitted member, disqualified (a removal is asked only while it is alive).
    kube.add_pod(
        member_pod(
            "llm-worker-1",
            deployment=DEPLOYMENT,
            role="worker",
            ordinal=1,
            uid="uid-1",
            ip=TARGET_IP,
            eligible=False,
        )
    )
    for body in routers:
        kube.add_pod(body)
    for name, addresses in (services or {}).items():
        kube.add_service(name, selector={LABEL_INSTANCE: DEPLOYMENT}, namespace=NAMESPACE)
        kube.set_endpoints(name, addresses, namespace=NAMESPACE)
    return kube


#: The transport ``run_withdraw`` hands to ``withdraw`` (installed by ``routed``).
_TRANSPORT: dict[str, httpx.BaseTransport] = {}


@pytest.fixture
def routed() -> Iterator[Callable[[Handler], list[httpx.Request]]]:
    """Answer the router calls of ``withdraw`` through a MockTransport (its ``transport``
    seam); the returned function installs a handler and gives the request log."""

    def install(handler: Handler) -> list[httpx.Request]:
        log: list[httpx.Request] = []

        def logged(request: httpx.Request) -> httpx.Response:
            log.append(request)
            return handler(request)

        _TRANSPORT["mock"] = httpx.MockTransport(logged)
        return log

    yield install
    _TRANSPORT.clear()


def run_withdraw(
    kube: FakeKube,
    *,
    router: str | None = "sglang-gateway",
    policy: RouterlessPolicy = RouterlessPolicy.HOLD,
    heartbeats: list[Any] | None = None,
) -> Observation:
    """One poll of ``withdraw`` (the deadline is already past) in an activity context."""
    env = attempt_env()
    if heartbeats is not None:
        env.on_heartbeat = lambda *details: heartbeats.extend(details)
    inp = PhaseInput(
        target=target(router),
        deadline=datetime.now(UTC) - timedelta(seconds=1),
        poll_interval_s=0.01,
        routerless_policy=policy,
    )
    obs: Observation = env.run(
        lambda: withdrawal.withdraw(kube, inp, transport=_TRANSPORT.get("mock"))
    )
    return obs


def test_withdraw_is_verified_when_no_router_selects_a_target(routed: Any) -> None:
    log = routed(answering(200, sglang_workers(OTHER_URL)))
    obs = run_withdraw(cluster(router_pod()))
    assert obs.verdict is Verdict.VERIFIED, obs
    assert obs.readings == {"router/router-0": "selects no target"}
    assert [r.method for r in log] == ["GET"]


def test_withdraw_asks_a_selecting_router_to_remove_the_target_and_holds(routed: Any) -> None:
    log = routed(answering(200, sglang_workers(TARGET_URL, OTHER_URL)))
    heartbeats: list[Any] = []
    obs = run_withdraw(cluster(router_pod()), heartbeats=heartbeats)
    assert obs.verdict is Verdict.UNKNOWN
    assert "still selects http://198.18.1.5:8000" in obs.reason
    assert [(r.method, r.url.path) for r in log] == [
        ("GET", "/workers"),
        ("DELETE", "/workers/w-0"),
    ]
    progress = WithdrawProgress.model_validate(heartbeats[-1])
    assert progress.removal_requested == [f"uid-router-0|{TARGET_URL}"]


@pytest.mark.parametrize(
    "body", [b"<html>", b"[]", b'{"urls": []}'], ids=["html", "list", "other-router-shape"]
)
def test_withdraw_holds_on_a_router_answer_it_cannot_read(routed: Any, body: bytes) -> None:
    routed(answering(200, body))
    obs = run_withdraw(cluster(router_pod()))
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["router/router-0"].startswith("no fresh answer")


def test_withdraw_holds_when_a_router_times_out(routed: Any) -> None:
    routed(raising(httpx.ReadTimeout))
    obs = run_withdraw(cluster(router_pod()))
    assert obs.verdict is Verdict.UNKNOWN
    assert "ReadTimeout" in obs.reason


@pytest.mark.parametrize(
    ("pod", "router", "why"),
    [
        (router_pod(kind="nginx"), "nginx", "unknown router kind 'nginx'"),
        (router_pod(kind="vllm-router"), "Vllm-Router", "unknown router kind 'Vllm-Router'"),
        (router_pod(kind="vllm-router"), None, "declares no router kind"),
        (router_pod(ip=None), "vllm-router", "no IP address yet"),
        (router_pod(ip="not-an-ip"), "vllm-router", "no IP address yet"),
    ],
    ids=["unknown-kind", "kind-case", "no-declared-kind", "no-ip", "bad-ip"],
)
def test_withdraw_holds_on_a_router_it_cannot_observe(
    routed: Any, pod: dict[str, Any], router: str | None, why: str
) -> None:
    log = routed(answering(200, vllm_urls()))
    obs = run_withdraw(cluster(pod), router=router)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["router/router-0"].startswith("cannot observe: ")
    assert why in obs.reason
    assert log == []


def test_the_router_kind_is_the_deployments_whatever_the_pod_label_says(routed: Any) -> None:
    """Router Pods are found by the router label whatever its value; the observer is the
    one of the deployment's ``spec.router``."""
    log = routed(answering(200, vllm_urls(OTHER_URL)))
    obs = run_withdraw(cluster(router_pod(kind="anything")), router="vllm-router")
    assert obs.verdict is Verdict.VERIFIED, obs
    assert [(r.method, r.url.path) for r in log] == [("GET", "/list_workers")]


def test_withdraw_holds_while_a_declared_router_has_no_pod(routed: Any) -> None:
    routed(answering(200, vllm_urls()))
    obs = run_withdraw(cluster(), router="vllm-router")
    assert obs.verdict is Verdict.UNKNOWN
    assert "declared but no router Pod found" in obs.reason


def test_withdraw_holds_router_less_under_the_hold_policy(routed: Any) -> None:
    routed(answering(200, vllm_urls()))
    obs = run_withdraw(cluster(), router=None)
    assert obs.verdict is Verdict.UNKNOWN
    assert "policy hold" in obs.reason


def test_withdraw_holds_while_a_service_lists_a_target(routed: Any) -> None:
    routed(answering(200, sglang_workers(OTHER_URL)))
    obs = run_withdraw(cluster(router_pod(), services={"llm": [TARGET_IP, OTHER_IP]}))
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["service/llm"] == f"still lists {TARGET_IP}"


def test_withdraw_with_two_routers_holds_until_both_stop_selecting(routed: Any) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.host == "198.18.1.3":
            return httpx.Response(200, json=sglang_workers(TARGET_URL))
        return httpx.Response(200, json=sglang_workers(OTHER_URL))

    routed(handle)
    routers = [router_pod(), router_pod(name="router-1", ip="198.18.1.3")]
    obs = run_withdraw(cluster(*routers))
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["router/router-0"] == "selects no target"
    assert obs.readings["router/router-1"].startswith("still selects")


def test_withdraw_holds_on_a_worker_named_by_hostname(routed: Any) -> None:
    routed(answering(200, sglang_workers("http://llm-worker-1.llm.demo.svc:8000")))
    obs = run_withdraw(cluster(router_pod()))
    assert obs.verdict is Verdict.UNKNOWN


def test_withdraw_holds_when_the_removal_call_times_out(routed: Any) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "DELETE":
            raise httpx.ReadTimeout("simulated", request=request)
        return httpx.Response(200, json=sglang_workers(TARGET_URL))

    routed(handle)
    obs = run_withdraw(cluster(router_pod()))
    assert obs.verdict is Verdict.UNKNOWN


def test_withdraw_holds_on_an_unparsable_worker_url(routed: Any) -> None:
    routed(answering(200, json.dumps({"workers": [{"url": "http://[fd00::5"}]}).encode()))
    obs = run_withdraw(cluster(router_pod()))
    assert obs.verdict is Verdict.UNKNOWN
