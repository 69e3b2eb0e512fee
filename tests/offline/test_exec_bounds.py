"""``kube.podexec.run_exec`` holds its bounds whatever the exec's websocket carries (issue 22,
H1): the wall-clock bound and the output cap are enforced while reading, and at either the
websocket is closed.

The peer is a websocket server on loopback that answers the exec upgrade as the API server
does (``v4.channel.k8s.io``: one channel byte, then the data) and then plays a scenario: a
command that prints and exits, exits non-zero, floods stdout or stderr for ever, says
nothing, announces a 1 GiB frame, fragments its output, pings.  The bed test
(``tests/bed/test_hostile_exec_on_bed.py``) does the same through the real API server and
kwok, with a ``python3`` that floods.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from kubernetes import client

from kube.api import ExecResult
from kube.podexec import HANDSHAKE_S, run_exec

MiB = 1 << 20
CAP = 64 << 10
TIMEOUT_S = 2.0
#: How long a test waits before it says the exec is not bounded.
HANG_S = 15.0
GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
SUCCESS = json.dumps({"metadata": {}, "status": "Success"}).encode()


def exited(code: int) -> bytes:
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": f"command terminated with non-zero exit code: exit status {code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
        }
    ).encode()


def frame(payload: bytes, *, opcode: int = 0x2, fin: bool = True) -> bytes:
    """A server frame (unmasked)."""
    b0 = (0x80 if fin else 0) | opcode
    n = len(payload)
    if n < 126:
        head = struct.pack("!BB", b0, n)
    elif n < 1 << 16:
        head = struct.pack("!BBH", b0, 126, n)
    else:
        head = struct.pack("!BBQ", b0, 127, n)
    return head + payload


def channel(ch: int, data: bytes) -> bytes:
    return frame(bytes([ch]) + data)


@dataclass
class Peer:
    """A fake API server's exec websocket; ``play(conn)`` is the scenario."""

    play: Callable[[socket.socket], None]
    sent: int = 0
    closed_at: float | None = None
    requests: list[bytes] = field(default_factory=list)

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)

    def serve_one(self, conn: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = conn.recv(4096)
            if not chunk:
                return
            head += chunk
        self.requests.append(head)
        key = next(
            line.split(b":", 1)[1].strip()
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"sec-websocket-key:")
        )
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
        conn.sendall(
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Accept: " + accept + b"\r\n"
            b"Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
        )
        try:
            self.play(conn)
        except OSError:
            pass  # the client went away: what a bounded reader does
        finally:
            self.closed_at = time.monotonic()


@contextlib.contextmanager
def peer_at(play: Callable[[Peer, socket.socket], None]) -> Iterator[tuple[Peer, str]]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    peer = Peer(play=lambda conn: play(peer, conn))

    def accept() -> None:
        with contextlib.suppress(OSError):
            conn, _ = listener.accept()
            with conn:
                peer.serve_one(conn)

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield peer, f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def exec_against(host: str, *, timeout_s: float = TIMEOUT_S) -> tuple[ExecResult, float, int]:
    """``run_exec`` against ``host`` in a thread: its result, how long it took, and the peak
    of Python's allocations meanwhile."""
    cfg = client.Configuration()
    cfg.host = host
    cfg.api_key = {"authorization": "Bearer exec-test"}
    connect = client.CoreV1Api(client.ApiClient(cfg)).connect_get_namespaced_pod_exec
    box: list[ExecResult] = []
    tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.monotonic()
    t = threading.Thread(
        target=lambda: box.append(
            run_exec(
                connect,
                namespace="ns",
                name="pod",
                container="main",
                argv=["python3", "-c", "print(1)"],
                timeout_s=timeout_s,
                output_cap=CAP,
            )
        ),
        daemon=True,
    )
    t.start()
    t.join(HANG_S)
    took = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert not t.is_alive(), f"the exec was still reading after {HANG_S:g} s: not bounded"
    assert box, "run_exec raised"
    return box[0], took, peak


def forever(data: bytes) -> Callable[[Peer, socket.socket], None]:
    def play(peer: Peer, conn: socket.socket) -> None:
        while True:
            peer.send(conn, data)

    return play


# ============================================================================ the bounds


