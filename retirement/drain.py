"""The drain rule: every measured member idle on two consecutive complete reads, with the
work counters unchanged between them, while the withdrawal still holds (SPEC section 4).

The counter check covers the engines' known traps: gauges that stay stale after mass
aborts, and vLLM requests still in the HTTP front end that the scheduler gauges miss.

The withdrawal is confirmed again in every round, after that round's reads: a round whose
confirmation failed is not idle, so the two idle reads that VERIFY are each followed by a
confirmation, and the last confirmation is no older than the second idle read.

Reads are spaced adaptively (``next_read_in``): each one is an exec through the API
server, so a fleet of busy engines must not cost one exec per retirement per second.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from retirement.phases import Verdict
from retirement.readings import Sample

#: A resumed drain compares against the previous attempt's idle read only if that read is
#: no older than this many poll intervals: otherwise rounds were missed, and the two reads
#: would not be consecutive.  Adaptive spacing keeps this right: the read after an idle
#: round is due one base poll interval later (``next_read_in``), so an idle read older
#: than two base intervals means a read was missed, whatever the spacing before it.  (When
#: the polls themselves are slow, ``activities.polling.backpressure`` may wait longer; an
#: idle read then ages past the bound and a resumed attempt reads twice again: only ever
#: more reads, never fewer.)
STALE_AFTER_INTERVALS = 2.0

#: The bound on the spacing of drain reads while the members stay busy (seconds).  With
#: the default 1 s poll interval a busy retirement costs at most one exec per measured
#: member every 8 s once its spacing has grown (1, 2, 4, 8, 8, ... s); an idle or nearly
#: idle one, one per second.  A poll interval above the bound is used as it is.
MAX_READ_SPACING_S = 8.0
#: ... and never more than this fraction of the time left to the phase deadline, so that
#: when the engine goes quiet late in the budget, the two idle reads still fit.
SPACING_SHARE_OF_TIME_LEFT = 0.25
#: A round whose measured members hold at most this many requests in flight in total is
#: nearly idle: the next read comes after the base interval, as after an idle one.
NEAR_IDLE_IN_FLIGHT = 2.0


#: SGLang releases without the per-step counter (``retirement.readings.steps_counted``):
#: no idle verdict until the gauges have had time to be written after the engine last did
#: work.  SGLang writes them after a prefill batch and every ``--decode-log-interval``
#: decode batches (default 40, metrics_reporter.py ``report_decode_stats``); at ~0.1 s a
#: decode step for a large model, 40 steps take 4 s.  A read that is not idle, or counters
#: that moved, start the wait again.
SGLANG_GAUGE_SETTLE_S = 4.0


class DrainProgress(BaseModel):
    """What the rule remembers between rounds (carried in heartbeat details)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rounds: int = 0
    #: The previous round's samples when it was complete and idle, else None.
    previous_idle: dict[str, Sample] | None = None
    #: When the previous idle round was read (None: unknown, never resumed from).
    previous_idle_at: datetime | None = None
    #: When the engine was last seen at work (a round not idle, counters that moved) or
    #: the first round: the settle of engines whose gauges lag runs from it.
    worked_at: datetime | None = None


def resume(progress: DrainProgress, *, now: datetime, poll_interval_s: float) -> DrainProgress:
    """The progress a resumed attempt may go on from: the previous attempt's idle read is
    kept only when it is recent (no older than ``STALE_AFTER_INTERVALS`` poll intervals,
    and not from the future); a stale or undated one is discarded."""
    if progress.previous_idle is None:
        return progress
    at = progress.previous_idle_at
    if at is not None and at.tzinfo is not None and now.tzinfo is not None:
        age = (now - at).total_seconds()
        if -poll_interval_s <= age <= STALE_AFTER_INTERVALS * poll_interval_s:
            return progress
    return DrainProgress(rounds=progress.rounds)


def busy_in_flight(measured: tuple[str, ...], samples: Mapping[str, Sample]) -> float | None:
    """The requests in flight over the measured members when every one of them read
    complete (None otherwise: an incomplete or missing read says nothing of how busy the
    engine is)."""
    if not measured or any(m not in samples or not samples[m].complete for m in measured):
        return None
    return sum(samples[m].in_flight + (samples[m].exact or 0) for m in measured)


#: The spacing of the read after an idle one when every measured member counts its
#: requests exactly (``Sample.exact``): the count has no refresh lag (it moves at the
#: handler's start and after the last byte), so the second read need only come after the
#: engine's next step has refreshed its gauges and counters (vLLM: every engine step,
#: milliseconds): a quarter second, not a whole poll interval.
EXACT_IDLE_SPACING_S = 0.25


