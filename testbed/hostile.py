"""A hostile HTTP peer, for tests only: what a tenant's Pod labelled as a router, or a
member's engine, could answer to the worker's HTTP calls.

Modes (``MODES``), each answering every request on the connection the same way:

- ``endless``: 200 and a body that never ends (close-delimited), one JSON-ish chunk after
  another, until the client goes away or ``limit`` bytes were sent;
- ``drip-body``: 200 with headers at once, then one body byte every ``interval`` seconds;
- ``drip-headers``: the status line, then one header byte every ``interval`` seconds;
- ``json-bomb``: 200 and a ``Content-Length`` body of ``[{},{},...]`` about ``size`` bytes.

Raw sockets, so nothing in a server library bounds what it sends.  Loopback or the bed's
namespace only: ``serve`` binds where it is told (``127.0.0.1`` by default).  Run alone
(``python -m testbed.hostile --host IP --port N --mode M``) it serves until killed.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

MODES = ("endless", "drip-body", "drip-headers", "json-bomb")
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"


@dataclass
class Hostile:
    """One hostile server's behaviour, and what it did (``sent``: body bytes, all calls)."""

    mode: str
    interval: float = 0.3
    limit: int = 1 << 40
    size: int = 4 << 20
    sent: int = 0
    requests: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r}: choose from {', '.join(MODES)}")

    def _count(self, n: int) -> None:
        with self._lock:
            self.sent += n

    def handle(self, conn: socket.socket) -> None:
        """Read one request's head (and drop any body), then answer it hostilely."""
        conn.settimeout(5)
        head = b""
        with contextlib.suppress(OSError):
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
        with self._lock:
            self.requests += 1
        conn.settimeout(None)
        with contextlib.suppress(OSError):
            getattr(self, "_" + self.mode.replace("-", "_"))(conn)

    def _endless(self, conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        )
        chunk = b'{"urls": [' + b'"http://198.18.1.1:8000",' * 2000
        sent = 0
        while sent < self.limit:
            conn.sendall(chunk)
            sent += len(chunk)
            self._count(len(chunk))

    def _drip_body(self, conn: socket.socket) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n"
        )
        while True:
            conn.sendall(b" ")
            self._count(1)
            time.sleep(self.interval)

    def _drip_headers(self, conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while True:
            conn.sendall(b"X")
            self._count(1)
            time.sleep(self.interval)

    def _json_bomb(self, conn: socket.socket) -> None:
        n = max(1, (self.size - 2) // 3)
        body = b"[" + b"{}," * (n - 1) + b"{}]"
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        )
        conn.sendall(body)
        self._count(len(body))


@contextlib.contextmanager
def serve(hostile: Hostile, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Serve ``hostile`` on ``host``:``port`` (0: a free port) in daemon threads; yields
    ``http://host:port`` and closes the listening socket (and every open connection) on
    exit."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=_one, args=(conn,), daemon=True).start()

    def _one(conn: socket.socket) -> None:
        try:
            hostile.handle(conn)
        finally:
            with contextlib.suppress(OSError):
                conn.close()

    threading.Thread(target=accept, name=f"hostile-{hostile.mode}", daemon=True).start()
    bound = listener.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    try:
        yield f"http://{shown}:{bound}"
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testbed.hostile")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--interval", type=float, default=0.3)
    a = p.parse_args(argv)
    with serve(Hostile(a.mode, interval=a.interval), a.host, a.port) as base:
        print(f"hostile {a.mode} on {base}", flush=True)
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
