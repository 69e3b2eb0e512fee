"""The Kubernetes layer decodes Pods, Services and EndpointSlices as raw JSON (issue 9).

``Kube`` asks the generated methods for the unread response (``_preload_content=False``)
and builds the typed views from ``json.loads`` of the body, instead of the generated
models (ten times the CPU: 200 retirements in one namespace starved the worker).  Against
a loopback HTTP server that answers like the API server, every view, request and error
is compared with what the former path (generated model, ``sanitize_for_serialization``,
``from_raw``) gives for the same answer: the views and the classified errors are the same,
the requests are the same, and the connection goes back to the pool.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from kube.client import Kube
from kube.errors import KubeError, Unavailable, translated
from kube.objects import EndpointSlice, Pod, Service
from tests.helpers.loopback_apiserver import Answer, Server, loopback_kube

NS = "ns"
PODS = f"/api/v1/namespaces/{NS}/pods"
SERVICES = f"/api/v1/namespaces/{NS}/services"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


@pytest.fixture
def served() -> Iterator[tuple[Server, Kube]]:
    with loopback_kube() as found:
        yield found


# ---------------------------------------------------------------- the former path


def _model_view(kube: Kube, obj: Any, view: Callable[[Any], Any]) -> Any:
    return view(kube.api.sanitize_for_serialization(obj))


def old_list_pods(kube: Kube) -> list[Pod]:
    with translated(f"list Pods in {NS}"):
        items = kube.core.list_namespaced_pod(
            NS, label_selector="app=llm", _request_timeout=kube.timeout_s
        ).items
    return [_model_view(kube, p, Pod.from_raw) for p in items or []]


def old_read_pod(kube: Kube, name: str) -> Pod:
    with translated(f"read Pod {NS}/{name}"):
        pod = kube.core.read_namespaced_pod(name, NS, _request_timeout=kube.timeout_s)
    view: Pod = _model_view(kube, pod, Pod.from_raw)
    return view


def old_patch_pod(kube: Kube, name: str, ops: list[dict[str, Any]]) -> Pod:
    with translated(f"patch Pod {NS}/{name}"):
        pod = kube.core.patch_namespaced_pod(name, NS, ops, _request_timeout=kube.timeout_s)
    view: Pod = _model_view(kube, pod, Pod.from_raw)
    return view


def old_list_services(kube: Kube) -> list[Service]:
    with translated(f"list Services in {NS}"):
        items = kube.core.list_namespaced_service(NS, _request_timeout=kube.timeout_s).items
    return [_model_view(kube, s, Service.from_raw) for s in items or []]


def old_list_slices(kube: Kube, service: str | None = None) -> list[EndpointSlice]:
    discovery = client.DiscoveryV1Api(kube.api)
    if service is None:
        what, kwargs = f"list EndpointSlices in {NS}", {}
    else:
        what = f"list EndpointSlices of Service {NS}/{service}"
        kwargs = {"label_selector": f"kubernetes.io/service-name={service}"}
    with translated(what):
        items = discovery.list_namespaced_endpoint_slice(
            NS, _request_timeout=kube.timeout_s, **kwargs
        ).items
    return [_model_view(kube, s, EndpointSlice.from_raw) for s in items or []]


# ---------------------------------------------------------------- representative bodies


def _meta(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": NS, "uid": f"uid-{name}", **extra}


def _container_status(name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": "vllm:1",
        "imageID": "sha256:1",
        "ready": True,
        "restartCount": 0,
        **extra,
    }


FULL_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": _meta(
        "llm-0",
        labels={"app": "llm", "modeldeployment.gpustack.ai/endpoint-eligible": "true"},
        annotations={"prometheus.io/port": "8000"},
        resourceVersion="42",
        creationTimestamp="2026-01-01T00:00:00Z",
        deletionTimestamp="2026-01-01T00:05:00Z",
        deletionGracePeriodSeconds=30,
        ownerReferences=[{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "o-1"}],
    ),
    "spec": {
        "containers": [
            {
                "name": "main",
                "image": "vllm:1",
                "command": ["python", "-m", "vllm.entrypoints.openai.api_server"],
                "args": ["--port", "8000", "--max-num-seqs", "64"],
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "EMPTY", "value": ""},
                    {"name": "NOVALUE"},
                    {"name": "FROM", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                ],
                "ports": [
                    {"containerPort": 8000, "name": "http", "protocol": "TCP"},
                    {"containerPort": 9000},
                ],
            },
            {"name": "sidecar", "image": "s:1"},
        ],
        "nodeName": "n1",
    },
    "status": {
        "phase": "Running",
        "podIP": "198.18.1.10",
        "podIPs": [{"ip": "198.18.1.10"}, {"ip": "fd00::a"}],
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "ContainersReady", "status": "False"},
            {"type": "PodScheduled", "status": "Unknown"},
        ],
        "containerStatuses": [
            _container_status("main", containerID="containerd://abc", restartCount=2),
            _container_status("sidecar", ready=False),
        ],
        "startTime": "2026-01-01T00:00:00Z",
    },
}

PODS_BODIES: list[dict[str, Any]] = [
    FULL_POD,
    # created, not yet scheduled: no status at all
    {"metadata": _meta("pending"), "spec": {"containers": [{"name": "main", "image": "i"}]}},
    # scheduled, no IP yet, a container not started (no containerID)
    {
        "metadata": _meta("starting", labels={"app": "llm"}),
        "spec": {"containers": [{"name": "main", "image": "i", "args": []}]},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [_container_status("main", ready=False)],
        },
    },
    # IPv6 only
    {
        "metadata": _meta("v6"),
        "spec": {"containers": [{"name": "main", "image": "i"}]},
        "status": {"podIP": "fd00::1", "podIPs": [{"ip": "fd00::1"}]},
    },
    # a bare minimum: what a missing field reads as
    {"metadata": {"name": "bare"}, "spec": {"containers": [{"name": "main"}]}, "status": {}},
]

SERVICE_BODIES: list[dict[str, Any]] = [
    {
        "metadata": _meta("llm"),
        "spec": {
            "selector": {"app": "llm"},
            "clusterIP": "10.96.0.10",
            "clusterIPs": ["10.96.0.10"],
            "ports": [{"port": 80, "targetPort": 8000, "protocol": "TCP"}],
        },
    },
    {
        "metadata": _meta("llm-0-headless"),
        "spec": {"selector": {"app": "llm", "pod": "llm-0"}, "clusterIP": "None"},
    },
    {"metadata": _meta("dual"), "spec": {"clusterIP": "fd00:96::10", "ipFamilies": ["IPv6"]}},
    {"metadata": _meta("external"), "spec": {"type": "ExternalName", "externalName": "x.y"}},
    {"metadata": _meta("no-spec")},
]

SLICE_BODIES: list[dict[str, Any]] = [
    {
        "metadata": _meta("llm-abc", labels={"kubernetes.io/service-name": "llm"}),
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": ["198.18.1.10"],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {"kind": "Pod", "name": "llm-0", "namespace": NS, "uid": "u0"},
                "nodeName": "n1",
            },
            {
                "addresses": ["198.18.1.11"],
                "conditions": {"ready": False, "serving": True, "terminating": True},
                "targetRef": {"kind": "Pod", "name": "llm-1", "uid": "u1"},
            },
            {
                "addresses": ["198.18.1.12"],
                "conditions": {"ready": False, "serving": False, "terminating": True},
            },
            {"addresses": ["198.18.1.13"], "conditions": {}},
            {"addresses": ["198.18.1.14", "198.18.1.15"]},
        ],
        "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}, {"port": 9000}],
    },
    {
        "metadata": _meta("llm-v6", labels={"kubernetes.io/service-name": "llm"}),
        "addressType": "IPv6",
        "endpoints": [
            {
                "addresses": ["fd00::a"],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "name": "llm-0", "uid": "u0"},
            }
        ],
        "ports": [{"name": "", "port": 8000}],
    },
    # a hand-made slice: no owning Service, no ports (every port), no conditions
    {
        "metadata": _meta("manual"),
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["198.18.1.10"], "targetRef": {"kind": "Other", "name": "x"}}],
    },
    # a Service with no endpoints yet (the API server sends an empty list as null)
    {
        "metadata": _meta("empty", labels={"kubernetes.io/service-name": "empty"}),
        "addressType": "IPv4",
        "endpoints": [],
    },
    {
        "metadata": _meta("null", labels={"kubernetes.io/service-name": "null"}),
        "addressType": "IPv4",
        "endpoints": None,
    },
]


def _list(kind: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": items}


# ---------------------------------------------------------------- the same views


def test_pods_read_raw_are_the_pods_read_through_the_models(served: tuple[Server, Kube]) -> None:
    state, kube = served
    state.answer(PODS, _list("PodList", PODS_BODIES))
    raw = kube.list_pods(namespace=NS, selector="app=llm")
    assert raw == old_list_pods(kube)
    assert [p.name for p in raw] == ["llm-0", "pending", "starting", "v6", "bare"]
    full = raw[0]
    assert full.terminating and full.pod_ips == ("198.18.1.10", "fd00::a")
    assert full.conditions == {
        "Ready": "True",
        "ContainersReady": "False",
        "PodScheduled": "Unknown",
    }
    assert raw[3].pod_ip == "fd00::1"
    for body in PODS_BODIES:
        name = body["metadata"]["name"]
        state.answer(f"{PODS}/{name}", body)
        assert kube.read_pod(namespace=NS, name=name) == old_read_pod(kube, name)
    # the same requests both ways (the label selector included)
    gets = [r[1] for r in state.requests]
    assert gets[0] == gets[1] == f"{PODS}?labelSelector=app%3Dllm"


def test_a_patched_pod_reads_the_same_and_is_sent_the_same(served: tuple[Server, Kube]) -> None:
    state, kube = served
    state.answer(f"{PODS}/llm-0", FULL_POD)
    ops = [
        {"op": "test", "path": "/metadata/uid", "value": "uid-llm-0"},
        {"op": "remove", "path": "/metadata/labels/a"},
    ]
    assert kube.patch_pod(namespace=NS, name="llm-0", ops=ops) == old_patch_pod(kube, "llm-0", ops)
    new, old = state.requests
    assert new == old
    assert new[0] == "PATCH" and new[2] == "application/json-patch+json"
    assert json.loads(new[3]) == ops


def test_services_read_raw_are_the_services_read_through_the_models(
    served: tuple[Server, Kube],
) -> None:
    state, kube = served
    state.answer(SERVICES, _list("ServiceList", SERVICE_BODIES))
    raw = kube.list_services(namespace=NS)
    assert raw == old_list_services(kube)
    assert [(s.name, s.headless) for s in raw] == [
        ("llm", False),
        ("llm-0-headless", True),
        ("dual", False),
        ("external", False),
        ("no-spec", False),
    ]
    assert raw[3].cluster_ip is None and raw[3].selector == {}


def test_endpoint_slices_read_raw_are_the_slices_read_through_the_models(
    served: tuple[Server, Kube],
) -> None:
    state, kube = served
    state.answer(SLICES, _list("EndpointSliceList", SLICE_BODIES))
    raw = kube.list_namespace_endpoint_slices(namespace=NS)
    assert raw == old_list_slices(kube)
    assert kube.list_endpoint_slices(namespace=NS, service="llm") == old_list_slices(
        kube, service="llm"
    )
    first = raw[0]
    assert [e.ready for e in first.endpoints] == [True, False, False, None, None]
    assert [e.target_uid for e in first.endpoints] == ["u0", "u1", "", "", ""]
    assert raw[1].addresses == ("fd00::a",)
    assert (raw[2].service, raw[2].ports, raw[3].endpoints) == ("", (), ())
    selected = [r[1] for r in state.requests if "labelSelector" in r[1]]
    assert len(selected) == 2 and selected[0] == selected[1]
    assert selected[0].endswith("?labelSelector=kubernetes.io/service-name%3Dllm")


def test_an_empty_list_and_a_list_without_items(served: tuple[Server, Kube]) -> None:
    state, kube = served
    state.answer(SERVICES, _list("ServiceList", []))
    assert kube.list_services(namespace=NS) == old_list_services(kube) == []
    state.answer(SLICES, {"kind": "EndpointSliceList", "items": None})
    assert kube.list_namespace_endpoint_slices(namespace=NS) == []


def test_fields_the_models_do_not_know_are_ignored(served: tuple[Server, Kube]) -> None:
    """A newer API server adds fields: the views read the same."""
    state, kube = served
    pod = copy.deepcopy(FULL_POD)
    pod["status"]["futureField"] = {"x": 1}
    pod["spec"]["containers"][0]["futureField"] = [1, 2]
    state.answer(f"{PODS}/llm-0", pod)
    assert kube.read_pod(namespace=NS, name="llm-0") == old_read_pod(kube, "llm-0")


def test_the_connection_goes_back_to_the_pool(served: tuple[Server, Kube]) -> None:
    """The unread response is read whole and released: one kept-alive connection serves
    every call (a response left holding its connection would open a new one each time)."""
    state, kube = served
    state.answer(PODS, _list("PodList", PODS_BODIES))
    state.answer(SLICES, _list("EndpointSliceList", SLICE_BODIES))
    for _ in range(5):
        kube.list_pods(namespace=NS, selector="app=llm")
        kube.list_namespace_endpoint_slices(namespace=NS)
    with pytest.raises(KubeError):
        kube.read_pod(namespace=NS, name="absent")
    kube.list_pods(namespace=NS, selector="app=llm")
    assert len(state.ports) == 12 and len(set(state.ports)) == 1


# ---------------------------------------------------------------- the same errors


CALLS: dict[str, tuple[Callable[[Kube], Any], Callable[[Kube], Any], str]] = {
    "list_pods": (
        lambda k: k.list_pods(namespace=NS, selector="app=llm"),
        old_list_pods,
        PODS,
    ),
    "read_pod": (
        lambda k: k.read_pod(namespace=NS, name="a"),
        lambda k: old_read_pod(k, "a"),
        f"{PODS}/a",
    ),
    "patch_pod": (
        lambda k: k.patch_pod(namespace=NS, name="a", ops=[]),
        lambda k: old_patch_pod(k, "a", []),
        f"{PODS}/a",
    ),
    "list_services": (lambda k: k.list_services(namespace=NS), old_list_services, SERVICES),
    "list_namespace_endpoint_slices": (
        lambda k: k.list_namespace_endpoint_slices(namespace=NS),
        old_list_slices,
        SLICES,
    ),
    "list_endpoint_slices": (
        lambda k: k.list_endpoint_slices(namespace=NS, service="llm"),
        lambda k: old_list_slices(k, service="llm"),
        SLICES,
    ),
}


def _status(code: int, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "status": "Failure",
            "message": message,
            "code": code,
        }
    ).encode()


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, _status(404, 'pods "a" not found')),
        (403, _status(403, "forbidden: cannot list")),
        (409, _status(409, "the object has been modified")),
        (422, _status(422, "the server rejected our request: testing value failed")),
        (410, _status(410, "too old resource version")),
        (429, _status(429, "too many requests")),
        (500, _status(500, "etcdserver: request timed out")),
        (503, b"service unavailable"),  # not a Status body
        (401, b""),
    ],
)
def test_errors_are_translated_as_before(
    served: tuple[Server, Kube], call: str, status: int, body: bytes
) -> None:
    state, kube = served
    new, old, path = CALLS[call]
    state.answers[path] = Answer(status, body)
    with pytest.raises(KubeError) as raw:
        new(kube)
    with pytest.raises(KubeError) as model:
        old(kube)
    assert type(raw.value) is type(model.value)
    got, want = raw.value, model.value
    assert (got.what, got.status, got.reason, got.detail) == (
        want.what,
        want.status,
        want.reason,
        want.detail,
    )
    assert str(got) == str(want) and got.status == status


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("broken", ["truncated", "stalled"])
def test_a_body_cut_short_is_unavailable_as_before(
    served: tuple[Server, Kube], call: str, broken: str
) -> None:
    """The body is read under the request's bounds and a failure while reading it is
    translated, as when the client read it before returning."""
    state, kube = served
    kube = Kube(api=kube.api, timeout_s=0.5)
    new, old, path = CALLS[call]
    state.answers[path] = Answer(200, json.dumps(_list("List", [])).encode(), broken=broken)
    with pytest.raises(Unavailable) as raw:
        new(kube)
    with pytest.raises(Unavailable) as model:
        old(kube)
    assert raw.value.what == model.value.what and raw.value.status == 0


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("body", [b"<html>proxy error</html>", b"[1, 2]", b'"x"', b""])
def test_an_answer_that_is_not_a_json_object_is_unavailable(
    served: tuple[Server, Kube], call: str, body: bytes
) -> None:
    """A 2xx whose body is not a JSON object is a garbled answer: ``Unavailable`` (worth
    asking again), never an unclassified error out of the layer (the models' path let a
    ``JSONDecodeError`` or a ``ValidationError`` escape)."""
    state, kube = served
    new, _old, path = CALLS[call]
    state.answers[path] = Answer(200, body)
    with pytest.raises(Unavailable) as info:
        new(kube)
    assert "not" in info.value.reason and "JSON" in info.value.reason


def test_the_views_are_built_without_the_generated_models(
    served: tuple[Server, Kube], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The point of issue 9: no answer of a poll goes through the models' decoding."""
    state, kube = served
    state.answer(PODS, _list("PodList", PODS_BODIES))
    state.answer(f"{PODS}/llm-0", FULL_POD)
    state.answer(SERVICES, _list("ServiceList", SERVICE_BODIES))
    state.answer(SLICES, _list("EndpointSliceList", SLICE_BODIES))

    def no_models(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("decoded through the generated models")

    monkeypatch.setattr(kube.api, "deserialize", no_models)
    assert len(kube.list_pods(namespace=NS, selector="app=llm")) == len(PODS_BODIES)
    assert kube.read_pod(namespace=NS, name="llm-0").uid == "uid-llm-0"
    assert kube.patch_pod(namespace=NS, name="llm-0", ops=[]).name == "llm-0"
    assert len(kube.list_services(namespace=NS)) == len(SERVICE_BODIES)
    assert len(kube.list_namespace_endpoint_slices(namespace=NS)) == len(SLICE_BODIES)
    assert len(kube.list_endpoint_slices(namespace=NS, service="llm")) == len(SLICE_BODIES)
