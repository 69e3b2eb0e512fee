"""One bounded ``pods/exec`` over the API server's websocket: the whole exchange (connect,
handshake, every frame) ends by ``timeout_s`` and no more than ``output_cap`` bytes of
stdout (and as much stderr) are ever read, whatever the command in the container sends;
every failure becomes an ``ExecResult.error`` (an exec is a reading: it never raises into
its caller).

Why not the client library's reader (``kubernetes.stream.ws_client.WSClient``): its
``update()`` keeps reading while frames are waiting and appends each one to its buffers, so
a command that floods stdout keeps it inside one call, past every bound the caller checks
between calls (measured: 18 s and +120 MiB for a 5 s, 64 KiB read).  Here the frames are
read off the socket one at a time:

- every ``recv`` waits at most the time left, so the wall-clock bound holds even inside a
  frame that arrives slowly;
- a frame's length is read before its payload, and a frame that would take a channel past
  its cap is not read at all: the exec ends with "output over its cap";
- at either bound, reading stops and the websocket is closed (a close frame, then the
  socket): the API server then ends the stream to the container's runtime.

The request is the generated client's (``connect_get_namespaced_pod_exec``: its URL, query
and credentials), through ``kubernetes.stream.stream``'s own wrapper, with the websocket
opened here: the same TLS settings as the library's, a timeout, no proxy (never: not even
one named in the environment) and no redirect (the credential stays with the API server).
Channels (``v5.channel.k8s.io`` / ``v4.channel.k8s.io``): 1 stdout, 2 stderr (read and
dropped, within its own cap), 3 the exec's status (``Success``, or the exit code of
``NonZeroExitCode``), 255 v5's close signal.
"""

from __future__ import annotations

import json
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import Any

import certifi
from kubernetes.stream import stream, ws_client
from temporalio.exceptions import CancelledError
from websocket import WebSocket, WebSocketException

from kube.api import ExecResult

#: How an exec that outlived its bound reads (``ExecResult.error`` begins with it).
OVERRAN = "exec exceeded"

STDOUT, STDERR, STATUS, CLOSE_SIGNAL = 1, 2, 3, 255
#: The most of the status channel read (a Status object: a few hundred bytes).
STATUS_CAP = 64 << 10
PROTOCOLS = "v5.channel.k8s.io,v4.channel.k8s.io"
#: With a ``tick``, the longest single wait for bytes (seconds) between two ticks.
TICK_S = 1.0
#: With a ``tick``, the bound of the connect and handshake (seconds), which cannot tick: a
#: long exec's whole bound would leave its activity without a heartbeat for as long.
HANDSHAKE_S = 5.0


class _Stop(Exception):
    """The exec ends here, with this error (``ExecResult.error``)."""


def open_websocket(configuration: Any, url: str, headers: Any, *, timeout: float) -> WebSocket:
    """Open the exec's websocket as ``kubernetes.stream.ws_client.create_websocket`` does
    (the same TLS options), with a connect and handshake ``timeout``, no proxy and no
    redirect."""
    header = []
    if headers and "authorization" in headers:
        header.append(f"authorization: {headers['authorization']}")
    if headers and headers.get("User-Agent"):  # the audit log names who read the engine
        header.append(f"user-agent: {headers['User-Agent']}")
    header.append(f"sec-websocket-protocol: {PROTOCOLS}")
    ssl_opts: dict[str, Any]
    if url.startswith("wss://") and configuration.verify_ssl:
        ssl_opts = {
            "cert_reqs": ssl.CERT_REQUIRED,
            "ca_certs": configuration.ssl_ca_cert or certifi.where(),
        }
        if configuration.assert_hostname is not None:
            ssl_opts["check_hostname"] = configuration.assert_hostname
    else:
        ssl_opts = {"cert_reqs": ssl.CERT_NONE}
    if configuration.cert_file:
        ssl_opts["certfile"] = configuration.cert_file
    if configuration.key_file:
        ssl_opts["keyfile"] = configuration.key_file
    if configuration.tls_server_name:
        ssl_opts["server_hostname"] = configuration.tls_server_name
    ws = WebSocket(sslopt=ssl_opts, skip_utf8_validation=True)
    ws.connect(  # type: ignore[no-untyped-call]
        url, header=header, timeout=timeout, http_no_proxy=["*"], redirect_limit=0
    )
    return ws


