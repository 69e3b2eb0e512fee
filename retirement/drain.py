"""The drain rule: every measured member idle on two consecutive complete reads, with the
work counters unchanged between them, while the withdrawal still holds (SPEC section 4).

The counter check covers the engines' known traps: gauges that stay stale after mass
aborts, and vLLM requests still in the HTTP front end that the scheduler gauges miss.

The withdrawal is confirmed again in every round, after that round's reads: a round whose
confirmation failed is not idle, so the two idle reads that VERIFY are each followed by a
confirmation, and the last confirmation is no older than the second idle read.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from retirement.phases import Verdict
from retirement.readings import Sample

#: A resumed drain compares against the previous attempt's idle read only if that read is
#: no older than this many poll intervals: otherwise rounds were missed, and the two reads
#: would not be consecutive.
STALE_AFTER_INTERVALS = 2.0


class DrainProgress(BaseModel):
    """What the rule remembers between rounds (carried in heartbeat details)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rounds: int = 0
    #: The previous round's samples when it was complete and idle, else None.
    previous_idle: dict[str, Sample] | None = None
    #: When the previous idle round was read (None: unknown, never resumed from).
    previous_idle_at: datetime | None = None


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


def observe_round(
    progress: DrainProgress,
    *,
    measured: tuple[str, ...],
    samples: Mapping[str, Sample],
    not_withdrawn: str = "",
    at: datetime | None = None,
) -> tuple[DrainProgress, Verdict, str]:
    """Fold one round of reads (one per measured member) into the rule.

    ``not_withdrawn`` says why the withdrawal could not be confirmed again after this
    round's reads (empty: confirmed); such a round is never idle.  ``at`` is when the round
    was read, remembered with an idle round so that a resumed attempt can tell its age.

    Returns the new progress, the verdict (VERIFIED only when this round and the previous
    one are both complete and idle with unchanged counters, the withdrawal confirmed after
    each), and a reason for a person.
    """
    rounds = progress.rounds + 1
    if not measured:
        return DrainProgress(rounds=rounds), Verdict.UNKNOWN, "no member to measure"
    if not_withdrawn:
        return (
            DrainProgress(rounds=rounds),
            Verdict.UNKNOWN,
            f"withdrawal not confirmed: {not_withdrawn}",
        )
    missing = [m for m in measured if m not in samples]
    if missing:
        return DrainProgress(rounds=rounds), Verdict.UNKNOWN, f"no read of {', '.join(missing)}"
    incomplete = [f"{m}: {samples[m].reason}" for m in measured if not samples[m].complete]
    if incomplete:
        return DrainProgress(rounds=rounds), Verdict.UNKNOWN, "; ".join(incomplete)
    busy = [f"{m}: {samples[m].in_flight:g} in flight" for m in measured if not samples[m].idle]
    if busy:
        return DrainProgress(rounds=rounds), Verdict.UNKNOWN, "; ".join(busy)
    current = {m: samples[m] for m in measured}
    prev = progress.previous_idle
    idle = DrainProgress(rounds=rounds, previous_idle=current, previous_idle_at=at)
    if prev is None or set(prev) != set(current):
        return idle, Verdict.UNKNOWN, "first idle read"
    moved = [m for m in measured if prev[m].counters != current[m].counters]
    if moved:
        return idle, Verdict.UNKNOWN, f"work counters moved between idle reads: {', '.join(moved)}"
    return (idle, Verdict.VERIFIED, "idle on two consecutive complete reads, counters unchanged")