@pytest.mark.parametrize(("ch", "what"), [(1, "exec output over its cap"), (2, "stderr")])
def test_a_command_that_floods_ends_at_the_cap_and_the_websocket_is_closed(
    ch: int, what: str
) -> None:
    with peer_at(forever(channel(ch, b"x" * 32768))) as (peer, host):
        result, took, peak = exec_against(host)
        assert what in result.error, result
        assert result.stdout == ""
        assert took < 1.0, f"{took:.1f} s"
        assert peak < 4 * MiB, f"{peak / MiB:.0f} MiB"
        # The websocket was closed: the peer's sending failed soon after.
        deadline = time.monotonic() + 3
        while peer.closed_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert peer.closed_at is not None, "the peer could still send: the websocket is open"


def test_a_command_that_floods_in_tiny_frames_ends_at_the_cap() -> None:
    # 64 Ki frames of one byte each, parsed under tracemalloc: seconds of CPU on a loaded
    # machine, so the wall-clock bound is generous here (it is the cap that must end it).
    with peer_at(forever(channel(1, b"y"))) as (_peer, host):
        result, took, peak = exec_against(host, timeout_s=HANG_S - 5)
    assert result.error == "exec output over its cap", result
    assert took < HANG_S - 5 and peak < 4 * MiB


def test_a_frame_announced_past_the_cap_is_not_read() -> None:
    def play(peer: Peer, conn: socket.socket) -> None:
        peer.send(conn, struct.pack("!BBQ", 0x82, 127, 1 << 30) + b"\x01" + b"z" * 1000)
        time.sleep(HANG_S + 5)

    with peer_at(play) as (_peer, host):
        result, took, peak = exec_against(host)
    assert result.error == "exec output over its cap", result
    assert took < 1.0 and peak < 4 * MiB


@pytest.mark.parametrize("scenario", ["silent", "drip", "slow-frame"])
def test_a_command_that_never_ends_ends_at_the_bound(scenario: str) -> None:
    def play(peer: Peer, conn: socket.socket) -> None:
        if scenario == "silent":
            time.sleep(HANG_S + 5)
        elif scenario == "drip":
            while True:
                peer.send(conn, channel(1, b"."))
                time.sleep(0.3)
        else:  # a frame of 100 bytes, one byte at a time
            peer.send(conn, struct.pack("!BB", 0x82, 100) + b"\x01")
            while True:
                peer.send(conn, b"s")
                time.sleep(0.3)

    with peer_at(play) as (_peer, host):
        result, took, _peak = exec_against(host)
    assert result.error == f"exec exceeded {TIMEOUT_S:g} s", result
    assert TIMEOUT_S - 0.2 < took < TIMEOUT_S + 1.0, f"{took:.1f} s"


# ============================================================================ what it reads


def test_a_command_that_prints_and_exits_is_read_whole() -> None:
    def play(peer: Peer, conn: socket.socket) -> None:
        peer.send(conn, frame(b"\x01vllm:x\t0.0\n", fin=False))  # fragmented
        peer.send(conn, frame(b"#en", opcode=0x0, fin=False))
        peer.send(conn, frame(b"", opcode=0x9))  # a ping between fragments
        peer.send(conn, frame(b"d\n", opcode=0x0))
        peer.send(conn, channel(2, b"a warning\n"))
        peer.send(conn, channel(3, SUCCESS))
        peer.send(conn, frame(struct.pack("!H", 1000), opcode=0x8))

    with peer_at(play) as (peer, host):
        result, _took, _peak = exec_against(host)
    assert result == ExecResult(stdout="vllm:x\t0.0\n#end\n", exit_code=0)
    (request,) = peer.requests
    assert b"authorization: Bearer exec-test" in request
    assert b"GET /api/v1/namespaces/ns/pods/pod/exec?command=python3" in request


def test_a_non_zero_exit_is_reported() -> None:
    def play(peer: Peer, conn: socket.socket) -> None:
        peer.send(conn, channel(1, b"partial"))
        peer.send(conn, channel(3, exited(3)))

    with peer_at(play) as (_peer, host):
        result, _took, _peak = exec_against(host)
    assert result == ExecResult(stdout="partial", exit_code=3)


@pytest.mark.parametrize(
    ("status", "why"),
    [
        (b"", "exec ended without a status"),
        (b"{not json", "exec status unreadable"),
        (
            json.dumps({"status": "Failure", "message": 'container "main" not found'}).encode(),
            'exec failed: container "main" not found',
        ),
    ],
)
def test_an_exec_without_a_good_status_reads_as_an_error(status: bytes, why: str) -> None:
    def play(peer: Peer, conn: socket.socket) -> None:
        peer.send(conn, channel(1, b"out"))
        if status:
            peer.send(conn, channel(3, status))

    with peer_at(play) as (_peer, host):
        result, _took, _peak = exec_against(host)
    assert result.error == why and result.stdout == "", result