class _Frames:
    """Websocket frames read off ``sock`` one at a time (through a buffer of at most one
    ``recv``), each ``recv`` bounded by the deadline."""

    def __init__(
        self,
        sock: socket.socket,
        deadline: float,
        timeout_s: float,
        tick: Callable[[], None] | None = None,
    ) -> None:
        self.sock, self.deadline, self.timeout_s, self.tick = sock, deadline, timeout_s, tick
        self._buf = b""

    def _recv(self, n: int) -> bytes:
        while len(self._buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise _Stop(f"{OVERRAN} {self.timeout_s:g} s")
            if self.tick is not None:  # each wait is a slice of at most TICK_S
                self.tick()
                left = min(left, TICK_S)
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(1 << 16)
            except TimeoutError:
                if self.tick is not None and time.monotonic() < self.deadline:
                    continue
                raise _Stop(f"{OVERRAN} {self.timeout_s:g} s") from None
            if not chunk:
                raise EOFError
            self._buf += chunk
        data, self._buf = self._buf[:n], self._buf[n:]
        return data

    def header(self) -> tuple[bool, int, int, bytes | None]:
        """(fin, opcode, payload length, mask key or None) of the next frame."""
        b0, b1 = self._recv(2)
        length = b1 & 0x7F
        if length == 126:
            (length,) = struct.unpack("!H", self._recv(2))
        elif length == 127:
            (length,) = struct.unpack("!Q", self._recv(8))
        mask = self._recv(4) if b1 & 0x80 else None
        return bool(b0 & 0x80), b0 & 0x0F, length, mask

    def payload(self, length: int, mask: bytes | None) -> bytes:
        data = self._recv(length)
        if mask is not None:
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
        return data


def _read(frames: _Frames, output_cap: int) -> tuple[bytes, bytes]:
    """Stdout and the status, read until the server closes the stream (a close frame, or
    the end of the connection); ``_Stop`` at either bound."""
    caps = {STDOUT: output_cap, STDERR: output_cap, STATUS: STATUS_CAP, CLOSE_SIGNAL: 16}
    got = {ch: bytearray() for ch in caps}
    channel: int | None = None  # of the message being continued
    try:
        while True:
            fin, opcode, length, mask = frames.header()
            if opcode == 0x8:  # close
                break
            if opcode in (0x9, 0xA):  # ping, pong: a control frame carries at most 125 bytes
                if length > 125:
                    raise _Stop("exec stream failed: malformed control frame")
                frames.payload(length, mask)
                continue
            if opcode in (0x1, 0x2):
                channel = None
            elif opcode != 0x0 or channel is None:
                raise _Stop(f"exec stream failed: unexpected websocket opcode {opcode}")
            if channel is None:
                if length == 0:
                    continue
                head = frames.payload(1, mask)
                channel, length = head[0], length - 1
                if mask is not None:  # the rest continues the mask from its second byte
                    mask = mask[1:] + mask[:1]
            if channel not in caps:
                raise _Stop(f"exec stream failed: unknown channel {channel}")
            if len(got[channel]) + length > caps[channel]:
                raise _Stop(
                    "exec output over its cap"
                    if channel == STDOUT
                    else f"exec {'stderr' if channel == STDERR else 'status'} over its cap"
                )
            got[channel] += frames.payload(length, mask)
            if fin:
                channel = None
    except EOFError:
        pass  # the server ended the connection: what was read is all there is
    return bytes(got[STDOUT]), bytes(got[STATUS])


def exit_code(status: bytes) -> int:
    """The command's exit code from the status channel's Status object; ``_Stop`` when the
    exec itself failed or no status came."""
    if not status:
        raise _Stop("exec ended without a status")
    try:
        st = json.loads(status)
    except ValueError:
        raise _Stop("exec status unreadable") from None
    if not isinstance(st, dict):
        raise _Stop("exec status unreadable")
    if st.get("status") == "Success":
        return 0
    details = st.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    if st.get("reason") == "NonZeroExitCode" and isinstance(causes, list):
        for cause in causes:
            if isinstance(cause, dict) and cause.get("reason") == "ExitCode":
                message = str(cause.get("message", ""))
                if message.isascii() and message.isdigit() and len(message) <= 3:
                    return int(message)
    message = str(st.get("message") or st.get("reason") or "no reason")
    raise _Stop("exec failed: " + "".join(c if c.isprintable() else "?" for c in message[:120]))


def _close(ws: WebSocket) -> None:
    """Stop: a close frame (bounded), then the socket."""
    try:
        if ws.sock is not None:
            ws.sock.settimeout(0.2)
            ws.send_close()
    except (OSError, WebSocketException, ValueError):
        pass
    finally:
        ws.shutdown()  # type: ignore[no-untyped-call]


def run_exec(
    connect: Callable[..., Any],
    *,
    namespace: str,
    name: str,
    container: str,
    argv: list[str],
    timeout_s: float,
    output_cap: int,
    tick: Callable[[], None] | None = None,
) -> ExecResult:
    """Run ``argv`` through ``connect`` (``CoreV1Api.connect_get_namespaced_pod_exec``);
    ``tick`` is called before every wait for bytes, each wait at most ``TICK_S`` (what it
    raises ends the exec, the websocket closed, and propagates)."""
    deadline = time.monotonic() + timeout_s
    if tick is not None:
        tick()
    opened = _open(
        connect,
        namespace=namespace,
        name=name,
        container=container,
        argv=argv,
        deadline=deadline,
        timeout_s=timeout_s,
        tick=tick,
    )
    if isinstance(opened, ExecResult):
        return opened
    ws, sock = opened
    try:
        out, status = _read(_Frames(sock, deadline, timeout_s, tick), output_cap)
        code = exit_code(status)
    except _Stop as e:
        return ExecResult(error=str(e))
    except (OSError, struct.error, ValueError) as e:
        return ExecResult(error=f"exec stream failed: {type(e).__name__}")
    finally:
        _close(ws)
    return ExecResult(stdout=out.decode("utf-8", "replace"), exit_code=code)


def _open(
    connect: Callable[..., Any],
    *,
    namespace: str,
    name: str,
    container: str,
    argv: list[str],
    deadline: float,
    timeout_s: float,
    tick: Callable[[], None] | None,
) -> tuple[WebSocket, socket.socket] | ExecResult:
    """The exec's websocket and its socket, opened through ``connect`` by ``deadline`` (an
    ``ExecResult`` naming the error when it could not be)."""
    opened: list[WebSocket] = []

    def websocket(configuration: Any, _method: str, url: str, **kwargs: Any) -> WebSocket:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{OVERRAN} {timeout_s:g} s")
        if tick is not None:  # no tick during the handshake: it gets a bound of its own
            left = min(left, HANDSHAKE_S)
        ws = open_websocket(
            configuration, ws_client.get_websocket_url(url), kwargs.get("headers"), timeout=left
        )
        opened.append(ws)
        return ws

    try:
        # ``stream``'s wrapper: the generated method's request, with ``websocket`` in place
        # of the library's reader.
        stream.func(
            websocket,
            None,
            connect,
            name,
            namespace,
            container=container,
            command=argv,
            stdin=False,
            stdout=True,
            stderr=True,
            tty=False,
            _preload_content=False,
            _request_timeout=timeout_s,
        )
    except CancelledError:
        for ws in opened:
            _close(ws)
        raise
    except Exception as e:
        for ws in opened:
            _close(ws)
        if time.monotonic() >= deadline:
            return ExecResult(error=f"{OVERRAN} {timeout_s:g} s")
        return ExecResult(error=f"exec failed: {type(e).__name__}")
    sock = opened[0].sock if len(opened) == 1 else None
    if sock is None:
        for ws in opened:
            _close(ws)
        return ExecResult(error="exec failed: no websocket")
    return opened[0], sock
