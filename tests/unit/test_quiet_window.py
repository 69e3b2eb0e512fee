"""The router-less quiet window's decision (``retirement.quiet``), property-tested over
sequences of polls: it never verifies unless the counters stood still, with nobody held
in a front end, for the whole window; failed reads neither end nor restart it; and it
verifies as soon as a working read finds the window over."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from retirement.phases import Verdict
from retirement.quiet import QuietWindow, decide, ends_reads
from retirement.readings import Sample, unknown

WINDOW_S = 10.0
PODS = ("a", "b")


@dataclass(frozen=True)
class Poll:
    """One poll: how long after the previous one, and each member's read."""

    after_s: float
    reads: tuple[Sample, ...]


def complete(counter: float) -> Sample:
    return Sample(complete=True, counters=(counter,))


#: Mostly unmoving working reads (so windows run their course), some moved, failed or held.
reads_st = st.sampled_from(
    [
        *[complete(0.0)] * 6,
        complete(1.0),
        unknown("no exec slot within 3 s"),
        Sample(complete=True, counters=(0.0,), exact=1),
    ]
)
polls_st = st.lists(
    st.builds(
        Poll,
        after_s=st.floats(0.0, 8.0, allow_nan=False),
        reads=st.tuples(*(reads_st for _ in PODS)),
    ),
    max_size=25,
)


def run(polls: list[Poll]) -> list[tuple[float, tuple[tuple[str, Sample], ...], Verdict, bool]]:
    """Drive the decision as the withdrawal does: read in order up to the first read that
    decides the poll; (time, reads used, verdict, strained) per poll."""
    window, now, out = QuietWindow(), 0.0, []
    for poll in polls:
        now += poll.after_s
        used: list[tuple[str, Sample]] = []
        for pod, s in zip(PODS, poll.reads, strict=True):
            used.append((pod, s))
            if ends_reads(s):
                break
        decided = decide(window, used, now=now, window_s=WINDOW_S)
        window = decided.window
        out.append((now, tuple(used), decided.verdict, decided.strained))
    return out


def counters_of(used: tuple[tuple[str, Sample], ...]) -> dict[str, tuple[float, ...]] | None:
    """The poll's counters when every read worked and nobody is held; else None."""
    if any(not s.complete or s.exact for _, s in used):
        return None
    return {pod: s.counters for pod, s in used}


@given(polls_st)
def test_it_verifies_only_after_a_whole_window_of_unmoving_counters(polls: list[Poll]) -> None:
    """A VERIFIED poll has an earlier working poll, at least the window before it, with
    the same counters, and every poll since either failed to read or read them too (none
    saw a request held)."""
    results = run(polls)
    for k, (now, used, verdict, _) in enumerate(results):
        if verdict is not Verdict.VERIFIED:
            continue
        mine = counters_of(used)
        assert mine is not None
        start = None
        for j in range(k - 1, -1, -1):
            then, earlier, _, _ = results[j]
            theirs = counters_of(earlier)
            failed = any(not s.complete for _, s in earlier)
            if theirs is None and failed:
                continue  # a failed read saw nothing: it neither ends nor restarts
            if theirs != mine:
                break
            start = then
        assert start is not None and now - start >= WINDOW_S


@given(polls_st)
def test_a_failed_read_never_verifies_and_backs_off(polls: list[Poll]) -> None:
    for _, used, verdict, strained in run(polls):
        failed = any(not s.complete for _, s in used)
        assert strained == failed
        if failed or any(s.exact for _, s in used):
            assert verdict is Verdict.UNKNOWN


@given(
    counter=st.floats(0.0, 1e9, allow_nan=False),
    gaps=st.lists(st.floats(0.0, 4.0, allow_nan=False), min_size=1, max_size=20),
    failed=st.lists(st.booleans(), min_size=20, max_size=20),
)
def test_unmoving_counters_verify_once_the_window_is_over(
    counter: float, gaps: list[float], failed: list[bool]
) -> None:
    """Counters that stay put verify on the first working read at least the window after
    the first one, however many reads failed in between, and not before."""
    window = decide(QuietWindow(), [("a", complete(counter))], now=0.0, window_s=WINDOW_S).window
    now = 0.0
    for gap, fails in zip(gaps, failed, strict=False):
        now += gap
        read = unknown("exec timed out") if fails else complete(counter)
        decided = decide(window, [("a", read)], now=now, window_s=WINDOW_S)
        assert decided.window == window  # never restarted
        expected = not fails and now >= WINDOW_S
        assert (decided.verdict is Verdict.VERIFIED) == expected


@given(st.floats(0.0, 1e9, allow_nan=False), st.floats(0.0, 100.0, allow_nan=False))
def test_moved_counters_or_held_requests_start_again(counter: float, at: float) -> None:
    started = decide(QuietWindow(), [("a", complete(counter))], now=0.0, window_s=WINDOW_S)
    moved = decide(started.window, [("a", complete(counter + 1))], now=at, window_s=WINDOW_S)
    assert moved.verdict is Verdict.UNKNOWN
    assert moved.window == QuietWindow({"a": (counter + 1,)}, at)
    held = Sample(complete=True, counters=(counter,), exact=1)
    busy = decide(started.window, [("a", held)], now=at, window_s=WINDOW_S)
    assert busy.verdict is Verdict.UNKNOWN and busy.window == QuietWindow()


def test_the_reasons_read_as_before() -> None:
    """The readings' words are the withdrawal's (operators and tests read them)."""
    start = decide(QuietWindow(), [("a", complete(1.0))], now=0.0, window_s=WINDOW_S)
    assert start.reason == "router-less: quiet window started"
    mid = decide(start.window, [("a", complete(1.0))], now=4.0, window_s=WINDOW_S)
    assert mid.reason == "router-less: quiet for 4 s of 10"
    done = decide(start.window, [("a", complete(1.0))], now=12.0, window_s=WINDOW_S)
    assert done.reason == "router-less: counters quiet for 12 s"
    failed = decide(start.window, [("a", unknown("no slot"))], now=1.0, window_s=WINDOW_S)
    assert failed.reason == "router-less: a no slot"
    held = Sample(complete=True, counters=(1.0,), exact=2)
    busy = decide(start.window, [("a", held)], now=1.0, window_s=WINDOW_S)
    assert busy.reason == "router-less: a holds 2 request(s) (GET /load)"
