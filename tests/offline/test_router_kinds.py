"""Issue 10, item 2 and smg: the router kind comes from the ModelDeployment (``spec.router``,
string or object form), router Pods are found by the router label whatever its value, the
observer's port is chosen by name, an unknown kind reads UNKNOWN with the reason, and
smg's ``status`` is read (``draining`` is leaving, never selected again).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from activities import RetirementActivities
from activities.routers import (
    FRESHNESS_S,
    LlmdPicker,
    RouterView,
    SGLangGateway,
    VllmRouter,
    resolve,
    router_port,
)
from kube.deployment import MalformedDeployment, parse_deployment
from kube.objects import Pod
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

NS, MD = "default", "llm"
IP, KEPT_IP, ROUTER_IP = "198.18.1.11", "198.18.1.10", "198.18.1.2"
URL, KEPT_URL = f"http://{IP}:8000", f"http://{KEPT_IP}:8000"
BASE = f"http://{ROUTER_IP}:30000"


# ================================================================ spec.router


def md(router: Any) -> dict[str, Any]:
    body = model_deployment(MD, namespace=NS, uid="md-uid")
    body["spec"]["router"] = router
    return body


@pytest.mark.parametrize(
    ("router", "kind"),
    [
        ("vllm-router", "vllm-router"),
        ("smg", "smg"),
        ({"name": "llm-d-router", "replicas": 2, "extraArgs": ["--x"]}, "llm-d-router"),
        ({"name": "sglang-gateway", "kind": "sglang-gateway"}, "sglang-gateway"),
        ({"kind": "vllm-router"}, "vllm-router"),
        ({"name": "nginx"}, "nginx"),  # parses; its router Pods read UNKNOWN
    ],
)
def test_the_router_kind_is_read_in_string_or_object_form(router: Any, kind: str) -> None:
    assert parse_deployment(md(router)).router == kind


@pytest.mark.parametrize(
    ("router", "reason"),
    [
        ({"name": "vllm-router", "kind": "llm-d"}, "disagree"),
        ({"name": 3}, "spec.router.name must be a string, not int"),
        ({"name": ["vllm-router"]}, "spec.router.name must be a string, not list"),
        (7, "spec.router must be an object, not int"),
    ],
)
def test_a_router_that_cannot_be_read_is_a_malformed_deployment(router: Any, reason: str) -> None:
    with pytest.raises(MalformedDeployment) as info:
        parse_deployment(md(router))
    assert reason in info.value.reason


# ================================================================ ports


def pod(
    ports: list[dict[str, Any]] | None, *, ip: str | None = ROUTER_IP, sidecar: bool = False
) -> Pod:
    """A router Pod declaring ``ports`` (and a sidecar's port when asked)."""
    containers: list[dict[str, Any]] = [{"name": "router", "ports": ports or []}]
    if sidecar:
        containers.append({"name": "proxy", "ports": [{"name": "admin", "containerPort": 15000}]})
    return Pod.from_raw(
        {
            "metadata": {
                "name": "router-0",
                "uid": "uid-router-0",
                "labels": {LABEL_INSTANCE: MD, LABEL_ROUTER: "whatever"},
            },
            "spec": {"containers": containers},
            "status": {} if ip is None else {"podIP": ip},
        }
    )


@pytest.mark.parametrize(
    ("ports", "http", "metrics"),
    [
        ([{"name": "http", "containerPort": 30000}], 30000, 30000),
        ([{"containerPort": 30000}], 30000, 30000),  # the only port, unnamed
        ([{"name": "api", "containerPort": 8081}], 8081, 8081),  # the only port
        (
            [{"name": "metrics", "containerPort": 9090}, {"name": "http", "containerPort": 8081}],
            8081,
            9090,
        ),
        (
            [{"name": "grpc", "containerPort": 9002}, {"name": "metrics", "containerPort": 9090}],
            "several ports, none named http",
            9090,
        ),
        (
            [{"name": "api", "containerPort": 8081}, {"containerPort": 9090}],
            "several ports, none named http",
            "several ports, none named metrics",
        ),
        ([], "declares no container port", "declares no container port"),
        ([{"name": "http", "containerPort": 0}], "no valid number", "no valid number"),
        ([{"name": "http", "containerPort": 70000}], "no valid number", "no valid number"),
        ([{"name": "http", "containerPort": "8080"}], "no valid number", "no valid number"),
    ],
)
def test_the_port_is_chosen_by_name(
    ports: list[dict[str, Any]], http: int | str, metrics: int | str
) -> None:
    for names, want in ((("http",), http), (("metrics",), metrics)):
        got = router_port(pod(ports), names)
        assert got == want if isinstance(want, int) else want in str(got), (names, got)


def test_ports_of_every_container_count() -> None:
    p = pod([{"name": "http", "containerPort": 30000}], sidecar=True)
    assert router_port(p, ("http",)) == 30000
    p = pod([{"containerPort": 30000}], sidecar=True)
    assert router_port(p, ("http",)) == "several ports, none named http"


def test_two_ports_of_the_chosen_name_read_unknown() -> None:
    ports = [{"name": "http", "containerPort": 1}, {"name": "http", "containerPort": 2}]
    assert router_port(pod(ports), ("http",)) == "several ports named http"


def test_resolve_gives_the_observer_and_its_address_or_why_not() -> None:
    p = pod([{"name": "http", "containerPort": 30000}, {"name": "metrics", "containerPort": 9090}])
    found = resolve(p, "llm-d", {})
    assert isinstance(found, tuple) and isinstance(found[0], LlmdPicker)
    assert found[1] == f"http://{ROUTER_IP}:9090"
    found = resolve(p, "vllm-router", {})
    assert isinstance(found, tuple) and isinstance(found[0], VllmRouter)
    assert found[1] == f"http://{ROUTER_IP}:30000"
    assert resolve(p, "nginx", {}) == (
        "unknown router kind 'nginx' (observed: llm-d, llm-d-router, sglang-gateway, smg, "
        "vllm-router)"
    )
    assert "declares no router kind" in str(resolve(p, None, {}))
    assert "no IP address" in str(resolve(pod([{"containerPort": 1}], ip=None), "smg", {}))


# ================================================================ freshness


def test_an_answer_is_fresh_for_exactly_the_bound_on_either_clock() -> None:
    now = time.time()
    ms = int(now * 1000)
    assert RouterView(workers={}, fetched_at=now, router_ms=ms - 14_999).fresh(now)
    assert not RouterView(workers={}, fetched_at=now, router_ms=ms - 15_100).fresh(now)
    assert not RouterView(workers={}, fetched_at=now, router_ms=ms + 15_100).fresh(now)
    assert not RouterView(workers={}, fetched_at=now - FRESHNESS_S - 0.1, router_ms=ms).fresh(now)


# ================================================================ smg


def smg_workers(*workers: tuple[str, Any]) -> dict[str, Any]:
    """smg's ``GET /workers``: items carry ``status`` and ``labels``."""
    return {
        "workers": [
            {
                "id": f"w-{i}",
                "url": url,
                "model_id": "m",
                "labels": {"smg.ai/pod-uid": f"uid-{i}"},
                "is_healthy": status == "ready",
                "status": status,
                "load": 0,
            }
            for i, (url, status) in enumerate(workers)
        ],
        "total": len(workers),
        "stats": {},
    }


def read(body: Any) -> RouterView:
    handler = httpx.MockTransport(lambda r: httpx.Response(200, json=body))
    with httpx.Client(transport=handler, trust_env=False) as http:
        return SGLangGateway("smg").view(http, BASE)


@pytest.mark.parametrize(
    ("status", "held", "selected"),
    [
        ("ready", True, True),
        ("draining", False, False),
        ("pending", True, False),
        ("not_ready", True, False),
        ("failed", True, False),
    ],
)
def test_smg_status_is_read(status: str, held: bool, selected: bool) -> None:
    view = read(smg_workers((URL, status), (KEPT_URL, "ready")))
    assert view.error == ""
    assert bool(view.holding({IP})) is held
    assert bool(view.selecting({IP})) is selected
    assert view.workers[URL] == "w-0"


@pytest.mark.parametrize("status", ["Draining", "drained", "", 4, True, ["draining"]])
def test_an_unknown_smg_status_reads_unknown(status: Any) -> None:
    view = read(smg_workers((URL, status)))
    assert view.error and view.holding({IP}) == []
    assert not view.fresh(time.time())


def test_a_url_listed_twice_is_held_if_either_entry_is() -> None:
    view = read(smg_workers((URL, "draining"), (URL, "not_ready")))
    assert view.holding({IP}) == [URL]


def admitted(kind: str) -> tuple[FakeKube, Target]:
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, router=kind))
    kube.add_pod(member_pod("llm-1", deployment=MD, ordinal=1, uid="uid-1", ip=IP))
    kube.add_pod(member_pod("llm-0", deployment=MD, ordinal=0, uid="uid-0", ip=KEPT_IP))
    kube.add_pod(
        {
            "metadata": {
                "name": "router-0",
                "namespace": NS,
                "uid": "uid-router-0",
                "labels": {LABEL_INSTANCE: MD, LABEL_ROUTER: "smg-router"},
            },
            "spec": {
                "containers": [
                    {"name": "router", "ports": [{"name": "http", "containerPort": 30000}]}
                ]
            },
            "status": {"podIP": ROUTER_IP},
        }
    )
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    kube.set_label("llm-1", LABEL_ELIGIBLE, None)
    return kube, admission.target


