"""The one-shots against the server vLLM and SGLang really run: uvicorn (with ``httptools``,
the parser its ``auto`` mode picks when installed, as ``uvicorn[standard]`` does, and with
``h11``, its pure-Python fallback), serving
``prometheus_client``'s ASGI app at ``/metrics`` as both mount it (vLLM's ``mount_metrics``,
SGLang's ``add_prometheus_middleware``: ``Mount("/metrics", make_asgi_app(registry=...))``
with the path regex that avoids Starlette's 307 to ``/metrics/``), and a JSON ``/load`` as
vLLM's FastAPI route answers it (``JSONResponse``, with a Content-Length).

The ASGI app sends no Content-Length, so uvicorn frames ``/metrics`` chunked: the one-shot's
own HTTP reader (it no longer imports ``http.client``: ``activities/oneshot.py``) must read
that framing exactly as the engines send it.  The chunked framing is checked first, so the
test cannot pass on a body framed some other way."""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from prometheus_client import CollectorRegistry, Counter, Gauge, make_asgi_app
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from activities.oneshot import command, wait_command
from retirement.readings import SERIES, parse_oneshot_reads

NAMES = SERIES["vLLM"].all


class Engine:
    """The metrics and the count a test sets, served by uvicorn on loopback."""

    def __init__(self, http: str, tls: tuple[Path, Path] | None = None) -> None:
        self.scheme = "http" if tls is None else "https"
        self.registry = CollectorRegistry()
        self.running = Gauge("vllm:num_requests_running", "", ["engine"], registry=self.registry)
        self.waiting = Gauge("vllm:num_requests_waiting", "", ["engine"], registry=self.registry)
        self.prompt = Counter("vllm:prompt_tokens", "", ["engine"], registry=self.registry)
        self.generation = Counter("vllm:generation_tokens", "", ["engine"], registry=self.registry)
        for rank in ("0", "1"):  # two data-parallel ranks, summed by the one-shot
            self.running.labels(rank).set(0)
            self.waiting.labels(rank).set(0)
            self.prompt.labels(rank).inc(0)
            self.generation.labels(rank).inc(0)
        self.load = 0

        async def load(_: Request) -> JSONResponse:
            return JSONResponse({"server_load": self.load})

        metrics = Mount("/metrics", make_asgi_app(registry=self.registry))
        # The engines' own workaround for Starlette's 307 from /metrics to /metrics/.
        metrics.path_regex = re.compile(r"^/metrics(?P<path>.*)$")
        app = Starlette(routes=[Route("/load", load), metrics])
        sock = socket.create_server(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            http=http,
            log_level="error",
            lifespan="off",
            ssl_certfile=None if tls is None else str(tls[0]),
            ssl_keyfile=None if tls is None else str(tls[1]),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[sock])), daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

    def raw_head(self, path: str) -> str:
        """The head of the answer to a plain HTTP/1.1 GET of ``path``."""
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        if self.scheme == "https":
            ctx = ssl.create_default_context()
            ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
            raw = ctx.wrap_socket(raw)
        with raw as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                assert chunk, data
                data += chunk
        return data.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (the one-shot does not verify it, as a
    metrics endpoint's is usually the engine's own)."""
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(params=["httptools", "h11", "httptools+tls"])
def engine(request: pytest.FixtureRequest, tls: tuple[Path, Path]) -> Iterator[Engine]:
    http, _, secure = str(request.param).partition("+")
    e = Engine(http, tls if secure else None)
    yield e
    e.stop()


def run(argv: list[str]) -> str:
    argv = [sys.executable, *argv[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=15, check=True).stdout


def test_the_metrics_come_chunked_and_the_count_with_a_length(engine: Engine) -> None:
    """The framing the rest of this file reads (a precondition, not the product)."""
    assert "transfer-encoding: chunked" in engine.raw_head("/metrics")
    assert "content-length:" in engine.raw_head("/load")


def test_a_double_exact_read_sums_the_ranks_and_reads_the_count(engine: Engine) -> None:
    engine.running.labels("1").set(3)
    engine.waiting.labels("0").set(2)
    engine.prompt.labels("0").inc(10)
    engine.generation.labels("1").inc(20)
    engine.load = 4
    argv = command(
        port=engine.port, scheme=engine.scheme, path="/metrics", names=NAMES, exact=True, twice=True
    )
    reads = parse_oneshot_reads(engine="vLLM", stdout=run(argv), exact=True, reads=2)
    for s in reads:
        assert s.complete, s
        assert s.in_flight == 5 and s.exact == 4 and s.counters == (10.0, 20.0), s


def test_an_idle_engine_reads_idle(engine: Engine) -> None:
    argv = command(
        port=engine.port, scheme=engine.scheme, path="/metrics", names=NAMES, exact=True, twice=True
    )
    reads = parse_oneshot_reads(engine="vLLM", stdout=run(argv), exact=True, reads=2)
    assert all(s.complete and s.idle and s.exact == 0 for s in reads), reads


def test_the_wait_one_shot_reads_the_count(engine: Engine) -> None:
    engine.load = 1
    out = run(wait_command(port=engine.port, scheme=engine.scheme, wait_s=0.6))
    assert out.startswith("#busy\t1"), out
    engine.load = 0
    out = run(wait_command(port=engine.port, scheme=engine.scheme, wait_s=0.6))
    assert out.startswith("#idle\t"), out


def test_the_one_shot_imports_no_http_client() -> None:
    """What a read costs the node is mostly the interpreter's start and its imports:
    ``http.client`` (with ``email`` and ``ssl``) was about 60 % of the one-shot's start."""
    argv = command(port=1, scheme="http", path="/metrics", names=NAMES, exact=True, twice=True)
    for script in (argv, wait_command(port=1, scheme="http", wait_s=0.3)):
        done = subprocess.run(
            [sys.executable, "-X", "importtime", *script[1:]],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        )
        assert done.stdout.startswith("#error\t"), done.stdout  # nothing listens on port 1
        imported = {line.split("|")[-1].strip() for line in done.stderr.splitlines()}
        assert not imported & {"http.client", "email.parser", "ssl", "socket"}, imported