def next_read_in(
    *,
    in_flight: float | None,
    previous_s: float,
    base_s: float,
    left_s: float,
    bound_s: float = MAX_READ_SPACING_S,
    idle_s: float | None = None,
) -> float:
    """Seconds until the next drain round, after a round that read ``in_flight`` requests
    (``busy_in_flight``), the previous wait having been ``previous_s``.

    Quick (``base_s``) after a round that was idle or nearly idle
    (``NEAR_IDLE_IN_FLIGHT``): the engine may be done at any moment, and the read after a
    first idle read must follow at once (the two must be consecutive, and ``resume`` judges
    an idle read's age in base intervals).  While the members stay busy, or a round could
    not be read (``in_flight`` None: most often an exec that timed out because the API
    server or the node is overloaded; more reads would only add to it), the wait doubles,
    bounded by ``bound_s`` and by ``SPACING_SHARE_OF_TIME_LEFT`` of ``left_s`` (the time left
    to the deadline); never below ``base_s``.  Waiting longer skips no read: the rounds stay
    consecutive, only further apart, and an incomplete round breaks a pair of idle reads
    anyway.  ``idle_s``: the wait after a round that read nothing in flight at all, when the
    members count exactly (``EXACT_IDLE_SPACING_S``).
    """
    if in_flight == 0 and idle_s is not None:
        return min(idle_s, base_s)
    if in_flight is not None and in_flight <= NEAR_IDLE_IN_FLIGHT:
        return base_s
    bound = min(bound_s, SPACING_SHARE_OF_TIME_LEFT * max(left_s, 0.0))
    return max(base_s, min(bound, 2 * max(previous_s, base_s)))


def observe_round(
    progress: DrainProgress,
    *,
    measured: tuple[str, ...],
    samples: Mapping[str, Sample],
    not_withdrawn: str = "",
    at: datetime | None = None,
    settle_s: float = 0.0,
) -> tuple[DrainProgress, Verdict, str]:
    """Fold one round of reads (one per measured member) into the rule.

    ``not_withdrawn`` says why the withdrawal could not be confirmed again after this
    round's reads (empty: confirmed); such a round is never idle.  ``at`` is when the round
    was read, remembered with an idle round so that a resumed attempt can tell its age.

    ``settle_s``: an engine whose gauges lag its work (SGLang without the per-step counter)
    reads idle only from ``settle_s`` after it was last seen at work.

    Returns the new progress, the verdict (VERIFIED only when this round and the previous
    one are both complete and idle with unchanged counters, the withdrawal confirmed after
    each), and a reason for a person.
    """
    rounds = progress.rounds + 1
    worked = DrainProgress(rounds=rounds, worked_at=at or progress.worked_at)
    if not measured:
        return worked, Verdict.UNKNOWN, "no member to measure"
    if not_withdrawn:
        return worked, Verdict.UNKNOWN, f"withdrawal not confirmed: {not_withdrawn}"
    missing = [m for m in measured if m not in samples]
    if missing:
        return worked, Verdict.UNKNOWN, f"no read of {', '.join(missing)}"
    incomplete = [f"{m}: {samples[m].reason}" for m in measured if not samples[m].complete]
    if incomplete:
        return worked, Verdict.UNKNOWN, "; ".join(incomplete)
    busy = [_busy(m, samples[m]) for m in measured if not samples[m].idle]
    if busy:
        return worked, Verdict.UNKNOWN, "; ".join(busy)
    current = {m: samples[m] for m in measured}
    prev = progress.previous_idle
    since = progress.worked_at or at
    idle = DrainProgress(rounds=rounds, previous_idle=current, previous_idle_at=at, worked_at=since)
    if prev is None or set(prev) != set(current):
        return idle, Verdict.UNKNOWN, "first idle read"
    moved = [m for m in measured if prev[m].counters != current[m].counters]
    if moved:
        idle = idle.model_copy(update={"worked_at": at})
        return idle, Verdict.UNKNOWN, f"work counters moved between idle reads: {', '.join(moved)}"
    if settle_s > 0:
        first = progress.previous_idle_at
        waited = (first - since).total_seconds() if first and since else None
        if waited is None or waited < settle_s:
            return (
                idle,
                Verdict.UNKNOWN,
                (
                    f"idle, but the engine's gauges may lag its work: idle reads count from "
                    f"{settle_s:g} s after it was last seen at work"
                ),
            )
    return (idle, Verdict.VERIFIED, "idle on two consecutive complete reads, counters unchanged")


def _busy(member: str, s: Sample) -> str:
    front = f", {s.exact} held by its HTTP front end" if s.exact else ""
    return f"{member}: {s.in_flight:g} in flight{front}"
