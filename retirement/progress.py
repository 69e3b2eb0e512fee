"""The state of one retirement attempt as the protocol sees it, and what reads it.

``Progress`` (what ``retirement.protocol.decide`` reads and returns, with the record of
what the attempt's activities reported, typed in ``retirement.reports``) and the
constants that bound it (the hold's recheck backoff, the freshness of the drain's
evidence, the routers' re-reads, the abandon bound, the cap on ``reasons``); the
predicates the workflow and the handlers ask of it (``interrupted``, ``settled``,
``hold_ends``, ``held``, ``abort_refusal``); and the small helpers every handler changes
it with (``capped`` and ``_note`` for reasons, ``_enter`` for a phase and its deadline,
``_ended``).

No I/O, no clock, like the rest of the protocol.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from retirement.budgets import Budgets, phase_deadline
from retirement.phases import ORDER, Outcome, Phase, abortable
from retirement.reports import DeleteResult, RestoreResult, Target

#: While held, members the restore could not yet put back are evaluated again: first after
#: RECHECK_FIRST, then twice as long each time, never more than RECHECK_MAX apart.
RECHECK_FIRST = timedelta(seconds=5)
RECHECK_MAX = timedelta(minutes=5)


def recheck_delay(rounds: int) -> timedelta:
    """How long a hold waits before evaluating held members again after ``rounds``."""
    return min(RECHECK_MAX, RECHECK_FIRST * (1 << min(max(rounds, 0), 10)))


#: Slack of the freshness bound of the drain's evidence (``freshness_bound``).
FRESH_SLACK = timedelta(seconds=10)


def freshness_bound(budgets: Budgets) -> timedelta:
    """How old the drain's last idle read may be when the delete acts on it (SPEC section
    4): two poll intervals (the read after it was due one interval later) plus slack for
    dispatch.  Older evidence is read again (Draining), never acted on."""
    return 2 * timedelta(seconds=budgets.poll_interval_s) + FRESH_SLACK


#: After a restore whose router selection was confirmed by time only (a router that may
#: still drop a worker it re-added: smg's drain job), the routers are read again this long
#: after the confirmation, each time, before the hold stops looking.
CONFIRM_AGAIN: tuple[timedelta, ...] = (timedelta(seconds=30), timedelta(seconds=120))

#: A hold asked to end (cancel-intent) while members are not back in service keeps putting
#: them back this long; then it ends ``Abandoned``, naming them (a Warning Event, an alert).
ABANDON_AFTER = timedelta(minutes=15)

#: ``reasons`` keeps the first ``REASONS_HEAD`` and the latest, ``REASONS_CAP`` in all (a
#: long hold notes a reason per change, carried across continue-as-new).
REASONS_CAP = 200
REASONS_HEAD = 20


#: How each phase's activity is named in reasons a person reads.
WHAT: dict[Phase, str] = {
    Phase.DISQUALIFIED: "disqualify",
    Phase.WITHDRAWING: "withdrawal",
    Phase.DRAINING: "drain",
    Phase.SETTLING: "settle",
}


class Progress(BaseModel):
    """What the protocol knows of the current attempt; ``decide`` reads and returns it.

    Its last fields (``REPORTED``) are the record of what the attempt's activities
    reported, carried in by the events and kept by ``decide`` whatever it makes of them.
    ``RetirementState`` (the query's answer) extends it, so the workflow keeps one state
    object and the protocol's fields are the state's fields.
    """

    model_config = ConfigDict(extra="forbid")

    attempt: int = 1
    phase: Phase = Phase.ADMITTED
    outcome: Outcome = Outcome.RUNNING
    admitted: bool = False  # admission bound a target in this attempt
    restoring: bool = False  # the abort's restore is running
    started_at: datetime | None = None
    deadline: datetime | None = None  # the overall deadline, frozen at admission
    phase_started_at: datetime | None = None
    phase_deadline: datetime | None = None
    #: Evidence of this attempt: when withdrawal and then the drain were VERIFIED, and when
    #: the drain's last idle read was taken (the activity's clock): the delete acts on it
    #: only while it is fresh (``freshness_bound``).
    withdrawn_at: datetime | None = None
    drained_at: datetime | None = None
    idle_read_at: datetime | None = None
    abort_requested: str | None = None
    cancel_intent: str | None = None
    cancelled: bool = False  # the workflow was cancelled (the UI): it aborts and holds
    #: When the hold was asked to end (cancel-intent): members not back by
    #: ``ABANDON_AFTER`` later are abandoned, by name.
    end_asked_at: datetime | None = None
    last_consumed_retry_token: str | None = None
    retry_token: str | None = None  # accepted while held: the next attempt's token
    furthest_phase: Phase = Phase.ADMITTED
    #: Members the restore has not yet put back in service, with why (re-evaluated while
    #: held, at ``recheck_at``), and how many restore rounds ran in this hold.
    unrestored: dict[str, str] = Field(default_factory=dict)
    recheck_at: datetime | None = None
    restore_rounds: int = 0
    #: The members an abort must put back (bound at admission): a restore that did not
    #: confirm one of them back leaves it unrestored, whatever the activity reported.
    restorable: list[str] = Field(default_factory=list)
    #: When the routers are read again after a restore confirmed by time (``CONFIRM_AGAIN``).
    confirm_at: list[datetime] = Field(default_factory=list)
    reasons: list[str] = Field(default_factory=list)
    phase_timeline: list[tuple[Phase, datetime]] = Field(default_factory=list)
    # What the activities reported (``REPORTED``):
    #: What admission bound (``Admitted``).
    target: Target | None = None
    #: The last readings per member of a phase activity (``Answered``).
    last_readings: dict[str, str] = Field(default_factory=dict)
    #: Every router removal withdrawal asked for in this attempt (``<router Pod UID>|<worker
    #: URL>``; ``Answered``): the restore adds these very URLs back.
    router_removals: list[str] = Field(default_factory=list)
    deleted: DeleteResult | None = None  # what the delete did (``Deleted``)
    restored: RestoreResult | None = None  # what the last restore did (``Restored``)

    @property
    def reason(self) -> str:
        """The latest reason (what a person reads first)."""
        return self.reasons[-1] if self.reasons else ""


P = TypeVar("P", bound=Progress)

#: The fields of ``Progress`` that record what the activities reported (declared last).
REPORTED = ("target", "last_readings", "router_removals", "deleted", "restored")


# ----------------------------------------------------------------------------- predicates


def interrupted(p: Progress) -> bool:
    """Whether the running phase must stop now: an abort, a cancellation or a cancel-intent
    arrived while the phase may still be stopped."""
    return (
        p.outcome is Outcome.RUNNING
        and not p.restoring
        and abortable(p.phase)
        and (p.abort_requested is not None or p.cancel_intent is not None or p.cancelled)
    )


def settled(p: Progress) -> bool:
    """Every member the restore must put back is confirmed back, and no confirmation by
    time awaits its re-reads."""
    return not p.unrestored and not p.confirm_at


def hold_ends(p: Progress) -> bool:
    """Whether a held retirement has something to act on at once: a retry token, or a
    cancel-intent once every member is back (until then the hold goes on putting them
    back, bounded by ``ABANDON_AFTER``)."""
    if p.cancel_intent is not None:
        return settled(p)
    return p.retry_token is not None


def held(p: Progress) -> bool:
    """Aborted and holding: the replica is kept, waiting for a retry."""
    return p.outcome is Outcome.ABORTED


def abort_refusal(p: Progress) -> str:
    """Why an abort request is refused now ("" when it is accepted).  The Update's
    validator uses it, so a refused abort leaves no trace in history."""
    if p.outcome is not Outcome.RUNNING:
        return f"nothing to abort: the retirement is {p.outcome}"
    if p.restoring:
        return "abort refused: the retirement is already aborting"
    if not abortable(p.phase):
        return f"abort refused: {p.phase} has begun, the remaining deletes finish"
    if p.abort_requested is not None:
        return "abort already requested"
    return ""


# ----------------------------------------------------------------------------- state helpers


def capped(reasons: list[str]) -> list[str]:
    """``reasons`` within ``REASONS_CAP``: the first ``REASONS_HEAD`` (how it began), a
    marker of how many were left out, and the latest."""
    if len(reasons) <= REASONS_CAP:
        return reasons
    head = reasons[:REASONS_HEAD]
    rest = reasons[REASONS_HEAD:]
    omitted = 0
    if rest and rest[0].startswith(_OMITTED):
        omitted = int(rest[0][len(_OMITTED) :].split(" ", 1)[0])
        rest = rest[1:]
    keep = REASONS_CAP - REASONS_HEAD - 1
    omitted += len(rest) - keep
    return [*head, f"{_OMITTED}{omitted} reasons omitted", *rest[-keep:]]


_OMITTED = "... "


def _note(p: P, *reasons: str, **update: object) -> P:
    return p.model_copy(update={**update, "reasons": capped([*p.reasons, *reasons])})


def _ended(p: Progress) -> bool:
    return p.outcome not in (Outcome.RUNNING, Outcome.ABORTED)


def _enter(p: P, phase: Phase, at: datetime, budgets: Budgets) -> P:
    """Enter ``phase`` at ``at``: its deadline is min(overall, start + its budget)."""
    deadline = p.phase_deadline
    if p.deadline is not None:
        deadline = phase_deadline(
            phase=phase, phase_started_at=at, overall=p.deadline, budgets=budgets
        )
    furthest = p.furthest_phase
    if phase in ORDER and ORDER.index(phase) > ORDER.index(furthest):
        furthest = phase
    return p.model_copy(
        update={
            "phase": phase,
            "phase_started_at": at,
            "phase_deadline": deadline,
            "furthest_phase": furthest,
            "phase_timeline": [*p.phase_timeline, (phase, at)],
        }
    )
