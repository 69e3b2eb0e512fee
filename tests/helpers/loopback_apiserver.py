"""A loopback HTTP server that answers like the API server, for offline tests of the real
``kube.client.Kube``: canned answers by path, every request recorded, and answers that
can be broken (truncated, stalled) or held until a test lets them go."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client

from kube.client import Kube

NOT_FOUND = b'{"kind":"Status","code":404,"message":"the server could not find it"}'


@dataclass
class Answer:
    """What the server answers on one path: a status and a body, or a broken answer."""

    status: int = 200
    body: bytes = b"{}"
    #: "truncated": Content-Length promises more than is sent, then the connection closes;
    #: "stalled": the headers, then nothing until the client gives up.
    broken: str = ""
    #: When set, the answer is sent only once this event is set (the request is in flight).
    hold: threading.Event | None = None


@dataclass
class Server:
    """The fake API server's answers (by path, without the query) and what it was asked."""

    #: One answer for every request of a path, or a sequence: each request takes the next,
    #: the last one repeats.
    answers: dict[str, Answer | list[Answer]] = field(default_factory=dict)
    #: (method, full path, Content-Type, body) of every request, as it arrived.
    requests: list[tuple[str, str, str, bytes]] = field(default_factory=list)
    #: Client ports of every request: one port for many requests is one kept-alive
    #: connection that went back to the pool.
    ports: list[int] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str, body: Any, status: int = 200) -> None:
        self.answers[path] = Answer(status, json.dumps(body).encode())

    def take(self, path: str) -> Answer:
        """The answer of the next request of ``path`` (recorded under the lock)."""
        found = self.answers.get(path)
        if isinstance(found, list):
            return found.pop(0) if len(found) > 1 else found[0]
        return found or Answer(404, NOT_FOUND)


@contextmanager
def loopback_kube(*, connections: int = 1) -> Iterator[tuple[Server, Kube]]:
    """A ``Kube`` talking to a fresh loopback server (no retries, 5 s request bound)."""
    state = Server()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the API server

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            with state.lock:
                state.requests.append(
                    (self.command, self.path, self.headers.get("Content-Type") or "", body)
                )
                state.ports.append(self.client_address[1])
                answer = state.take(self.path.split("?")[0])
            if answer.hold is not None:
                answer.hold.wait(10)
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            promised = len(answer.body) + (100 if answer.broken == "truncated" else 0)
            self.send_header("Content-Length", str(promised))
            self.end_headers()
            if answer.broken == "stalled":
                self.wfile.flush()
                state.release.wait(10)
                self.close_connection = True
                return
            self.wfile.write(answer.body)
            if answer.broken == "truncated":
                self.close_connection = True

        do_GET = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_port}"
    cfg.proxy = None
    cfg.retries = False
    cfg.connection_pool_maxsize = connections
    try:
        yield state, Kube(api=client.ApiClient(cfg), timeout_s=5)
    finally:
        state.release.set()
        server.shutdown()
