"""EMULATIONS of two routers that cannot be installed here, for tests (offline through
``httpx.MockTransport``, or on loopback through ``serve``; the bed may run them later).

They are emulations, not the real programs: each answers the wire format its real
counterpart is documented to answer (gpustack/gpustack-operator
``pack/llm-router/patches``, llm-d's endpoint picker), and nothing more.

- ``PatchedRouter``: a gpustack-patched vllm-router (``kind="vllm-router"``) or SGLang
  gateway (``kind="sglang-gateway"``).  ``GET /observer/endpoints`` answers
  ``{router: {boot_generation, now_ms}, registry_revision, workers: [{url, port, role,
  pod_hint, worker_id, selection: {registered, healthy, circuit_open, in_selection}}]}``:
  ``boot_generation`` is the process start in ms, ``now_ms`` the answer's time on the
  router's clock (``clock``: a test can set it back or forward), the revision grows when
  the serialized worker array differs from the one last served, workers come ordered by
  URL, ``port`` is the URL's port as a string (null without one), ``pod_hint`` the URL's
  host part.  The kind's own admin API is there too: vllm-router's ``GET /list_workers``,
  ``POST /remove_worker?url=`` and ``POST /add_worker?url=`` (both 200, the remove also
  for an unknown URL), and a GET of any other path answered as a worker engine would (404
  ``{"detail": "Not Found"}``: vllm-router forwards it); the gateway's ``GET /workers``,
  ``DELETE /workers/{id}`` (202) and ``POST /workers`` (202).  ``restart()`` is a new
  process: another boot generation, the revision counter from 1 again.
- ``EndpointPicker``: llm-d's EPP metrics server.  ``GET /metrics`` wants ``Authorization:
  Bearer <token>`` (none or an unknown token: 401, a token not allowed to read: 403) and
  answers the Prometheus text format, the per-endpoint series computed from its datastore
  at the moment of the scrape: ``inference_pool_per_pod_queue_size{model_server_pod,
  name}`` and ``llm_d_epp_per_endpoint_queue_size{model_server_endpoint, name}``, one
  endpoint ``<pod>-rank-<n>`` per target port, for every Pod that is Ready, not
  terminating and selected by the pool (a Pod that stops being so is gone from the next
  scrape), plus the pool-wide series.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

import httpx

Handler = Callable[[httpx.Request], httpx.Response]


def _port_of(url: str) -> str | None:
    """The URL's port as the patch derives it (digits after the host's last ``:``)."""
    rest = url.split("://", 1)[1] if "://" in url else url
    host = rest.split("/", 1)[0]
    if ":" not in host:
        return None
    port = host.rsplit(":", 1)[1]
    return port if port and port.isascii() and port.isdigit() else None


def _pod_hint(url: str) -> str:
    rest = url.split("://", 1)[1] if "://" in url else url
    return rest.replace("?", "/").split("/", 1)[0]


@dataclass
class EmulatedWorker:
    """One worker in a patched router's registry."""

    worker_id: str
    healthy: bool = True
    circuit_open: bool = False
    role: str = "regular"


