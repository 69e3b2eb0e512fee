"""The watcher's health server under clients that connect and send nothing: each such
connection is dropped after ``HEALTH_TIMEOUT_S``, at most ``HEALTH_CONNECTIONS`` are
served at once, and a probe still gets its answer."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from watcher import metrics as watcher_metrics
from watcher.metrics import Health, WatcherMetrics, serve_health


def _threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name != "health")


def test_stalled_connections_do_not_hold_the_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watcher_metrics, "HEALTH_TIMEOUT_S", 0.5, raising=False)
    health = Health()
    health.alive = True
    server = serve_health(WatcherMetrics(), health, host="127.0.0.1", port=0)
    port = server.server_address[1]
    before = _threads()
    stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
    try:
        time.sleep(0.3)
        # At most the bound of threads serve them; a probe over the bound may be closed,
        # but one gets through once the stalled ones time out.
        assert _threads() - before <= watcher_metrics.HEALTH_CONNECTIONS + 2
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError:
                assert time.monotonic() < deadline, "the health server never answered"
                time.sleep(0.2)
        time.sleep(1.0)
        assert _threads() - before <= 2  # the stalled connections timed out
    finally:
        for s in stalled:
            s.close()
        server.shutdown()
