"""The emulator's HTTP server loop waits for connections without polling: it answers
requests, a shutdown wakes it at once (through its pipe), a shutdown before it serves
returns at once, and a stopped server can be served again; it never asks its selector
for a timed wake-up (``socketserver``'s 50 ms poll made 400 idle servers use ~0.1 core)."""

from __future__ import annotations

import selectors
import threading
import time
from typing import Any

import httpx
import pytest

from testbed.emulator import wire
from testbed.emulator.wire import Handler, Server, send_json


class Hello:
    def handle(self, handler: Handler, method: str) -> None:
        send_json(handler, 200, {"method": method, "path": handler.route})


def serving(server: Server) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


def test_it_answers_and_a_shutdown_wakes_it_at_once() -> None:
    server = Server(("127.0.0.1", 0), Hello())
    try:
        thread = serving(server)
        with httpx.Client(trust_env=False) as http:
            r = http.get(f"http://127.0.0.1:{server.port}/health")
        assert r.status_code == 200 and r.json() == {"method": "GET", "path": "/health"}
        time.sleep(0.3)  # idle: the loop sleeps in select with no timeout
        t = time.monotonic()
        server.shutdown()
        assert time.monotonic() - t < 2.0
        thread.join(timeout=1)
        assert not thread.is_alive()
        # Served again after a shutdown (the hub's engines restart their servers).
        thread = serving(server)
        with httpx.Client(trust_env=False) as http:
            assert http.post(f"http://127.0.0.1:{server.port}/x").json()["method"] == "POST"
        server.shutdown()
        thread.join(timeout=1)
        assert not thread.is_alive()
    finally:
        server.server_close()


def test_a_shutdown_before_it_serves_returns_at_once_and_ends_that_serve_untouched() -> None:
    server = Server(("127.0.0.1", 0), Hello())
    try:
        t = time.monotonic()
        server.shutdown()  # socketserver's waits forever here
        assert time.monotonic() - t < 2.0
        server.serve_forever()  # returns at once: the shutdown came first
        # The shutdown's wake-up byte is read and ignored by the next serve, which answers.
        thread = serving(server)
        with httpx.Client(trust_env=False) as http:
            assert http.get(f"http://127.0.0.1:{server.port}/").status_code == 200
        server.shutdown()
        thread.join(timeout=1)
        assert not thread.is_alive()
    finally:
        server.server_close()
    # Shut down and closed before the thread ran: its serve touches nothing closed.
    closed = Server(("127.0.0.1", 0), Hello())
    closed.shutdown()
    closed.server_close()
    closed.serve_forever()


def test_it_never_asks_for_a_timed_wake_up(monkeypatch: pytest.MonkeyPatch) -> None:
    timeouts: list[Any] = []

    class Recording(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
        def select(self, timeout: float | None = None) -> Any:
            timeouts.append(timeout)
            return super().select(timeout)

    monkeypatch.setattr(wire.selectors, "DefaultSelector", Recording)
    server = Server(("127.0.0.1", 0), Hello())
    try:
        thread = serving(server)
        for _ in range(3):
            with httpx.Client(trust_env=False) as http:
                assert http.get(f"http://127.0.0.1:{server.port}/").status_code == 200
        time.sleep(0.2)
        server.shutdown()
        thread.join(timeout=1)
    finally:
        server.server_close()
    assert timeouts and all(t is None for t in timeouts), timeouts
