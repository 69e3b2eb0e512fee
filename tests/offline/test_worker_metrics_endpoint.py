"""The worker's only HTTP endpoint, ``/metrics`` (``--metrics-address``), keeps answering
while clients stall it (issue 22, "the health server has no timeouts").

The worker has no Python HTTP server: its ``/metrics`` is served by the Temporal SDK's
runtime (``worker.telemetry``: Rust, asynchronous), so a stalled connection costs no thread.
This holds it: 300 connections that never finish their request and 300 that send nothing
stay open, and a scrape still answers at once, with no thread added to the process.  (The
watcher's ``/healthz`` server is ``http.server``'s, one thread per connection with no
timeout: not the worker's, reported in issue 22's hand-back.)
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx

from testbed.procs import free_port
from worker.telemetry import runtime_serving_metrics

STALLED = 300


def test_a_scrape_answers_while_hundreds_of_connections_stall() -> None:
    port = free_port()
    runtime = runtime_serving_metrics(f"127.0.0.1:{port}")
    url = f"http://127.0.0.1:{port}/metrics"
    with httpx.Client(trust_env=False, timeout=5) as http:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert http.get(url).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the runtime never served /metrics"
                time.sleep(0.1)
        threads = threading.active_count()
        held: list[socket.socket] = []
        try:
            for _ in range(STALLED):
                s = socket.create_connection(("127.0.0.1", port))
                s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # never finished
                held.append(s)
                held.append(socket.create_connection(("127.0.0.1", port)))  # says nothing
            started = time.monotonic()
            answer = http.get(url)
            took = time.monotonic() - started
        finally:
            for s in held:
                with contextlib.suppress(OSError):
                    s.close()
    assert answer.status_code == 200
    assert took < 1.0, f"{took:.2f} s with {2 * STALLED} stalled connections"
    assert threading.active_count() <= threads + 1
    del runtime
