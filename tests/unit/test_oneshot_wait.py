"""The wait one-shot (``activities.oneshot.WAIT_SCRIPT``), run for real (``python3 -c``)
against a loopback server that answers ``GET /load`` as told: it ends as soon as the count
reads 0, at its bound while the count stays above 0, and on any answer that is not vLLM's
``{"server_load": N}`` at once, saying so."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from activities.oneshot import MAX_WAIT_S, WAIT_POLL_S, wait_command
from tests.helpers.loopback_http import loopback_http


class Load:
    """What ``GET /load`` answers, as a function of seconds since the server started."""

    def __init__(self) -> None:
        self.answer: Callable[[float], tuple[int, bytes]] = lambda _t: (200, b'{"server_load": 0}')
        self.started = time.monotonic()
        self.paths: list[str] = []


@pytest.fixture
def load() -> Iterator[tuple[int, Load]]:
    state = Load()

    def respond(path: str) -> tuple[int, bytes]:
        state.paths.append(path)
        return state.answer(time.monotonic() - state.started)

    with loopback_http(respond) as port:
        yield port, state


def wait(port: int, wait_s: float) -> tuple[str, float]:
    argv = wait_command(port=port, scheme="http", wait_s=wait_s)
    argv[0] = sys.executable
    started = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return out, time.monotonic() - started


def test_it_ends_as_soon_as_the_count_reads_zero(load: tuple[int, Load]) -> None:
    port, state = load
    state.started = time.monotonic()
    state.answer = lambda t: (200, b'{"server_load": %d}' % (3 if t < 1.0 else 0))
    out, took = wait(port, 10.0)
    since_busy = time.monotonic() - state.started
    head, tab, waited = out.strip("\n").partition("\t")
    assert (head, tab) == ("#idle", "\t"), out
    # ``waited`` runs on the one-shot's clock, from its own start (after the interpreter
    # started, a moment after the count began to read 3): not before the count read 0,
    # and soon after.
    assert since_busy >= 1.0
    assert 0 < float(waited) < 1.0 + 2 * WAIT_POLL_S + 1.0
    assert float(waited) <= took < 5.0
    assert set(state.paths) == {"/load"} and len(state.paths) >= 3


def test_it_ends_at_its_bound_while_the_count_stays_above_zero(load: tuple[int, Load]) -> None:
    port, state = load
    state.answer = lambda _t: (200, b'{"server_load": 7}')
    out, took = wait(port, 1.0)
    assert out == "#busy\t7\n"
    assert 1.0 <= took < 4.0


@pytest.mark.parametrize(
    "answer",
    [
        (404, b"Not Found"),
        (200, b"{}"),
        (200, b'{"server_load": -1}'),
        (200, b'{"server_load": 1.5}'),
        (200, b'{"server_load": true}'),
        (200, b"not json"),
        (200, b'{"server_load": 0, "pad": "' + b"x" * 5000 + b'"}'),
    ],
)
def test_an_answer_that_is_not_a_count_ends_it_at_once(
    load: tuple[int, Load], answer: tuple[int, bytes]
) -> None:
    port, state = load
    state.answer = lambda _t: answer
    out, took = wait(port, 10.0)
    assert out == "#error\tGET /load answered no count\n"
    assert took < 5.0


@contextlib.contextmanager
def free_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listened, for the test's span)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_nothing_listening_ends_it_at_once() -> None:
    with free_port() as port:
        out, took = wait(port, 10.0)
    assert out == "#error\tGET /load answered no count\n" and took < 5.0


def test_bad_arguments_are_refused() -> None:
    for kw in ({"port": 0}, {"wait_s": 0.0}, {"wait_s": MAX_WAIT_S + 1}, {"scheme": "ftp"}):
        args = {"port": 8000, "scheme": "http", "wait_s": 1.0, **kw}
        with pytest.raises(ValueError):
            wait_command(**args)  # type: ignore[arg-type]
    argv = wait_command(port=8000, scheme="http", wait_s=1.0)
    argv[0] = sys.executable
    for bad in (["0", "http", "1"], ["8000", "ftp", "1"], ["8000", "http", "999"], ["x"]):
        out = subprocess.run(
            [*argv[:3], *bad], capture_output=True, text=True, timeout=30, check=True
        ).stdout
        assert out == "#error\tbad arguments\n", bad