class PatchedRouter:
    """A gpustack-patched vllm-router or SGLang gateway (see the module's docstring)."""

    def __init__(
        self,
        kind: str = "vllm-router",
        urls: tuple[str, ...] | list[str] = (),
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if kind not in ("vllm-router", "sglang-gateway"):
            raise ValueError(f"no patched build of {kind!r}")
        self.kind, self.clock = kind, clock
        self.workers: dict[str, EmulatedWorker] = {}
        self.calls: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._boot()
        for url in urls:
            self.add(url)

    def _boot(self) -> None:
        boot = int(self.clock() * 1000)
        previous = getattr(self, "boot_generation", None)
        self.boot_generation = boot if previous is None or boot > previous else previous + 1
        self._revision: int = 1
        self._served: str | None = None

    def restart(self) -> None:
        """A new router process: another boot generation, the revision from 1 again."""
        with self._lock:
            self._boot()

    def add(self, url: str) -> None:
        """Register ``url`` (what discovery or an add call does)."""
        self.workers.setdefault(url, EmulatedWorker(worker_id=str(uuid.uuid4())))

    def document(self) -> dict[str, Any]:
        """The ``/observer/endpoints`` answer, now."""
        with self._lock:
            workers = [
                {
                    "url": url,
                    "port": _port_of(url),
                    "role": w.role,
                    "pod_hint": _pod_hint(url),
                    "worker_id": w.worker_id,
                    "selection": {
                        "registered": True,
                        "healthy": w.healthy,
                        "circuit_open": w.circuit_open,
                        "in_selection": w.healthy and not w.circuit_open,
                    },
                }
                for url, w in sorted(self.workers.items())
            ]
            served = json.dumps(workers, sort_keys=True)
            if served != self._served:
                self._served = served
                self._revision += 1
            return {
                "router": {"boot_generation": self.boot_generation, "now_ms": self._now_ms()},
                "registry_revision": self._revision,
                "workers": workers,
            }

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request as the patched router does."""
        method, path = request.method, request.url.path
        self.calls.append((method, path))
        if method == "GET" and path == "/observer/endpoints":
            return httpx.Response(200, json=self.document())
        if self.kind == "vllm-router":
            return self._vllm(request)
        return self._gateway(request)

    def _vllm(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        url = request.url.params.get("url", "")
        if method == "GET" and path == "/list_workers":
            return httpx.Response(200, json={"urls": sorted(self.workers)})
        if method == "POST" and path == "/remove_worker":
            self.workers.pop(url, None)
            return httpx.Response(200, text=f"Successfully removed worker: {url}")
        if method == "POST" and path == "/add_worker":
            if url in self.workers:
                return httpx.Response(400, text=f"Worker {url} already exists")
            self.add(url)
            return httpx.Response(200, text=f"Successfully added worker: {url}")
        if method == "GET":  # forwarded to a worker engine, which knows no such path
            return httpx.Response(404, json={"detail": "Not Found"})
        return httpx.Response(405)

    def _gateway(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        if method == "GET" and path == "/workers":
            items = [{"id": w.worker_id, "url": u} for u, w in sorted(self.workers.items())]
            return httpx.Response(200, json={"workers": items, "total": len(items)})
        if method == "DELETE" and path.startswith("/workers/"):
            wid = unquote(path[len("/workers/") :])
            self.workers = {u: w for u, w in self.workers.items() if w.worker_id != wid}
            return httpx.Response(202, json={"status": "accepted", "worker_id": wid})
        if method == "POST" and path == "/workers":
            url = json.loads(request.content or b"{}").get("url", "")
            self.add(url)
            return httpx.Response(202, json={"status": "accepted", "url": url})
        return httpx.Response(404)


@dataclass
class PickerPod:
    """One Pod as the picker's datastore sees it."""

    ready: bool = True
    terminating: bool = False
    selected: bool = True  # matches the pool's selector
    queue: int = 0


class EndpointPicker:
    """llm-d's endpoint picker's metrics server (see the module's docstring)."""

    def __init__(
        self,
        pool: str = "pool",
        *,
        tokens: dict[str, bool] | None = None,
        target_ports: int = 1,
    ) -> None:
        self.pool, self.target_ports = pool, target_ports
        #: Bearer tokens the API server would authenticate -> allowed to read /metrics.
        self.tokens = {"reader-token": True} if tokens is None else dict(tokens)
        self.pods: dict[str, PickerPod] = {}
        self.scrapes: list[httpx.Request] = []

    def endpoints(self) -> list[str]:
        """The endpoints in the datastore now."""
        return [
            f"{name}-rank-{rank}"
            for name, p in sorted(self.pods.items())
            if p.ready and not p.terminating and p.selected
            for rank in range(self.target_ports)
        ]

    def exposition(self) -> str:
        """The ``/metrics`` body, computed from the datastore now."""
        live = self.endpoints()
        queue = {e: self.pods[e.rsplit("-rank-", 1)[0]].queue for e in live}
        pool = f'name="{self.pool}"'
        lines = [
            "# HELP inference_pool_average_queue_size Average number of pending requests.",
            "# TYPE inference_pool_average_queue_size gauge",
            f"inference_pool_average_queue_size{{{pool}}} "
            f"{sum(queue.values()) / len(queue) if queue else 0:g}",
            "# HELP inference_pool_per_pod_queue_size Total queue size per model server pod.",
            "# TYPE inference_pool_per_pod_queue_size gauge",
            *(
                f'inference_pool_per_pod_queue_size{{model_server_pod="{e}",{pool}}} {q}'
                for e, q in queue.items()
            ),
            "# HELP inference_pool_ready_pods Number of ready pods in the inference pool.",
            "# TYPE inference_pool_ready_pods gauge",
            f"inference_pool_ready_pods{{{pool}}} {len(live)}",
            "# HELP llm_d_epp_per_endpoint_queue_size Queue size per model server endpoint.",
            "# TYPE llm_d_epp_per_endpoint_queue_size gauge",
            *(
                f'llm_d_epp_per_endpoint_queue_size{{model_server_endpoint="{e}",{pool}}} {q}'
                for e, q in queue.items()
            ),
            "# HELP llm_d_epp_ready_endpoints Number of ready endpoints.",
            "# TYPE llm_d_epp_ready_endpoints gauge",
            f"llm_d_epp_ready_endpoints{{{pool}}} {len(live)}",
            "# HELP llm_d_epp_info General information about the build.",
            "# TYPE llm_d_epp_info gauge",
            'llm_d_epp_info{build_ref="emulated",commit="emulated"} 1',
        ]
        return "\n".join(lines) + "\n"

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request as the picker's metrics server does."""
        if request.url.path != "/metrics" or request.method != "GET":
            return httpx.Response(404, text="404 page not found\n")
        self.scrapes.append(request)
        auth = request.headers.get("authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        if token is None or token not in self.tokens:
            return httpx.Response(401, text="Unauthorized\n")
        if not self.tokens[token]:
            return httpx.Response(403, text="Forbidden\n")
        return httpx.Response(
            200,
            text=self.exposition(),
            headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"},
        )


@contextmanager
def serve(handler: Handler, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Answer HTTP on ``host``:``port`` (0: any free port) with ``handler``; yields the base
    URL, and stops the server on exit.  Loopback (or the bed's namespace) only."""

    class _Request(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            request = httpx.Request(
                self.command,
                f"http://{host}{self.path}",
                headers=list(self.headers.items()),
                content=self.rfile.read(length) if length else b"",
            )
            response = handler(request)
            body = response.read()
            self.send_response(response.status_code)
            for key, value in response.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(key, value)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = do_PUT = _answer

        def log_message(self, format: str, *args: Any) -> None:
            """Quiet: tests read the emulation's own call log."""

    server = ThreadingHTTPServer((host, port), _Request)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="router-emulation", daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
