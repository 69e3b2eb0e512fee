"""Phases, verdicts and outcomes of a retirement, and how a verdict moves a phase."""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    """The protocol's phases, in order (SPEC section 4)."""

    ADMITTED = "Admitted"
    DISQUALIFIED = "Disqualified"
    WITHDRAWING = "Withdrawing"
    DRAINING = "Draining"
    DELETING = "Deleting"
    SETTLING = "Settling"
    COMPLETED = "Completed"
    ABORTED = "Aborted"


ORDER: tuple[Phase, ...] = (
    Phase.ADMITTED,
    Phase.DISQUALIFIED,
    Phase.WITHDRAWING,
    Phase.DRAINING,
    Phase.DELETING,
    Phase.SETTLING,
    Phase.COMPLETED,
)

#: Once deletion has begun there is no abort: the remaining deletes finish.
POINT_OF_NO_RETURN = Phase.DELETING


class Verdict(StrEnum):
    """The verdict of one observation."""

    VERIFIED = "VERIFIED"  # admits the next step
    UNKNOWN = "UNKNOWN"  # holds; the budget bounds the hold
    FAILED = "FAILED"  # revokes: abort now


class Outcome(StrEnum):
    """How a retirement (one workflow run) ended, or where it stands."""

    RUNNING = "Running"
    COMPLETED = "Completed"
    COMPLETED_UNSETTLED = "CompletedUnsettled"  # deleted; settle budget ran out unconfirmed
    ABORTED = "Aborted"  # held, replica kept and serving, waiting for a retry
    CAPACITY_RETAINED = "CapacityRetained"  # the intent went away (cancel-intent) or release
    CANCELLED = "Cancelled"  # cancelled from the UI: aborted, restored, ended
    REFUSED = "Refused"  # admission refused; nothing was touched


def abortable(phase: Phase) -> bool:
    """Whether an abort (request, budget or fault) may still stop the retirement."""
    return ORDER.index(phase) < ORDER.index(POINT_OF_NO_RETURN) if phase in ORDER else False


def next_phase(phase: Phase) -> Phase:
    """The phase after ``phase`` on the success path."""
    if phase not in ORDER or phase is Phase.COMPLETED:
        raise ValueError(f"no phase follows {phase}")
    return ORDER[ORDER.index(phase) + 1]


def advance(phase: Phase, verdict: Verdict) -> Phase:
    """Where one observation's verdict takes a phase.

    VERIFIED admits the next phase; UNKNOWN holds where it is; FAILED aborts while the
    phase is still abortable, and holds after the point of no return (the remaining
    deletes must finish, so a fault there is retried, never turned into an abort).
    """
    if phase in (Phase.COMPLETED, Phase.ABORTED):
        return phase
    if verdict is Verdict.VERIFIED:
        return next_phase(phase)
    if verdict is Verdict.FAILED and abortable(phase):
        return Phase.ABORTED
    return phase
