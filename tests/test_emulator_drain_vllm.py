"""vLLM's ``GET /load`` as the emulator reproduces it (testbed.emulator.engine:
``server_load``, ``_serve_load``; testbed.emulator.engine_args for the command line; the
vLLM 0.29.0 sources are cited there): the API server's own count of requests in its
handlers, which moves only with ``--enable-server-load-tracking`` and counts a stream
until its last chunk was written, while the engine's gauges and counters are already
done with it. Everything stays on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client as k8s

from activities.oneshot import command, wait_command
from retirement.readings import SERIES, parse_oneshot_output
from testbed.emulator import EngineEmulator, EngineKind
from testbed.emulator.engine_args import VllmArgs, vllm_args
from testbed.standin_operator import _command_line
from tests.helpers import eventually
from tests.helpers.emulator_calls import Background, parse, total
from tests.helpers.emulators import emulators

LOOPBACK = "127.0.0.1"
WAIT = 10.0  # a bound on how long a state change may take to show (not a figure)
TRACK = ("vllm", "serve", "emulated", "--enable-server-load-tracking")

#: The current drain rule for vLLM (retirement/readings.py): the gauges' sum, and the
#: counters that must not move between two idle reads.
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
COUNTERS = ("vllm:prompt_tokens_total", "vllm:generation_tokens_total")


@pytest.fixture
def start() -> Iterator[Callable[..., EngineEmulator]]:
    """Started emulators on 127.0.0.1 (free ports); all stopped afterwards."""
    with emulators(prefix="v", request_seconds=0.3) as make:
        yield make


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """An httpx client that never uses proxies (one connection: one API server)."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        yield c


def load(emu: EngineEmulator) -> int:
    """``GET /load`` on a new connection to the loopback port, as the one-shot reads it."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        r = c.get(f"http://{LOOPBACK}:{emu.metrics_port}/load")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"server_load"}
    return int(body["server_load"])


def rule(emu: EngineEmulator) -> tuple[float, tuple[float, ...]]:
    """What the current gauge+counter rule reads from ``/metrics``."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        samples = parse(c.get(f"http://{LOOPBACK}:{emu.metrics_port}/metrics").text)
    return sum(total(samples, g) for g in GAUGES), tuple(total(samples, c) for c in COUNTERS)


def oneshot(emu: EngineEmulator, *, exact: bool) -> str:
    """The drain's in-container one-shot (activities/oneshot.py), run for real."""
    argv = command(
        port=emu.metrics_port,
        scheme="http",
        path="/metrics",
        names=SERIES["vLLM"].all,
        exact=exact,
    )
    argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def completion(emu: EngineEmulator, **extra: Any) -> Background:
    """A completion in the background (its own client)."""
    body = {"model": "emulated", "prompt": "a b", "max_tokens": 5, **extra}

    def call() -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=30.0) as c:
            return c.post(f"http://{LOOPBACK}:{emu.serve_port}/v1/completions", json=body)

    return Background(call)


# --------------------------------------------------------------------------------------
# the count


