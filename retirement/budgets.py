"""Budgets of a retirement: frozen at admission; a phase ends at the earlier of the
overall deadline and its own start plus its budget (SPEC section 4)."""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field, model_validator

from retirement.phases import Phase


class Budgets(BaseModel):
    """Seconds each part of a retirement may take."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    overall_s: float = Field(default=300.0, gt=0, le=86400)
    withdrawal_s: float = Field(default=30.0, gt=0, le=86400)
    drain_s: float = Field(default=240.0, gt=0, le=86400)
    settle_s: float = Field(default=30.0, gt=0, le=86400)
    #: The spacing of polls.  Drain reads use it as their base: they are spaced out while
    #: the engine stays busy, up to ``retirement.drain.MAX_READ_SPACING_S`` (and a quarter
    #: of the time left), and come back to this interval once it reads (nearly) idle.
    poll_interval_s: float = Field(default=1.0, gt=0, le=60)

    @model_validator(mode="after")
    def _phases_fit(self) -> Budgets:
        if self.poll_interval_s > min(self.withdrawal_s, self.drain_s, self.settle_s):
            raise ValueError("poll_interval_s must not exceed any phase budget")
        return self

    def for_phase(self, phase: Phase) -> float | None:
        """The budget of ``phase`` in seconds, or None for a phase with no budget of its own
        (it is bounded by the overall deadline only)."""
        return {
            Phase.WITHDRAWING: self.withdrawal_s,
            Phase.DRAINING: self.drain_s,
            Phase.SETTLING: self.settle_s,
        }.get(phase)


def overall_deadline(*, admitted_at: datetime, budgets: Budgets) -> datetime:
    """When the whole retirement must be done."""
    return admitted_at + timedelta(seconds=budgets.overall_s)


def phase_deadline(
    *, phase: Phase, phase_started_at: datetime, overall: datetime, budgets: Budgets
) -> datetime:
    """``min(overall deadline, phase start + phase budget)``; never later than ``overall``."""
    own = budgets.for_phase(phase)
    if own is None:
        return overall
    return min(overall, phase_started_at + timedelta(seconds=own))
