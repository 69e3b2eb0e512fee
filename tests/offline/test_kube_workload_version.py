"""The Kueue Workload API version is discovered, never assumed (``Kube.workload_api``):
against a loopback HTTP server that answers the API server's discovery and Workload paths
the way a cluster with a given Kueue does."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from kubernetes import client

from kube.client import Kube
from kube.errors import NotFound


class Cluster:
    """What the fake API server serves: Kueue's versions (preferred first), or none."""

    def __init__(self) -> None:
        self.versions: list[str] = []
        self.paths: list[str] = []


def _group(name: str, versions: list[str]) -> dict[str, Any]:
    gv = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
    return {"name": name, "versions": gv, "preferredVersion": gv[0]}


@pytest.fixture
def cluster() -> Iterator[tuple[Cluster, Kube]]:
    state = Cluster()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.paths.append(self.path)
            path = self.path.split("?")[0].rstrip("/")
            workloads = [
                f"/apis/kueue.x-k8s.io/{v}/namespaces/ns/workloads" for v in state.versions
            ]
            one = [f"{w}/w" for w in workloads]
            if path == "/apis":
                groups = [_group("apps", ["v1"])]
                if state.versions:
                    groups.append(_group("kueue.x-k8s.io", state.versions))
                body: dict[str, Any] = {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": groups,
                }
            elif path in workloads:
                body = {"items": [{"metadata": {"name": "w", "uid": "u", "ownerReferences": []}}]}
            elif path in one:
                body = {"metadata": {"name": "w", "uid": "u", "ownerReferences": []}}
            else:
                data = b'{"kind":"Status","code":404,"message":"not found"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_port}"
    cfg.proxy = None
    try:
        yield state, Kube(api=client.ApiClient(cfg), timeout_s=5)
    finally:
        server.shutdown()


@pytest.mark.parametrize(
    ("served", "used"),
    [
        (["v1beta2", "v1beta1"], "v1beta2"),  # Kueue v0.17: prefers v1beta2
        (["v1beta1"], "v1beta1"),  # an older Kueue
        (["v1"], "v1"),  # a newer one serving only v1 is not "no Kueue"
    ],
)
def test_the_preferred_workload_version_is_used(
    cluster: tuple[Cluster, Kube], served: list[str], used: str
) -> None:
    state, kube = cluster
    state.versions = served
    (w,) = kube.list_workloads(namespace="ns")
    assert (w.name, w.uid) == ("w", "u")
    assert f"/apis/kueue.x-k8s.io/{used}/namespaces/ns/workloads" in state.paths
    assert kube.workload_api() == ("kueue.x-k8s.io", used, "workloads")


def test_no_kueue_group_reads_not_found(cluster: tuple[Cluster, Kube]) -> None:
    _state, kube = cluster
    with pytest.raises(NotFound):
        kube.list_workloads(namespace="ns")


def test_the_discovered_version_is_cached(cluster: tuple[Cluster, Kube]) -> None:
    state, kube = cluster
    state.versions = ["v1beta2", "v1beta1"]
    for _ in range(3):
        kube.list_workloads(namespace="ns")
    assert len([p for p in state.paths if p.rstrip("/") == "/apis"]) == 1


def test_a_version_no_longer_served_is_discovered_again_not_read_as_gone(
    cluster: tuple[Cluster, Kube],
) -> None:
    """Kueue is upgraded under a running worker: the cached version stops being served, and
    its 404 is not the Workload being gone (a retirement would leave it holding the quota,
    and its Pods behind Kueue's finalizer): the version is discovered again, once."""
    state, kube = cluster
    state.versions = ["v1beta1"]
    assert kube.get_workload(namespace="ns", name="w").uid == "u"
    state.versions = ["v1beta2"]  # v1beta1 is no longer served
    assert kube.get_workload(namespace="ns", name="w").uid == "u"
    (w,) = kube.list_workloads(namespace="ns")
    assert w.uid == "u"
    assert kube.workload_api() == ("kueue.x-k8s.io", "v1beta2", "workloads")
    assert len([p for p in state.paths if p.rstrip("/") == "/apis"]) == 2


def test_a_workload_that_is_gone_still_reads_not_found(cluster: tuple[Cluster, Kube]) -> None:
    """The same version discovered again: the 404 is the Workload's own."""
    state, kube = cluster
    state.versions = ["v1beta2", "v1beta1"]
    with pytest.raises(NotFound):
        kube.get_workload(namespace="ns", name="other")
    assert len([p for p in state.paths if p.rstrip("/") == "/apis"]) == 2