def phase(target: Target, seconds: float) -> PhaseInput:
    return PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=0.01,
        routerless_policy=RouterlessPolicy.HOLD,
    )


class Smg:
    """smg as measured: a de-labelled worker turns ``draining`` and goes ~5 s later;
    ``POST /workers`` answers 409 for a URL it already has."""

    def __init__(self, workers: dict[str, str]) -> None:
        self.workers = dict(workers)  # url -> status
        self.calls: list[tuple[str, str]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.calls.append((request.method, request.url.path))
        if request.method == "GET" and request.url.path == "/workers":
            return httpx.Response(200, json=smg_workers(*self.workers.items()))
        if request.method == "POST" and request.url.path == "/workers":
            url = json.loads(request.content)["url"]
            if url in self.workers:
                return httpx.Response(409, json={"error": f"worker {url} already exists"})
            self.workers[url] = "pending"
            return httpx.Response(202, json={"status": "accepted"})
        return httpx.Response(404)


def test_withdrawal_accepts_a_draining_smg_worker_without_asking() -> None:
    kube, target = admitted("smg")
    smg = Smg({URL: "draining", KEPT_URL: "ready"})
    acts = RetirementActivities(kube, router_transport=httpx.MockTransport(smg.handle))
    obs: Observation = attempt_env().run(acts.withdraw, phase(target, 3.0))
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert smg.calls == [("GET", "/workers")]
    assert obs.router_removals == []


def test_the_restore_does_not_take_a_draining_smg_worker_for_selected(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # smg must select it for a while before it counts (test_restore_routers.py): shortened.
    monkeypatch.setattr("activities.routers.sglang.SMG_CONFIRM_S", 0.2)
    kube, target = admitted("smg")
    smg = Smg({URL: "draining", KEPT_URL: "ready"})
    acts = RetirementActivities(kube, router_transport=httpx.MockTransport(smg.handle))
    result: RestoreResult = attempt_env().run(acts.restore, phase(target, 0.05))
    assert result.restored == []
    assert "HTTP 409" in result.held["llm-1"]
    smg.workers[URL] = "ready"  # dropped, then re-discovered with the label back
    result = attempt_env().run(acts.restore, phase(target, 1.0))
    assert result.restored == ["llm-1"]
