"""Phases, verdicts and outcomes of a retirement (how they move is ``retirement.protocol``)."""

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
    CAPACITY_RETAINED = "CapacityRetained"  # the intent went away (cancel-intent), all back
    #: Asked to end (cancel-intent) while members were not back in service, and still not
    #: back after a bound: ended naming them (a Warning Event, an alert).
    ABANDONED = "Abandoned"
    REFUSED = "Refused"  # admission refused; nothing was touched


def abortable(phase: Phase) -> bool:
    """Whether an abort (request, budget or fault) may still stop the retirement."""
    return ORDER.index(phase) < ORDER.index(POINT_OF_NO_RETURN) if phase in ORDER else False
