"""The one-shot's exact mode, run for real (python3 -c) against a loopback server that
answers ``/metrics`` and ``/load`` as told: the count is read after the metrics, in the
same exec, and any answer that is not vLLM's ``{"server_load": N}`` reads UNKNOWN."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from activities.oneshot import command
from retirement.readings import SERIES, parse_oneshot_output
from tests.helpers.fake_kube import oneshot_stdout

METRICS = "".join(f'{name}{{engine="0"}} 0.0\n' for name in SERIES["vLLM"].all).encode()


class Answers:
    def __init__(self) -> None:
        self.load: tuple[int, bytes] = (200, b'{"server_load": 0}')
        self.paths: list[str] = []


@pytest.fixture
def server() -> Iterator[tuple[int, Answers]]:
    answers = Answers()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answers.paths.append(self.path)
            status, body = (200, METRICS) if self.path == "/metrics" else answers.load
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1], answers
    finally:
        httpd.shutdown()


def read(port: int) -> str:
    argv = command(port=port, scheme="http", path="/metrics", names=SERIES["vLLM"].all, exact=True)
    argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def test_the_count_is_read_after_the_metrics_in_the_same_exec(
    server: tuple[int, Answers],
) -> None:
    port, answers = server
    answers.load = (200, b'{"server_load": 3}')
    out = read(port)
    assert answers.paths == ["/metrics", "/load"]
    assert out == oneshot_stdout(exact=3)
    s = parse_oneshot_output(engine="vLLM", stdout=out, exact=True)
    assert s.complete and s.exact == 3 and not s.idle


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (404, b'{"detail": "Not Found"}'),  # an engine without the route
        (200, b"not json"),
        (200, b'{"server_load": -1}'),
        (200, b'{"server_load": 1.0}'),
        (200, b'{"server_load": true}'),
        (200, b'{"server_load": "0"}'),
        (200, b'{"load": 0}'),
        (200, b"[0]"),
        (200, json.dumps({"server_load": 0, "pad": "x" * 5000}).encode()),  # over the cap
    ],
)
def test_an_answer_that_is_not_a_count_reads_unknown(
    server: tuple[int, Answers], status: int, body: bytes
) -> None:
    port, answers = server
    answers.load = (status, body)
    s = parse_oneshot_output(engine="vLLM", stdout=read(port), exact=True)
    assert not s.complete and not s.idle, s
    assert "/load" in s.reason or "cap" in s.reason, s.reason
