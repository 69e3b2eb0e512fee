"""HTTP plumbing shared by the engines and the hub: a cuttable threaded server, a handler
that hands every method to an app, and the body/response/SSE helpers.

The server remembers its open connections so that stopping an emulated container can cut
in-flight responses mid-way, as a killed process would.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import selectors
import socket
import socketserver
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol, cast
from urllib.parse import urlsplit

__all__ = [
    "MAX_BODY",
    "App",
    "BadRequest",
    "Cut",
    "Handler",
    "Refused",
    "Server",
    "StreamWriter",
    "end_stream",
    "error_body",
    "read_body",
    "read_json",
    "send_bytes",
    "send_json",
    "start_stream",
    "write_event",
]

MAX_BODY = 16 * 1024 * 1024
"""The largest request body read (chunked or with a Content-Length)."""


class Cut(Exception):
    """The emulated process went away: close the connection without a response."""


class BadRequest(Exception):
    """The client sent something the emulated API rejects (HTTP 400, the emulator's own
    flat error shape: the hub's control API and the emulator-only fields)."""


class Refused(Exception):
    """The emulated engine answers with an error of its own: ``status`` and ``body`` as
    the real engine sends them (``body`` is JSON, or plain text when it is a ``str``).

    :mod:`testbed.emulator.intake` raises it, citing the real source of each answer.
    """

    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class App(Protocol):
    """What a server dispatches requests to."""

    def handle(self, handler: Handler, method: str) -> None:
        """Answer one request on ``handler``."""


class Server(ThreadingHTTPServer):
    """A threaded HTTP server that remembers its open connections so they can be cut.

    It waits for connections without polling: ``socketserver``'s loop wakes every
    ``poll_interval`` to see whether it should stop, and a hub of 400 engines, each with
    its own server, woke 8,000 times a second doing nothing (~22 CPU s of a worker
    benchmark run at N = 200, on the cores the measured worker shares).  Here the loop
    sleeps until a connection arrives or ``shutdown`` wakes it through a pipe."""

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], app: App) -> None:
        """Bind ``address`` (IPv4 or IPv6 literal or name) and dispatch to ``app``."""
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._stop = threading.Event()
        self._stopped = threading.Event()
        self._stopped.set()  # not serving: a shutdown now returns at once
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, Handler)

    def serve_forever(self, poll_interval: float | None = None) -> None:
        """Handle requests until ``shutdown`` (``poll_interval``: a backstop wake-up only;
        None, the default: none).  A shutdown that came first ends it before it touches
        anything (the server may be closed by then)."""
        self._stopped.clear()
        try:
            if self._stop.is_set():
                return
            with selectors.DefaultSelector() as sel:
                sel.register(self, selectors.EVENT_READ)
                sel.register(self._wake_r, selectors.EVENT_READ)
                while not self._stop.is_set():
                    ready = sel.select(poll_interval)
                    if self._stop.is_set():
                        break
                    for key, _ in ready:
                        if key.fileobj is self:
                            # socketserver's own step (accept, never block; not in typeshed)
                            cast(Any, self)._handle_request_noblock()
                        else:
                            self._drain()  # an earlier shutdown's wake-up, left unread
                    self.service_actions()
        finally:
            self._stop.clear()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` and wait until it has returned (from another thread)."""
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._stopped.wait()

    def server_close(self) -> None:
        """Close the listening socket and the wake-up pipe (its descriptors are forgotten:
        never read or written again, whatever reuses their numbers)."""
        super().server_close()
        fds, (self._wake_r, self._wake_w) = (self._wake_r, self._wake_w), (-1, -1)
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _drain(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 512):
                pass

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server_address[1])

    def track(self, conn: socket.socket) -> None:
        """Remember an accepted connection."""
        with self._conns_lock:
            self._conns.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        """Forget a connection that is being closed."""
        with self._conns_lock:
            self._conns.discard(conn)

    def cut_all(self) -> None:
        """Shut down every open connection (in-flight responses end incomplete)."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def server_bind(self) -> None:
        """Bind without the reverse DNS lookup ``HTTPServer.server_bind`` does."""
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet: cut connections and client disconnects are expected here."""


class Handler(BaseHTTPRequestHandler):
    """Request handler that hands every method to the server's app."""

    protocol_version = "HTTP/1.1"
    server_version = "emulated-engine/1"
    sys_version = ""
    #: The emulated server process that accepted this connection (vLLM may run several
    #: API server processes on one socket); set by the app on first use.
    process: int | None = None

    @property
    def srv(self) -> Server:
        """The owning server, typed."""
        return cast(Server, self.server)

    def setup(self) -> None:
        """Register the connection so a stop can cut it."""
        super().setup()
        self.srv.track(self.connection)

    def finish(self) -> None:
        """Unregister the connection."""
        self.srv.untrack(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Do not log each request."""

    def _dispatch(self, method: str) -> None:
        """Run the app; on a cut, close the connection without writing anything more."""
        try:
            self.srv.app.handle(self, method)
        except Cut:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except BadRequest as exc:
            send_json(self, 400, error_body(str(exc), 400))
        except Refused as exc:
            if isinstance(exc.body, str):
                send_bytes(self, exc.status, exc.body.encode(), "text/plain; charset=utf-8")
            else:
                send_json(self, exc.status, exc.body)
        except OSError:
            self.close_connection = True

    def do_GET(self) -> None:
        """Dispatch GET."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """Dispatch POST."""
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        """Dispatch DELETE."""
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        """Dispatch PUT."""
        self._dispatch("PUT")

    @property
    def route(self) -> str:
        """The request path without the query string."""
        return urlsplit(self.path).path


def error_body(message: str, code: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"object": "error", "message": message, "type": "BadRequestError", "code": code}


def send_bytes(
    handler: Handler,
    status: int,
    body: bytes,
    content_type: str,
    headers: dict[str, str] | None = None,
) -> None:
    """Write a complete response with a Content-Length."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


def send_chunked(handler: Handler, status: int, body: bytes, content_type: str) -> None:
    """Write a complete response chunked, in one chunk and the last, as uvicorn frames an
    ASGI answer that names no length (prometheus_client's ``make_asgi_app``, which both
    engines mount at ``/metrics``: ``tests/unit/test_oneshot_uvicorn.py`` shows uvicorn's
    two parsers doing so)."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()
    if body:
        _write_chunk(handler, body)
    handler.wfile.write(b"0\r\n\r\n")


def send_json(handler: Handler, status: int, obj: Any) -> None:
    """Write a JSON response."""
    send_bytes(handler, status, json.dumps(obj).encode(), "application/json")


def read_body(handler: Handler) -> bytes:
    """Read the request body (Content-Length or chunked)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        total = 0
        while True:
            line = handler.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError as exc:
                raise BadRequest("bad chunked body") from exc
            if size == 0:
                while handler.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            total += size
            if total > MAX_BODY:
                raise BadRequest("body too large")
            parts.append(handler.rfile.read(size))
            handler.rfile.readline(1024)
    length_text = handler.headers.get("Content-Length", "0")
    try:
        length = int(length_text)
    except ValueError as exc:
        raise BadRequest("bad Content-Length") from exc
    if length < 0 or length > MAX_BODY:
        raise BadRequest("bad Content-Length")
    return handler.rfile.read(length) if length else b""


def read_json(handler: Handler) -> dict[str, Any]:
    """Read a JSON object body (an empty body is ``{}``)."""
    raw = read_body(handler)
    if not raw.strip():
        return {}
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadRequest("body must be a JSON object")
    return obj


def start_stream(handler: Handler) -> None:
    """Send the headers of a chunked Server-Sent-Events response."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def _write_chunk(handler: Handler, data: bytes) -> None:
    """Write one HTTP chunk."""
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def write_event(handler: Handler, obj: Any) -> None:
    """Write one SSE ``data:`` event as a chunk."""
    payload = obj if isinstance(obj, str) else json.dumps(obj)
    _write_chunk(handler, f"data: {payload}\n\n".encode())


def end_stream(handler: Handler) -> None:
    """Write ``data: [DONE]`` and the last chunk."""
    write_event(handler, "[DONE]")
    handler.wfile.write(b"0\r\n\r\n")


_END = object()


class StreamWriter:
    """Writes one SSE response's events from a thread of its own, so the engine's work
    never waits for the client: what the engine produced is queued, as the real engines'
    HTTP front ends queue a request's outputs (vLLM's output processor, SGLang's tokenizer
    manager) while the engine goes on. A slow reader holds only the response, not the
    engine's accounting: the engine can be done (its gauges down, its counters moved)
    while the last chunks are still being written.

    The headers must have been sent (:func:`start_stream`) before the first :meth:`put`.
    A failed write (the client went away, the connection was cut) is kept and raised by
    the next :meth:`put` or by :meth:`finish`."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="emulator-stream", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if self._error is not None:
                continue
            try:
                if isinstance(item, bytes):
                    self._handler.wfile.write(item)
                else:
                    write_event(self._handler, item)
            except OSError as exc:
                self._error = exc

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, *events: Any) -> None:
        """Queue SSE events; raises the write error if a write already failed."""
        self._raise()
        for event in events:
            self._queue.put(event)

    def finish(self) -> None:
        """Queue ``data: [DONE]`` and the last chunk, and wait until everything was
        written (or a write failed: raised here)."""
        self._raise()
        self._queue.put("[DONE]")
        self._queue.put(b"0\r\n\r\n")
        self._queue.put(_END)
        self._thread.join()
        self._raise()

    def abandon(self) -> None:
        """Stop writing (the request was cut): the thread drops what is left and ends."""
        if self._error is None:
            self._error = OSError("abandoned")
        self._queue.put(_END)
