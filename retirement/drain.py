"""The drain rule: every measured member idle on two consecutive complete reads, with the
work counters unchanged between them (SPEC section 4).

The counter check covers the engines' known traps: gauges that stay stale after mass
aborts, and vLLM requests still in the HTTP front end that the scheduler gauges miss.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict

from retirement.phases import Verdict
from retirement.readings import Sample


class DrainProgress(BaseModel):
    """What the rule remembers between rounds (carried in heartbeat details)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rounds: int = 0
    #: The previous round's samples when it was complete and idle, else None.
    previous_idle: dict[str, Sample] | None = None


def observe_round(
    progress: DrainProgress, *, measured: tuple[str, ...], samples: Mapping[str, Sample]
) -> tuple[DrainProgress, Verdict, str]:
    """Fold one round of reads (one per measured member) into the rule.

    Returns the new progress, the verdict (VERIFIED only when this round and the previous
    one are both complete and idle with unchanged counters), and a reason for a person.
    """
    rounds = progress.rounds + 1
    if not measured:
        return DrainProgress(rounds=rounds), Verdict.UNKNOWN, "no member to measure"
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
    if prev is None or set(prev) != set(current):
        return (DrainProgress(rounds=rounds, previous_idle=current), Verdict.UNKNOWN,
                "first idle read")
    moved = [m for m in measured if prev[m].counters != current[m].counters]
    if moved:
        return (DrainProgress(rounds=rounds, previous_idle=current), Verdict.UNKNOWN,
                f"work counters moved between idle reads: {', '.join(moved)}")
    return (DrainProgress(rounds=rounds, previous_idle=current), Verdict.VERIFIED,
            "idle on two consecutive complete reads, counters unchanged")
