"""A TLS terminator on loopback in front of a plaintext gRPC port (the Temporal dev server).

``temporal server start-dev`` has no TLS option, so tests put this in front of its gRPC
port to see the worker, the watcher and ``retire`` really speak TLS (and mTLS): the front
does the TLS handshake with a certificate of the test CA, offers ALPN ``h2`` (gRPC clients
insist on it over TLS), and then pipes the decrypted bytes both ways to the dev server,
which speaks HTTP/2 with prior knowledge on that port, so no HTTP/2 parsing is needed.

With ``client_ca`` the front requires a client certificate signed by that CA (mTLS).
Every connection is recorded (:class:`FrontConnection`): the client certificate's subject
CN when one was presented, why a handshake failed, and the first bytes the client sent
after the handshake, so a test can assert what really happened on the wire.

The front listens on loopback only and forwards to loopback only; it runs its own event
loop in a thread and stops (connections included) when it is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

HEAD_BYTES = 64 * 1024
"""How much of what each client sends is kept (the HTTP/2 preface and first requests)."""
HANDSHAKE_TIMEOUT_S = 10.0
_CHUNK = 64 * 1024


@dataclass
class FrontConnection:
    """One client connection to the front, as seen so far."""

    peer: str
    tls: bool = False
    """The handshake completed."""
    alpn: str | None = None
    client_cert: bool = False
    """The client presented a certificate (the front only accepts one its CA signed)."""
    client_cn: str | None = None
    error: str | None = None
    """Why the handshake or the forwarding failed; None while all went well."""
    head: bytes = b""
    """The first ``HEAD_BYTES`` the client sent, decrypted (HTTP/2 frames)."""
    to_server: int = 0
    to_client: int = 0
    """Decrypted bytes forwarded each way."""


def _loopback(host: str) -> str:
    """``host`` if it is a loopback address (or ``localhost``); ValueError otherwise."""
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"the TLS front only uses loopback addresses, not {host!r}")
    return host


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {address!r} must be HOST:PORT")
    return _loopback(host.strip("[]")), int(port)


def _common_name(cert: Mapping[str, object]) -> str | None:
    """The subject CN of a certificate as ``SSLObject.getpeercert()`` returns it."""
    subject = cert.get("subject", ())
    assert isinstance(subject, tuple)
    for rdn in subject:
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class TlsFront:
    """A TLS (or mTLS) front for ``upstream``, a plaintext ``HOST:PORT`` on loopback.

    Use as a context manager (or ``start`` / ``close``); ``address`` is where to connect.
    """

    def __init__(
        self,
        *,
        upstream: str,
        cert: Path,
        key: Path,
        client_ca: Path | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.host = _loopback(host)
        self.upstream = _split(upstream)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2"])
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cafile=client_ca)
        self._ctx = ctx
        self.port = 0
        self._lock = threading.Lock()
        self._connections: list[FrontConnection] = []
        self._ready = threading.Event()
        self._failed: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """``HOST:PORT`` of the front."""
        return f"{self.host}:{self.port}"

    @property
    def connections(self) -> list[FrontConnection]:
        """A snapshot of every connection so far, oldest first."""
        with self._lock:
            return [dataclasses.replace(c) for c in self._connections]

    def start(self) -> TlsFront:
        """Listen (on an ephemeral port) and serve in a thread of its own."""
        self._thread = threading.Thread(target=self._run, name="tls-front", daemon=True)
        self._thread.start()
        if not self._ready.wait(HANDSHAKE_TIMEOUT_S):
            raise RuntimeError("the TLS front did not start")
        if self._failed is not None:
            raise RuntimeError(f"the TLS front did not start: {self._failed}")
        return self

    def close(self) -> None:
        """Stop listening, drop every connection and end the thread."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop just ended
                loop.call_soon_threadsafe(stop.set)
        if self._thread is not None:
            self._thread.join(HANDSHAKE_TIMEOUT_S)

    def __enter__(self) -> TlsFront:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ the loop's side

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start() when it happens before ready
            self._failed = e
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, self.host, 0)
        self.port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()

    def _update(self, conn: FrontConnection, **changes: object) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(conn, name, value)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        peer = writer.get_extra_info("peername") or ("?", 0)
        conn = FrontConnection(peer=f"{peer[0]}:{peer[1]}")
        with self._lock:
            self._connections.append(conn)
        try:
            try:
                await writer.start_tls(self._ctx, ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S)
            except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
                self._update(conn, error=f"handshake: {e}")
                return
            tls: ssl.SSLObject = writer.get_extra_info("ssl_object")
            peer_cert = tls.getpeercert()
            self._update(
                conn,
                tls=True,
                alpn=tls.selected_alpn_protocol(),
                client_cert=bool(peer_cert),
                client_cn=_common_name(peer_cert) if peer_cert else None,
            )
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError as e:
                self._update(conn, error=f"upstream: {e}")
                return
            try:
                await self._pipe_both(reader, writer, up_reader, up_writer, conn)
            finally:
                up_writer.close()
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _pipe_both(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
        conn: FrontConnection,
    ) -> None:
        """Forward until either side closes (a TLS stream cannot half-close)."""
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer, conn, to_server=True)),
            asyncio.create_task(self._pipe(up_reader, writer, conn, to_server=False)),
        ]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        conn: FrontConnection,
        *,
        to_server: bool,
    ) -> None:
        try:
            while data := await src.read(_CHUNK):
                with self._lock:
                    if to_server:
                        conn.to_server += len(data)
                        if len(conn.head) < HEAD_BYTES:
                            conn.head += data[: HEAD_BYTES - len(conn.head)]
                    else:
                        conn.to_client += len(data)
                dst.write(data)
                await dst.drain()
        except OSError:  # a reset or a TLS error ends this connection, not the front
            return
