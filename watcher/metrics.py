"""The watcher's Prometheus metrics (its own registry) and its health endpoint."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


@dataclass
class WatcherMetrics:
    """Intents seen, started, refused by reason, pending, backing off; watch restarts and
    events; reconciles and their duration; Temporal RPCs by call; the queue's depth;
    deployments whose reconcile failed (by error type), and each deployment whose last
    reconcile failed; the last healthy pass; terminated retirements read (by what they left
    unlabelled); the retirements that hold now, by deployment (from Temporal's visibility).

    Every counter's name ends in ``_total`` (prometheus_client serves it under that name).
    The per-deployment gauges ``failing`` and ``held`` carry only the deployments that
    fail or hold now: a series is removed, never left at 0 or 1, once that stops."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        # Long (over 60 lines) by design: one declaration per metric, nothing else, and
        # the metric names are easiest to review together.
        r = self.registry
        self.intents_seen = Counter(
            "retire_watcher_intents_seen_total", "Intents derived", registry=r
        )
        self.started = Counter(
            "retire_watcher_retirements_started_total", "Retirements started", registry=r
        )
        self.refused = Counter(
            "retire_watcher_starts_refused_total", "Starts refused", ["reason"], registry=r
        )
        self.pending = Gauge(
            "retire_watcher_intents_pending",
            "Intents waiting their turn",
            ["deployment"],
            registry=r,
        )
        self.watch_restarts = Counter(
            "retire_watcher_watch_restarts_total", "Watch restarts", ["resource"], registry=r
        )
        self.labels_set = Counter(
            "retire_watcher_eligibility_changes_total",
            "Eligibility label changes",
            ["value"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "retire_watcher_reconcile_seconds",
            "Duration of one deployment's reconcile",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
        self.reconciles = Counter(
            "retire_watcher_reconciles_total", "Deployments reconciled successfully", registry=r
        )
        self.temporal_calls = Counter(
            "retire_watcher_temporal_calls_total",
            "Temporal RPCs made, by call",
            ["call"],
            registry=r,
        )
        self.watch_events = Counter(
            "retire_watcher_watch_events_total",
            "Watch events applied to the cache, by resource",
            ["resource"],
            registry=r,
        )
        self.queue_depth = Gauge(
            "retire_watcher_queue_depth", "Deployments waiting to be reconciled", registry=r
        )
        self.backing_off = Gauge(
            "retire_watcher_intents_backing_off",
            "Refused intents waiting out their back-off",
            ["deployment"],
            registry=r,
        )
        self.reconcile_errors = Counter(
            "retire_watcher_reconcile_errors_total",
            "Deployments whose reconcile failed, by error type",
            ["error"],
            registry=r,
        )
        self.last_healthy_pass = Gauge(
            "retire_watcher_last_healthy_pass_timestamp_seconds",
            "When the last healthy reconcile pass ended",
            registry=r,
        )
        self.leader = Gauge("retire_watcher_is_leader", "1 while this watcher leads", registry=r)
        self.terminated = Counter(
            "retire_watcher_retirements_terminated_total",
            "Retirements read as terminated (restore skipped), by the admitted members left "
            "without the eligibility label: none, single (the watcher relabels them), group "
            "(a person must act)",
            ["left_unlabelled"],
            registry=r,
        )
        for left in ("none", "single", "group"):  # every series from 0: increase() sees the 1st
            self.terminated.labels(left_unlabelled=left)
        self.failing = Gauge(
            "retire_watcher_deployment_failing",
            "1 while the deployment's last reconcile failed (the series is removed once one "
            "succeeds)",
            ["deployment"],
            registry=r,
        )
        self.held = Gauge(
            "retire_watcher_retirement_held",
            "1 while the deployment's retirement holds (aborted, the replica kept), read from "
            "Temporal's visibility (the series is removed once it no longer holds)",
            ["deployment"],
            registry=r,
        )
        self._held: set[str] = set()

    def reconciled(self, deployment: str, *, failed: bool) -> None:
        """The reconcile of ``deployment`` (``ns/name``) ended, ``failed`` or not."""
        if failed:
            self.failing.labels(deployment=deployment).set(1)
        else:
            with contextlib.suppress(KeyError):  # no series: it did not fail
                self.failing.remove(deployment)

    def show_held(self, deployments: Iterable[str]) -> None:
        """The deployments (``ns/name``) whose retirement holds now: 1 each; the series of
        one that held at the last call and holds no longer is removed."""
        now = set(deployments)
        for gone in self._held - now:
            with contextlib.suppress(KeyError):
                self.held.remove(gone)
        for dep in now:
            self.held.labels(deployment=dep).set(1)
        self._held = now


@dataclass
class Health:
    """Liveness and readiness, set by the watcher's loops.

    Ready means a healthy reconcile pass ended within the last ``stale_after_s`` seconds
    (the acting loop sets it to three resync periods), or this watcher is a standby (it
    serves by waiting for the lease)."""

    alive: bool = True
    standby: bool = False
    stale_after_s: float = 15.0
    last_healthy_pass: float | None = None
    clock: Callable[[], float] = time.monotonic

    def pass_healthy(self) -> None:
        """A reconcile pass ended healthy now."""
        self.last_healthy_pass = self.clock()

    @property
    def ready(self) -> bool:
        """Whether ``/readyz`` answers ready."""
        if self.standby:
            return True
        last = self.last_healthy_pass
        return last is not None and self.clock() - last <= self.stale_after_s


#: How long the health server waits on one connection's request line and headers, and
#: how many connections it serves at once: a client that connects and sends nothing (or a
#: flood of them) holds a thread each until then, never the server.
HEALTH_TIMEOUT_S = 5.0
HEALTH_CONNECTIONS = 16


class _BoundedServer(ThreadingHTTPServer):
    """A threading HTTP server that serves at most ``HEALTH_CONNECTIONS`` connections at
    once; one over the bound is closed at once (a probe retries)."""

    daemon_threads = True
    #: The listen backlog (socketserver's default is 5: a burst of connections then has
    #: its SYNs dropped and retried for seconds, a probe among them).
    request_queue_size = 128

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._slots = threading.BoundedSemaphore(HEALTH_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


def serve_health(
    metrics: WatcherMetrics, health: Health, *, host: str, port: int
) -> ThreadingHTTPServer:
    """Serve ``/healthz``, ``/readyz`` and ``/metrics`` in a daemon thread, each connection
    bounded in time (``HEALTH_TIMEOUT_S``) and in number (``HEALTH_CONNECTIONS``)."""

    class Handler(BaseHTTPRequestHandler):
        timeout = HEALTH_TIMEOUT_S

        def do_GET(self) -> None:
            if self.path == "/metrics":
                body, code = generate_latest(metrics.registry), 200
            elif self.path == "/healthz":
                body, code = b"ok\n" if health.alive else b"dead\n", 200 if health.alive else 500
            elif self.path == "/readyz":
                body, code = (b"ready\n", 200) if health.ready else (b"not ready\n", 503)
            else:
                body, code = b"not found\n", 404
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = _BoundedServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server