def test_load_is_always_served_and_stays_0_without_the_flag(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = start(EngineKind.VLLM, request_seconds=1.0)
    r = client.get(f"http://{LOOPBACK}:{emu.serve_port}/load")
    assert r.status_code == 200 and r.content == b'{"server_load":0}'  # Starlette's JSON
    bg = completion(emu)
    eventually(lambda: emu.in_flight == 1, timeout=WAIT, interval=0.01)
    assert load(emu) == 0 and emu.status()["server_load"] == [0]
    bg.join(timeout=WAIT)
    assert client.post(f"http://{LOOPBACK}:{emu.serve_port}/load").status_code == 405
    assert emu.status()["server_load_tracking"] is False


def test_load_counts_a_request_in_the_front_end_the_gauges_do_not_see(
    start: Callable[..., EngineEmulator],
) -> None:
    emu = start(EngineKind.VLLM, request_seconds=0.1, args=TRACK)
    emu.set_frontend_hidden(1.0)
    bg = completion(emu)
    eventually(lambda: emu.in_flight == 1, timeout=WAIT, interval=0.01)
    assert rule(emu) == (0.0, (0.0, 0.0))  # invisible to the gauges and counters
    assert load(emu) == 1
    bg.join(timeout=WAIT)
    assert bg.response is not None and bg.response.status_code == 200
    eventually(lambda: load(emu) == 0, timeout=WAIT, interval=0.01)


def test_load_counts_a_stream_until_its_last_chunk_is_written(
    start: Callable[..., EngineEmulator],
) -> None:
    """A client that reads slowly: the engine is done with the request (gauges 0, counters
    moved, nothing in flight) while its last chunks wait for the client. Two reads of the
    gauge+counter rule 1 s apart both read idle; ``/load`` says 1 until the last chunk was
    written, then 0.

    The answer is about 6.5 MB (256 choices of 4000 tokens, within vLLM's limits for the
    emulated 4096-token context), far more than the socket buffers between the client (its
    receive buffer held at 4 KiB) and the server (at most ``tcp_wmem``'s 4 MiB) can hold."""
    emu = start(EngineKind.VLLM, request_seconds=0.3, args=TRACK)
    body = json.dumps(
        {"model": "emulated", "prompt": ["x"] * 256, "max_tokens": 4000, "stream": True}
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((LOOPBACK, emu.serve_port))
    try:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(body)
            + body
        )
        # The client reads nothing; the engine finishes the request on its own time.
        eventually(lambda: emu.completed == 1, timeout=WAIT, interval=0.02)
        first = rule(emu)
        time.sleep(1.0)
        second = rule(emu)
        assert emu.in_flight == 0
        assert first == second and first[0] == 0.0 and first[1][1] == 256 * 4000.0
        assert load(emu) == 1  # the API server still holds the response
        # The drain's own one-shot and parser: plain (gauges and counters) reads idle,
        # exact (with GET /load) does not.
        plain = parse_oneshot_output(engine="vLLM", stdout=oneshot(emu, exact=False))
        exact = parse_oneshot_output(engine="vLLM", stdout=oneshot(emu, exact=True), exact=True)
        assert plain.idle and plain.counters == (256.0, 256 * 4000.0)
        assert exact.complete and exact.exact == 1 and not exact.idle
        sock.settimeout(WAIT)
        received = b""
        while not received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            chunk = sock.recv(1 << 20)
            assert chunk, "the connection closed before the last chunk"
            received = received[-64:] + chunk
        eventually(lambda: load(emu) == 0, timeout=WAIT, interval=0.01)
    finally:
        sock.close()


def test_load_counts_from_the_handler_to_the_last_byte_and_never_a_refusal_before_it(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """FastAPI's validation runs before the handler: its 400 is never counted. A 404 for
    a model it does not serve comes from inside the handler: counted (until answered)."""
    emu = start(EngineKind.VLLM, args=TRACK)
    base = f"http://{LOOPBACK}:{emu.serve_port}/v1/completions"
    assert client.post(base, json={"model": "emulated", "prompt": 5}).status_code == 400
    assert (
        client.post(base, content=b"{", headers={"Content-Type": "text/plain"}).status_code == 400
    )
    assert emu.status()["server_load_counted"] == 0
    assert client.post(base, json={"model": "other", "prompt": "x"}).status_code == 404
    assert emu.status()["server_load_counted"] == 1
    bg = completion(emu, emulate_seconds=1.0, stream=True)
    eventually(lambda: emu.in_flight == 1, timeout=WAIT, interval=0.01)
    assert load(emu) == 1
    bg.join(timeout=WAIT)
    assert bg.response is not None and bg.response.status_code == 200
    eventually(lambda: load(emu) == 0, timeout=WAIT, interval=0.01)
    assert emu.status()["server_load_counted"] == 2
    for route in ("/metrics", "/health", "/load", "/v1/models"):
        client.get(f"http://{LOOPBACK}:{emu.serve_port}{route}")
    assert emu.status()["server_load_counted"] == 2  # not load-aware routes


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_is_counted_down_once_and_aborted(
    start: Callable[..., EngineEmulator], stream: bool
) -> None:
    """vLLM notices the disconnect at once (``with_cancellation``, or the streaming
    response's ``listen_for_disconnect``): the count goes down once, the request is
    aborted in the engine."""
    emu = start(EngineKind.VLLM, args=TRACK)
    body = json.dumps(
        {
            "model": "emulated",
            "prompt": "x",
            "max_tokens": 8,
            "stream": stream,
            "emulate_seconds": 30,
        }
    ).encode()
    sock = socket.create_connection((LOOPBACK, emu.serve_port))
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )
    eventually(lambda: emu.in_flight == 1, timeout=WAIT, interval=0.01)
    assert load(emu) == 1
    sock.close()
    eventually(lambda: emu.in_flight == 0, timeout=3.0, interval=0.01)
    assert emu.aborted == 1 and emu.completed == 0
    assert load(emu) == 0 and emu.status()["server_load"] == [0]
    assert rule(emu)[0] == 0.0


def test_each_api_server_process_counts_its_own_requests(
    start: Callable[..., EngineEmulator],
) -> None:
    """With internal data parallelism vLLM runs one API server per DP rank by default, all
    on one socket: ``/load`` answers the count of whichever process took the connection."""
    emu = start(EngineKind.VLLM, dp_ranks=2, request_seconds=5.0, args=TRACK)
    assert emu.status()["server_load"] == [0, 0]
    bg = completion(emu)
    eventually(lambda: emu.in_flight == 1, timeout=WAIT, interval=0.01)
    reads = [load(emu) for _ in range(4)]
    assert sorted(reads) == [0, 0, 1, 1]  # half the connections reach the idle process
    assert sorted(emu.status()["server_load"]) == [0, 1]
    emu.stop()
    bg.join(timeout=WAIT)


def test_a_restart_counts_from_0(start: Callable[..., EngineEmulator]) -> None:
    emu = start(EngineKind.VLLM, request_seconds=30.0, args=TRACK)
    bg = completion(emu)
    eventually(lambda: load(emu) == 1, timeout=WAIT, interval=0.01)
    emu.restart()
    bg.join(timeout=WAIT)
    assert load(emu) == 0 and emu.status()["server_load"] == [0]


# --------------------------------------------------------------------------------------
# the command line


def test_vllm_reads_the_flag_and_its_api_servers_from_the_command_line() -> None:
    assert vllm_args([], dp_ranks=1) == VllmArgs(False, 1)
    assert vllm_args(list(TRACK), dp_ranks=1) == VllmArgs(True, 1)
    assert vllm_args(["--enable_server_load_tracking"], dp_ranks=1).server_load_tracking
    both = ["--enable-server-load-tracking", "--no-enable-server-load-tracking"]
    assert not vllm_args(both, dp_ranks=1).server_load_tracking  # the last one wins
    assert vllm_args(both[::-1], dp_ranks=1).server_load_tracking
    # API servers: the DP size by default (internal load balancing), else as said.
    assert vllm_args([], dp_ranks=4).api_server_count == 4
    assert vllm_args(["--data-parallel-size", "2"], dp_ranks=1).api_server_count == 2
    assert vllm_args(["-dp=3"], dp_ranks=1).api_server_count == 3
    assert vllm_args(["-dp", "4", "--api-server-count", "1"], dp_ranks=1).api_server_count == 1
    assert vllm_args(["-dp", "4", "-asc", "2"], dp_ranks=1).api_server_count == 2
    assert vllm_args(["-dp", "4", "--data-parallel-external-lb"], dp_ranks=1).api_server_count == 1
    assert vllm_args(["-dp", "4", "--data-parallel-rank", "1"], dp_ranks=1).api_server_count == 1
    assert vllm_args(["-dp", "4", "-dpl", "2", "-dph"], dp_ranks=1).api_server_count == 2
    assert (
        vllm_args(["-dp", "4", "--data-parallel-start-rank", "2"], dp_ranks=1).api_server_count == 1
    )
    assert vllm_args(["-dp", "4", "-dpm"], dp_ranks=1).api_server_count == 1
    assert vllm_args(["--headless"], dp_ranks=1).api_server_count == 0
    for bad in (
        ["--enable-server-load-tracking=true"],
        ["--api-server-count"],
        ["--api-server-count", "two"],
        ["-dp", "0"],
        ["-dpe", "-dph"],
        ["--headless", "--api-server-count", "2"],
    ):
        with pytest.raises(ValueError):
            vllm_args(bad, dp_ranks=1)


def test_a_command_line_vllm_would_not_start_with_is_refused() -> None:
    with pytest.raises(ValueError), emulators(prefix="bad") as make:
        make(EngineKind.VLLM, args=("--enable-server-load-tracking=1",))


def test_the_stand_in_operator_hands_the_engine_container_command_line() -> None:
    pod = k8s.V1Pod(
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(name="sidecar", args=["--enable-server-load-tracking"]),
                k8s.V1Container(name="main", command=["vllm", "serve"], args=["m", *TRACK[3:]]),
            ]
        )
    )
    assert _command_line(pod) == ["vllm", "serve", "m", "--enable-server-load-tracking"]
    assert _command_line(k8s.V1Pod(spec=k8s.V1PodSpec(containers=[]))) == []


def test_the_wait_one_shot_ends_when_the_front_end_lets_go_of_the_last_request(
    start: Callable[..., EngineEmulator],
) -> None:
    """The drain's wait for idle (activities/oneshot.py ``WAIT_SCRIPT``), run for real: it
    waits while the request is in the engine and while only the front end still holds it
    (its gauges already 0), and ends within its poll once ``/load`` reads 0."""
    emu = start(EngineKind.VLLM, request_seconds=0.8, args=TRACK)
    emu.set_frontend_hidden(0.8)
    bg = completion(emu)
    eventually(lambda: load(emu) == 1, timeout=WAIT, interval=0.01)
    argv = wait_command(port=emu.metrics_port, scheme="http", wait_s=10.0)
    argv[0] = sys.executable
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
    ended = time.monotonic()
    bg.join(timeout=WAIT)
    head, _, waited = out.strip("\n").partition("\t")
    assert head == "#idle", out
    assert load(emu) == 0
    assert 0.5 < float(waited) < ended - started  # it did wait for the request, no longer
