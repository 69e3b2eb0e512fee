"""The one-shot's exact mode, run for real (python3 -c) against a loopback server that
answers ``/metrics`` and ``/load`` as told: the count is read after the metrics, in the
same exec, and any answer that is not vLLM's ``{"server_load": N}`` reads UNKNOWN."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from activities.oneshot import TWICE_SPACING_S, command
from retirement.readings import SERIES, parse_oneshot_output, parse_oneshot_reads
from tests.helpers.fake_kube import oneshot_stdout
from tests.helpers.loopback_http import loopback_http

METRICS = "".join(f'{name}{{engine="0"}} 0.0\n' for name in SERIES["vLLM"].all).encode()


class Answers:
    def __init__(self) -> None:
        self.load: tuple[int, bytes] = (200, b'{"server_load": 0}')
        self.paths: list[str] = []


@pytest.fixture
def server() -> Iterator[tuple[int, Answers]]:
    answers = Answers()

    def respond(path: str) -> tuple[int, bytes]:
        answers.paths.append(path)
        return (200, METRICS) if path == "/metrics" else answers.load

    with loopback_http(respond) as port:
        yield port, answers


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


def read_twice(port: int) -> tuple[str, float]:
    argv = command(
        port=port, scheme="http", path="/metrics", names=SERIES["vLLM"].all, exact=True, twice=True
    )
    argv[0] = sys.executable
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
    return out, time.monotonic() - started


def test_the_double_read_reads_everything_twice_spaced_in_one_process(
    server: tuple[int, Answers],
) -> None:
    port, answers = server
    out, took = read_twice(port)
    assert answers.paths == ["/metrics", "/load", "/metrics", "/load"]
    assert out == oneshot_stdout(exact=0) * 2
    assert took >= TWICE_SPACING_S
    reads = parse_oneshot_reads(engine="vLLM", stdout=out, exact=True, reads=2)
    assert [(s.complete, s.exact) for s in reads] == [(True, 0), (True, 0)]


def test_a_double_read_whose_second_count_fails_keeps_its_first() -> None:
    one = oneshot_stdout(exact=0)
    reads = parse_oneshot_reads(
        engine="vLLM", stdout=one + "#error\tGET /load answered no count\n", exact=True, reads=2
    )
    assert reads[0].complete and reads[0].exact == 0
    assert not reads[1].complete and "no count" in reads[1].reason


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        ("", "incomplete"),  # nothing printed (killed before its first read)
        (oneshot_stdout(exact=0)[: -len("#end\n")], "incomplete"),  # cut inside the first
        (oneshot_stdout(exact=0) * 3, "past its 2"),  # more reads than asked for
        (oneshot_stdout(exact=0) * 2 + "x\t1\n", "past its 2"),  # output after the last
    ],
)
def test_a_double_read_that_is_not_two_whole_reads_is_unknown_where_it_is_not(
    stdout: str, why: str
) -> None:
    reads = parse_oneshot_reads(engine="vLLM", stdout=stdout, exact=True, reads=2)
    assert len(reads) == 2 and not reads[1].complete
    assert any(why in s.reason for s in reads), reads


def test_a_double_read_is_for_the_exact_count_only() -> None:
    with pytest.raises(ValueError):
        command(port=1, scheme="http", path="/metrics", names=("a",), twice=True)
