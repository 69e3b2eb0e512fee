"""The one-shot's ``quiet`` mode, run for real (``python3 -c``) against a loopback server
that answers ``/metrics`` and ``/load`` as told (as a function of time): it waits for the
count to read 0, reads, keeps the window on its own clock and reads again; the output is
judged by ``retirement.readings.parse_quiet_output`` and decided by
``retirement.quiet.decide_in_one``, and every way it can go wrong reads UNKNOWN."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from activities.oneshot import MAX_WAIT_S, MAX_WINDOW_S, WAIT_POLL_S, quiet_command
from retirement.phases import Verdict
from retirement.quiet import decide_in_one
from retirement.readings import SERIES, QuietReads, parse_quiet_output
from tests.helpers.loopback_http import loopback_http

NAMES = SERIES["vLLM"].all
COUNTERS = SERIES["vLLM"].counters


def metrics(finished: int) -> bytes:
    """vLLM's series, gauges idle, every counter at ``finished``."""
    return "".join(
        f'{n}{{engine="0"}} {float(finished) if n in COUNTERS else 0.0}\n' for n in NAMES
    ).encode()


class Engine:
    """What ``/load`` and ``/metrics`` answer, as functions of seconds since ``started``."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        #: Count time from the first ``/metrics`` read instead (0 before it): what the
        #: engine does then does not depend on how fast the one-shot's process started.
        self.from_first_read = False
        self.first_read: float | None = None
        self.load: Callable[[float], tuple[int, bytes]] = lambda _t: (200, b'{"server_load": 0}')
        self.finished: Callable[[float], int] = lambda _t: 3
        self.paths: list[str] = []


@pytest.fixture
def engine() -> Iterator[tuple[int, Engine]]:
    state = Engine()

    def respond(path: str) -> tuple[int, bytes]:
        now = time.monotonic()
        if path == "/metrics" and state.first_read is None:
            state.first_read = now
        if state.from_first_read:
            t = 0.0 if state.first_read is None else now - state.first_read
        else:
            t = now - state.started
        state.paths.append(path)
        return (200, metrics(state.finished(t))) if path == "/metrics" else state.load(t)

    with loopback_http(respond) as port:
        yield port, state


def run(port: int, *, wait_s: float, window_s: float) -> tuple[str, float]:
    argv = quiet_command(
        port=port, scheme="http", path="/metrics", names=NAMES, wait_s=wait_s, window_s=window_s
    )
    argv[0] = sys.executable
    began = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout
    return out, time.monotonic() - began


def judged(out: str, window_s: float) -> tuple[QuietReads, Verdict, str]:
    seen = parse_quiet_output(engine="vLLM", stdout=out)
    decided = decide_in_one("llm-1", seen, window_s=window_s)
    return seen, decided.verdict, decided.reason


def test_an_idle_engine_keeps_its_window_in_one_exec(engine: tuple[int, Engine]) -> None:
    port, state = engine
    out, took = run(port, wait_s=5.0, window_s=0.6)
    seen, verdict, why = judged(out, 0.6)
    assert verdict is Verdict.VERIFIED, (why, out)
    assert seen.apart_s >= 0.6 and 0.6 <= took < 5.0
    assert [r.exact for r in seen.reads] == [0, 0]
    # Wait, read (metrics then count), window, read.
    assert state.paths == ["/load", "/metrics", "/load", "/metrics", "/load"]


def test_it_waits_for_the_count_to_read_zero_before_the_window(
    engine: tuple[int, Engine],
) -> None:
    port, state = engine
    state.started = time.monotonic()
    state.load = lambda t: (200, b'{"server_load": %d}' % (2 if t < 1.0 else 0))
    state.finished = lambda t: 3 if t < 1.0 else 5  # the two requests finished at 1 s
    out, took = run(port, wait_s=10.0, window_s=0.5)
    seen, verdict, why = judged(out, 0.5)
    assert verdict is Verdict.VERIFIED, (why, out)
    assert out.startswith("#waited\t") and 1.0 <= float(out.split("\t")[1].split()[0]) < 2.0
    assert 1.5 <= took < 6.0
    assert seen.reads[0].counters == seen.reads[1].counters == (5.0,) * len(COUNTERS)


def test_a_count_above_zero_for_the_whole_wait_is_busy_and_reads_nothing(
    engine: tuple[int, Engine],
) -> None:
    port, state = engine
    state.load = lambda _t: (200, b'{"server_load": 4}')
    out, took = run(port, wait_s=0.6, window_s=0.5)
    assert out == "#busy\t4\n"
    seen, verdict, why = judged(out, 0.5)
    assert seen.busy == 4 and verdict is Verdict.UNKNOWN and "holds 4 request(s)" in why
    assert "/metrics" not in state.paths and 0.6 <= took < 4.0
    assert len(state.paths) >= int(0.6 / WAIT_POLL_S)


def test_no_wait_asked_reads_busy_at_once(engine: tuple[int, Engine]) -> None:
    port, state = engine
    state.load = lambda _t: (200, b'{"server_load": 1}')
    out, _ = run(port, wait_s=0.0, window_s=0.5)
    assert out == "#busy\t1\n" and state.paths == ["/load"]


def test_a_request_that_came_and_went_in_the_window_moved_the_counters(
    engine: tuple[int, Engine],
) -> None:
    port, state = engine
    state.from_first_read = True
    state.finished = lambda t: 3 if t < 0.3 else 4
    out, _ = run(port, wait_s=1.0, window_s=0.8)
    _, verdict, why = judged(out, 0.8)
    assert verdict is Verdict.UNKNOWN and "counters moved" in why, out


def test_a_request_held_at_the_window_end_is_counted(engine: tuple[int, Engine]) -> None:
    port, state = engine
    state.from_first_read = True
    state.load = lambda t: (200, b'{"server_load": %d}' % (0 if t < 0.4 else 1))
    out, _ = run(port, wait_s=1.0, window_s=0.8)
    seen, verdict, why = judged(out, 0.8)
    assert seen.reads[1].exact == 1
    assert verdict is Verdict.UNKNOWN and "holds 1 request(s)" in why, out


@pytest.mark.parametrize(
    "answer",
    [(500, b"oops"), (200, b'{"server_load": -1}'), (200, b'{"server_load": 1.5}'), (200, b"{")],
)
def test_a_count_that_is_not_one_reads_unknown(
    engine: tuple[int, Engine], answer: tuple[int, bytes]
) -> None:
    port, state = engine
    state.load = lambda _t: answer
    out, _ = run(port, wait_s=1.0, window_s=0.5)
    seen, verdict, why = judged(out, 0.5)
    assert out.startswith("#error\t"), out
    assert verdict is Verdict.UNKNOWN and not any(r.complete for r in seen.reads), why


def test_a_count_that_breaks_at_the_window_end_reads_unknown(engine: tuple[int, Engine]) -> None:
    port, state = engine
    state.from_first_read = True
    state.load = lambda t: (200, b'{"server_load": 0}') if t < 0.3 else (503, b"")
    out, _ = run(port, wait_s=1.0, window_s=0.6)
    seen, verdict, _why = judged(out, 0.6)
    assert seen.reads[0].complete and not seen.reads[1].complete, out
    assert verdict is Verdict.UNKNOWN


@pytest.mark.parametrize(
    ("wait_s", "window_s"),
    [(-1.0, 1.0), (MAX_WAIT_S + 1, 1.0), (1.0, 0.0), (1.0, MAX_WINDOW_S + 1)],
)
def test_arguments_out_of_range_are_refused(wait_s: float, window_s: float) -> None:
    with pytest.raises(ValueError):
        quiet_command(
            port=8000, scheme="http", path="/metrics", names=NAMES, wait_s=wait_s, window_s=window_s
        )


def test_the_script_refuses_arguments_out_of_range_itself(engine: tuple[int, Engine]) -> None:
    port, state = engine
    argv = quiet_command(
        port=port, scheme="http", path="/metrics", names=NAMES, wait_s=1.0, window_s=1.0
    )
    argv[0], argv[8] = sys.executable, "0"  # a zero window, past the Python-side check
    out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout
    assert out == "#error\tbad arguments\n" and state.paths == []


def block(finished: float, load: int) -> str:
    return (
        "".join(f"{n}\t{finished if n in COUNTERS else 0.0!r}\n" for n in NAMES)
        + f"#load\t{load}\n#end\n"
    )


GOOD = "#waited\t0.000\n" + block(3.0, 0) + "#apart\t2.001\n" + block(3.0, 0)


@pytest.mark.parametrize(
    "out",
    [
        "",
        "#busy\t\n",
        "#busy\t01\n",
        "#busy\t1\n#waited\t0.000\n",
        "#waited\t0.0\n" + block(3.0, 0) + "#apart\t2.001\n" + block(3.0, 0),
        "#waited\t0.000\n" + block(3.0, 0) + "#apart\t2.0\n" + block(3.0, 0),
        "#waited\t0.000\n" + block(3.0, 0) + block(3.0, 0),
        "#waited\t0.000\n#apart\t2.001\n" + block(3.0, 0) + block(3.0, 0),
        GOOD + "#apart\t2.001\n" + block(3.0, 0),
        GOOD + "extra\n",
        GOOD.replace("#load\t0", "#load\tnone"),
        GOOD.rsplit("#end", 1)[0],
        block(3.0, 0) + "#apart\t2.001\n" + block(3.0, 0),
    ],
)
def test_output_that_is_not_the_one_shots_never_verifies(out: str) -> None:
    seen = parse_quiet_output(engine="vLLM", stdout=out)
    decided = decide_in_one("llm-1", seen, window_s=2.0)
    assert decided.verdict is Verdict.UNKNOWN, (out, seen)


def test_the_well_formed_output_verifies_only_a_window_as_long_as_asked() -> None:
    seen = parse_quiet_output(engine="vLLM", stdout=GOOD)
    assert seen.apart_s == 2.001
    assert decide_in_one("llm-1", seen, window_s=2.0).verdict is Verdict.VERIFIED
    too_short = decide_in_one("llm-1", seen, window_s=2.5)
    assert too_short.verdict is Verdict.UNKNOWN and "under the 2.5 s window" in too_short.reason


def test_an_unknown_read_strains_the_next_poll() -> None:
    cut = "#waited\t0.000\n" + block(3.0, 0) + "#apart\t2.001\n#error\tGET failed\n"
    decided = decide_in_one("llm-1", parse_quiet_output(engine="vLLM", stdout=cut), window_s=2.0)
    assert decided.verdict is Verdict.UNKNOWN and decided.strained
