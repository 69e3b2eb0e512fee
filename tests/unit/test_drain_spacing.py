"""The spacing of drain reads (``retirement.drain.next_read_in``): quick while the members
read idle, nearly idle or incomplete; doubling while they stay busy, up to the bound and a
share of the time left; and what that costs a fleet in execs per second."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retirement.drain import (
    EXACT_IDLE_SPACING_S,
    MAX_READ_SPACING_S,
    NEAR_IDLE_IN_FLIGHT,
    SPACING_SHARE_OF_TIME_LEFT,
    STALE_AFTER_INTERVALS,
    DrainProgress,
    busy_in_flight,
    next_read_in,
    resume,
)
from retirement.readings import Sample, unknown

BUSY = NEAR_IDLE_IN_FLIGHT + 8


def waits(in_flight: list[float | None], *, base: float = 1.0, left: float = 240.0) -> list[float]:
    """The waits after each of a sequence of rounds (time left held fixed)."""
    out, previous = [], base
    for n in in_flight:
        previous = next_read_in(in_flight=n, previous_s=previous, base_s=base, left_s=left)
        out.append(previous)
    return out


def test_busy_reads_double_up_to_the_bound() -> None:
    assert MAX_READ_SPACING_S == 8.0
    assert waits([BUSY] * 6) == [2.0, 4.0, 8.0, 8.0, 8.0, 8.0]


@pytest.mark.parametrize("n", [0.0, 1.0, NEAR_IDLE_IN_FLIGHT])
def test_idle_or_nearly_idle_rounds_are_followed_quickly(n: float) -> None:
    assert next_read_in(in_flight=n, previous_s=8.0, base_s=1.0, left_s=240.0) == 1.0


def test_rounds_that_could_not_be_read_back_off_like_busy_ones() -> None:
    """An incomplete round (an exec that timed out under load) is followed later, not at
    once: 2, 4, 8, 8 s, and at once again after the first complete idle round."""
    waits, previous = [], 1.0
    for _ in range(4):
        previous = next_read_in(in_flight=None, previous_s=previous, base_s=1.0, left_s=240.0)
        waits.append(previous)
    assert waits == [2.0, 4.0, 8.0, 8.0]
    assert next_read_in(in_flight=0.0, previous_s=8.0, base_s=1.0, left_s=240.0) == 1.0


def test_a_busy_spell_after_a_quick_round_starts_again_from_the_base() -> None:
    assert waits([BUSY, BUSY, BUSY, 1.0, BUSY, BUSY]) == [2.0, 4.0, 8.0, 1.0, 2.0, 4.0]


def test_the_spacing_shrinks_as_the_deadline_nears_so_the_idle_reads_still_fit() -> None:
    assert waits([BUSY] * 3, left=12.0) == [2.0, 3.0, 3.0]  # a quarter of 12 s
    assert waits([BUSY] * 3, left=2.0) == [1.0, 1.0, 1.0]  # never below the base interval
    assert waits([BUSY], left=-5.0) == [1.0]


def test_a_poll_interval_above_the_bound_is_used_as_it_is() -> None:
    assert waits([BUSY, BUSY], base=10.0) == [10.0, 10.0]


def test_the_bound_is_a_parameter() -> None:
    assert next_read_in(in_flight=BUSY, previous_s=4.0, base_s=1.0, left_s=240, bound_s=5) == 5


@given(
    n=st.none() | st.floats(min_value=0, max_value=1e6),
    previous=st.floats(min_value=0, max_value=120),
    base=st.floats(min_value=0.01, max_value=60),
    left=st.floats(min_value=-100, max_value=86400),
)
def test_the_spacing_stays_within_its_documented_bound(
    n: float | None, previous: float, base: float, left: float
) -> None:
    wait = next_read_in(in_flight=n, previous_s=previous, base_s=base, left_s=left)
    assert base <= wait <= max(base, min(MAX_READ_SPACING_S, SPACING_SHARE_OF_TIME_LEFT * left))
    if n is not None and n <= NEAR_IDLE_IN_FLIGHT:
        assert wait == base


def test_the_read_after_an_idle_read_comes_within_the_resume_window() -> None:
    """``resume`` judges a resumed idle read's age in base poll intervals: this stays right
    with adaptive spacing because the wait after an idle round is always the base one, so
    an idle read older than ``STALE_AFTER_INTERVALS`` base intervals means a read was
    missed, however far apart the busy reads before it were."""
    base = 1.0
    after_idle = next_read_in(in_flight=0.0, previous_s=MAX_READ_SPACING_S, base_s=base, left_s=99)
    assert after_idle == base < STALE_AFTER_INTERVALS * base
    now = datetime.now(UTC)
    read = {"m": Sample(complete=True, counters=(1.0, 2.0))}
    kept = DrainProgress(rounds=9, previous_idle=read, previous_idle_at=now - timedelta(seconds=1))
    assert resume(kept, now=now, poll_interval_s=base) == kept
    late = kept.model_copy(update={"previous_idle_at": now - timedelta(seconds=MAX_READ_SPACING_S)})
    assert resume(late, now=now, poll_interval_s=base).previous_idle is None


def test_what_a_round_says_of_how_busy_the_members_are() -> None:
    a, b = Sample(complete=True, in_flight=3), Sample(complete=True, in_flight=2)
    assert busy_in_flight(("a", "b"), {"a": a, "b": b}) == 5
    assert busy_in_flight(("a", "b"), {"a": a}) is None  # a member not read
    assert busy_in_flight(("a", "b"), {"a": a, "b": unknown("exec failed")}) is None
    assert busy_in_flight((), {}) is None


def test_what_a_fleet_costs_in_execs_per_second() -> None:
    """One exec per measured member per round.  A member busy through a whole 240 s drain
    budget is read 39 times instead of 240 (0.125 execs/s once the spacing has grown, the
    last reads closer as the deadline nears: 0.16/s on average, against 1/s); an idle or
    nearly idle one is read every second.  500 busy retirements: 62.5 execs/s in steady
    state, not 500."""
    t, reads, previous = 0.0, 0, 1.0
    while t < 240.0:
        reads += 1
        previous = next_read_in(in_flight=BUSY, previous_s=previous, base_s=1.0, left_s=240 - t)
        t += previous
    assert reads == 39
    steady = 1 / waits([BUSY] * 5)[-1]
    assert steady == 0.125 and 500 * steady == 62.5
    assert 1 / waits([0.0])[-1] == 1.0


def test_an_exact_idle_read_is_followed_after_the_exact_spacing_not_a_poll_interval() -> None:
    kw = {"previous_s": 1.0, "base_s": 1.0, "left_s": 200.0}
    assert next_read_in(in_flight=0, idle_s=EXACT_IDLE_SPACING_S, **kw) == EXACT_IDLE_SPACING_S
    assert next_read_in(in_flight=0, **kw) == 1.0  # no exact count: the poll interval
    # Something in flight, or an unreadable round: the usual spacing, exact or not.
    assert next_read_in(in_flight=1, idle_s=EXACT_IDLE_SPACING_S, **kw) == 1.0
    assert next_read_in(in_flight=None, idle_s=EXACT_IDLE_SPACING_S, **kw) == 2.0
    # A poll interval below the exact spacing is kept.
    fast = {"previous_s": 0.1, "base_s": 0.1, "left_s": 200.0}
    assert next_read_in(in_flight=0, idle_s=EXACT_IDLE_SPACING_S, **fast) == 0.1


def test_requests_held_by_the_front_end_count_as_in_flight_for_the_spacing() -> None:
    held = Sample(complete=True, in_flight=0, counters=(1.0,), exact=2)
    assert busy_in_flight(("m",), {"m": held}) == 2