def test_no_api_server_is_an_error_not_a_raise() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    result, took, _ = exec_against(f"http://127.0.0.1:{port}")
    assert result.error.startswith("exec failed"), result
    assert took < TIMEOUT_S + 0.5


def test_an_api_server_that_never_answers_the_upgrade_ends_at_the_bound() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        result, took, _ = exec_against(f"http://127.0.0.1:{listener.getsockname()[1]}")
    finally:
        listener.close()
    assert result.error, result
    assert took < TIMEOUT_S + 1.0, f"{took:.1f} s"


# ============================================================================ ticks


def silent_then(after_s: float, data: bytes) -> Callable[[Peer, socket.socket], None]:
    """Say nothing for ``after_s``, then ``data`` and the exec's success."""

    def play(peer: Peer, conn: socket.socket) -> None:
        time.sleep(after_s)
        peer.send(conn, channel(1, data) + channel(3, SUCCESS) + frame(b"", opcode=0x8))
        time.sleep(1)

    return play


def ticking_exec(host: str, tick: Callable[[], None], timeout_s: float) -> ExecResult:
    cfg = client.Configuration()
    cfg.host = host
    connect = client.CoreV1Api(client.ApiClient(cfg)).connect_get_namespaced_pod_exec
    return run_exec(
        connect,
        namespace="ns",
        name="pod",
        container="main",
        argv=["python3", "-c", "pass"],
        timeout_s=timeout_s,
        output_cap=CAP,
        tick=tick,
    )


def test_a_long_exec_ticks_at_least_once_a_second_while_it_waits() -> None:
    """The wait for idle runs for up to seconds with nothing to read: its activity must
    heartbeat meanwhile (``kube.podexec.TICK_S``), and the output still arrives whole."""
    ticks: list[float] = []
    with peer_at(silent_then(2.6, b"#idle\t2.5\n")) as (_peer, host):
        started = time.monotonic()
        result = ticking_exec(host, lambda: ticks.append(time.monotonic()), 10.0)
    assert result.error == "" and result.stdout == "#idle\t2.5\n", result
    gaps = [b - a for a, b in zip([started, *ticks], ticks, strict=False)]
    assert len(ticks) >= 3 and max(gaps) < 1.5, gaps


def test_a_tick_that_raises_ends_the_exec_and_closes_the_websocket() -> None:
    """A cancel reaches a waiting exec through its tick: the exec ends at once, the
    websocket closed, and the error goes to the caller (the activity ends cancelled)."""

    class Cancelled(Exception):
        pass

    calls = [0]

    def tick() -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise Cancelled

    gone = threading.Event()

    def listen(_peer: Peer, conn: socket.socket) -> None:
        conn.settimeout(8.0)
        while conn.recv(4096):  # the client's close frame, then the end of the socket
            pass
        gone.set()

    with peer_at(listen) as (_peer, host):
        started = time.monotonic()
        with pytest.raises(Cancelled):
            ticking_exec(host, tick, 10.0)
        assert time.monotonic() - started < 2.5
        assert gone.wait(3), "the websocket was left open"


def test_a_ticking_exec_still_ends_at_its_bound() -> None:
    with peer_at(silent_then(8.0, b"late")) as (_peer, host):
        started = time.monotonic()
        result = ticking_exec(host, lambda: None, 1.5)
    assert result.error == "exec exceeded 1.5 s", result
    assert time.monotonic() - started < 2.5


def test_a_ticking_exec_bounds_its_handshake_on_its_own() -> None:
    """The handshake cannot tick: a long exec (the wait for idle, up to a minute) whose API
    server never answers the upgrade gives up after ``HANDSHAKE_S``, not its whole bound,
    so its activity is never left without a heartbeat for longer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held: list[socket.socket] = []
    threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True).start()
    try:
        started = time.monotonic()
        result = ticking_exec(f"http://127.0.0.1:{listener.getsockname()[1]}", lambda: None, 30)
        took = time.monotonic() - started
    finally:
        listener.close()
        for conn in held:
            conn.close()
    assert result.error.startswith("exec failed"), result
    assert HANDSHAKE_S <= took < HANDSHAKE_S + 2, f"{took:.1f} s"
