"""The retirement protocol as one pure decision function (SPEC sections 4 and 7).

``decide(progress, event, budgets=...)`` takes what is known of one attempt and the next
thing that happened (an activity's answer, an abort, a cancel-intent, a workflow
cancellation, a wait that ended, a retry token) and returns the new progress and the one
thing to do next.  ``RetirementWorkflow`` executes exactly that and holds no rule of its
own; every rule about phases, verdicts, deadlines and retries lives here, where it is
property-tested over arbitrary event sequences (``tests/unit/test_protocol.py``).

No I/O, no clock: every event carries its own time, so the function is deterministic and
safe in the workflow sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field

from retirement.budgets import Budgets, overall_deadline, phase_deadline
from retirement.phases import ORDER, Outcome, Phase, Verdict, abortable
from retirement.retry import RetryDecision, decide_retry

#: How long to wait before running a phase activity again after an early UNKNOWN (its
#: clock differs from the workflow's, or its worker restarted).
RERUN_DELAY = timedelta(seconds=5)

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

    @property
    def reason(self) -> str:
        """The latest reason (what a person reads first)."""
        return self.reasons[-1] if self.reasons else ""


P = TypeVar("P", bound=Progress)


# ----------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Started:
    """The attempt begins (the workflow started, or continued as new)."""

    at: datetime


@dataclass(frozen=True)
class Admitted:
    """Admission bound the target; ``restorable``: the members an abort must put back."""

    at: datetime
    restorable: tuple[str, ...] = ()


@dataclass(frozen=True)
class Refused:
    """Admission refused (or could not decide); nothing was touched."""

    at: datetime
    reason: str


@dataclass(frozen=True)
class Answered:
    """A phase activity's verdict on ``phase``."""

    at: datetime
    phase: Phase
    verdict: Verdict
    reason: str = ""
    polls: int = 0
    #: When the reading the verdict rests on was taken (the drain: its last idle round).
    evidence_at: datetime | None = None


@dataclass(frozen=True)
class Deleted:
    """The delete activity ended: ``ok`` unless it could not go on (bad input)."""

    at: datetime
    ok: bool = True
    reason: str = ""


@dataclass(frozen=True)
class NotDeleted:
    """The delete's last guard refused before any delete (SPEC section 4): the label is
    back, a Service or router selects a target, the spec declares the ordinal again, or
    the evidence is stale.  FAILED aborts; UNKNOWN drains again."""

    at: datetime
    verdict: Verdict
    reason: str


@dataclass(frozen=True)
class Restored:
    """The abort's restore ended: ``restored`` the members confirmed back in service,
    ``gone`` those that are not the admitted Pod any more (nothing to put back), ``held``
    those it could not yet put back and why.  A restorable member in none of them was not
    confirmed back.  ``timed``: a router's selection counted only after lasting a while."""

    at: datetime
    reason: str = ""
    held: tuple[tuple[str, str], ...] = ()
    restored: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    timed: bool = False


@dataclass(frozen=True)
class Woke:
    """A wait ended: its timer fired, or the state changed (an abort, a cancel-intent, a
    retry token), or the running activity was cancelled because of such a change.
    ``history_long``: Temporal suggests continuing as new (a long hold)."""

    at: datetime
    history_long: bool = False


@dataclass(frozen=True)
class AbortRequested:
    """Update or signal ``abort``."""

    at: datetime
    reason: str


@dataclass(frozen=True)
class IntentCancelled:
    """Signal ``cancel_intent``: the intent went away."""

    at: datetime
    reason: str


@dataclass(frozen=True)
class Cancelled:
    """The workflow was cancelled (the UI): it aborts the same way and holds."""

    at: datetime


@dataclass(frozen=True)
class RetryOffered:
    """Update or signal ``retry`` with a token."""

    at: datetime
    token: str


Event = (
    Started
    | Admitted
    | Refused
    | Answered
    | Deleted
    | NotDeleted
    | Restored
    | Woke
    | AbortRequested
    | IntentCancelled
    | Cancelled
    | RetryOffered
)


# ----------------------------------------------------------------------------- actions


@dataclass(frozen=True)
class Admit:
    """Run admission."""


@dataclass(frozen=True)
class RunPhase:
    """Run ``phase``'s activity until its verdict, ``progress.phase_deadline``, or an
    interruption (``interrupted(progress)``) when the phase is abortable."""

    phase: Phase


@dataclass(frozen=True)
class WaitUntil:
    """Wait on a durable timer until ``until`` or an interruption, then report ``Woke``."""

    until: datetime


@dataclass(frozen=True)
class Delete:
    """The point of no return: delete the admitted Pods (UID preconditions)."""


@dataclass(frozen=True)
class Restore:
    """Abort: put the replica back in service (SPEC section 6), delete nothing."""

    reason: str


@dataclass(frozen=True)
class Hold:
    """Held after an abort: wait until ``hold_ends(progress)``, or until ``recheck_at``
    when members are still to be put back (then report ``Woke``); no timer otherwise."""

    recheck_at: datetime | None = None


@dataclass(frozen=True)
class CarryOn:
    """Continue as new with the held state as it is (same attempt, no new admission), so
    a long hold's history stays bounded."""


@dataclass(frozen=True)
class Finish:
    """The retirement ends with ``outcome``; ``clear`` removes ``status.retirement``."""

    outcome: Outcome
    clear: bool = True


@dataclass(frozen=True)
class StartAttempt:
    """A fresh attempt (fresh budgets, fresh admission) consuming ``token``."""

    token: str


Action = Admit | RunPhase | WaitUntil | Delete | Restore | Hold | CarryOn | Finish | StartAttempt


@dataclass(frozen=True)
class Decision:
    """What ``decide`` returns: the new progress, what to do next, and a reply for the
    handler that delivered the event.

    ``action`` is None for the events handlers deliver (an abort, a cancel-intent, a
    cancellation, a retry token): they only change the progress, and the running step
    notices through ``interrupted`` or ``hold_ends`` and reports ``Woke``."""

    progress: Progress
    action: Action | None = None
    reply: str = ""
    accepted: bool = True
    retry: RetryDecision | None = None  # what a retry token did


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


# ----------------------------------------------------------------------------- decide


def decide(p: P, event: Event, *, budgets: Budgets) -> Decision:
    """The one decision function: ``p`` and ``event`` in, new progress and action out."""
    if isinstance(event, Started):
        return _started(p, event)
    if isinstance(event, Admitted | Refused):
        return _admission(p, event, budgets)
    if isinstance(event, Answered):
        return _answered(p, event, budgets)
    if isinstance(event, Deleted):
        return _deleted(p, event, budgets)
    if isinstance(event, NotDeleted):
        return _not_deleted(p, event, budgets)
    if isinstance(event, Restored):
        return _restored(p, event)
    if isinstance(event, Woke):
        return _woke(p, event, budgets)
    if isinstance(event, AbortRequested):
        return _abort_requested(p, event)
    if isinstance(event, IntentCancelled):
        return _intent_cancelled(p, event)
    if isinstance(event, Cancelled):
        return _cancelled(p, event)
    return _retry_offered(p, event)


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


def _started(p: P, e: Started) -> Decision:
    if p.started_at is not None:
        return Decision(progress=p, accepted=False, reply="already started")
    return Decision(progress=p.model_copy(update={"started_at": e.at}), action=Admit())


def _admission(p: P, e: Admitted | Refused, budgets: Budgets) -> Decision:
    if p.admitted or p.deadline is not None or _ended(p) or p.restoring or held(p):
        return Decision(progress=p, accepted=False, reply="admission already decided")
    q = p.model_copy(update={"deadline": overall_deadline(admitted_at=e.at, budgets=budgets)})
    if isinstance(e, Refused):
        q = _enter(q, Phase.ADMITTED, e.at, budgets)
        q = _note(q, f"admission refused: {e.reason}", outcome=Outcome.REFUSED)
        return Decision(progress=q, action=Finish(Outcome.REFUSED))
    q = q.model_copy(update={"admitted": True, "restorable": list(e.restorable)})
    q = _enter(q, Phase.ADMITTED, e.at, budgets)
    return _next(q, Phase.ADMITTED, e.at, budgets)


def _interruption(p: Progress) -> str:
    if p.cancelled and p.abort_requested in (None, "workflow cancelled"):
        return "workflow cancelled"
    if p.abort_requested is not None:
        return f"abort requested: {p.abort_requested}"
    if p.cancel_intent is not None:
        return f"intent cancelled: {p.cancel_intent}"
    return ""


def _next(p: P, done: Phase, at: datetime, budgets: Budgets) -> Decision:
    """``done`` was VERIFIED (or admission bound the target): move on, unless an abort, a
    cancel-intent or the overall deadline says otherwise."""
    why = _interruption(p)
    if why:
        return _restore(p, why, at, budgets)
    if p.deadline is not None and at >= p.deadline:
        return _restore(p, "overall budget exhausted", at, budgets)
    following = ORDER[ORDER.index(done) + 1]
    if following is Phase.DELETING:
        if not _evidence_holds(p):
            return _restore(p, "no verified withdrawal and drain in this attempt", at, budgets)
        stale = _stale(p, at, budgets)
        if stale:
            return _drain_again(p, stale, at, budgets)
        return Decision(progress=_enter(p, Phase.DELETING, at, budgets), action=Delete())
    return Decision(progress=_enter(p, following, at, budgets), action=RunPhase(following))


def _evidence_holds(p: Progress) -> bool:
    """Deleting needs withdrawal VERIFIED, then the drain VERIFIED after it, this attempt,
    with the time of the drain's last idle read."""
    return (
        p.withdrawn_at is not None
        and p.drained_at is not None
        and p.drained_at >= p.withdrawn_at
        and p.idle_read_at is not None
    )


def _stale(p: Progress, at: datetime, budgets: Budgets) -> str:
    """Why the drain's evidence is too old to delete on at ``at`` ("" while fresh)."""
    assert p.idle_read_at is not None
    age = at - p.idle_read_at
    bound = freshness_bound(budgets)
    if age <= bound:
        return ""
    return (
        f"the drain's last idle read is {age.total_seconds():.0f} s old "
        f"(bound {bound.total_seconds():.0f} s)"
    )


def _drain_again(p: P, why: str, at: datetime, budgets: Budgets) -> Decision:
    """Not deleting on this evidence: read the engines again (Draining stays abortable)."""
    if p.deadline is not None and at >= p.deadline:
        return _restore(p, f"{why}; overall budget exhausted", at, budgets)
    q = _note(p, f"not deleting: {why}: draining again", drained_at=None, idle_read_at=None)
    return Decision(
        progress=_enter(q, Phase.DRAINING, at, budgets), action=RunPhase(Phase.DRAINING)
    )


def _restore(p: P, reason: str, at: datetime, budgets: Budgets) -> Decision:
    q = _enter(p, Phase.ABORTED, at, budgets)
    q = _note(q, f"aborted in {p.phase}: {reason}", restoring=True)
    return Decision(progress=q, action=Restore(reason))


def _answered(p: P, e: Answered, budgets: Budgets) -> Decision:
    if e.phase is not p.phase or _ended(p) or p.restoring or p.outcome is Outcome.ABORTED:
        return Decision(progress=p, accepted=False, reply=f"stale answer for {e.phase}")
    if p.phase not in WHAT:
        return Decision(progress=p, accepted=False, reply=f"{p.phase} has no verdicts")
    what = WHAT[p.phase]
    q = _note(p, f"{what}: {e.verdict} after {e.polls} poll(s): {e.reason}")
    if p.phase is Phase.SETTLING:
        return _settled(q, e, budgets)
    if e.verdict is Verdict.FAILED:
        return _restore(q, f"{what} failed: {e.reason}", e.at, budgets)
    if e.verdict is Verdict.UNKNOWN:
        return _unknown(q, e.at, f"{what} budget exhausted: {e.reason}", budgets)
    if p.phase is Phase.WITHDRAWING:
        q = q.model_copy(update={"withdrawn_at": e.at})
    elif p.phase is Phase.DRAINING:
        if q.withdrawn_at is None:
            return _restore(q, "drain verified before any verified withdrawal", e.at, budgets)
        if e.evidence_at is None:
            return _restore(q, "the drain did not say when its last idle read was", e.at, budgets)
        q = q.model_copy(update={"drained_at": e.at, "idle_read_at": e.evidence_at})
    return _next(q, p.phase, e.at, budgets)


def _unknown(p: P, at: datetime, exhausted: str, budgets: Budgets) -> Decision:
    """UNKNOWN holds: never a step forward.  Before the phase deadline the activity runs
    again after a short wait; at the deadline the attempt aborts."""
    why = _interruption(p)
    if why:
        return _restore(p, why, at, budgets)
    assert p.phase_deadline is not None
    if at >= p.phase_deadline:
        return _restore(p, exhausted, at, budgets)
    return Decision(progress=p, action=WaitUntil(min(p.phase_deadline, at + RERUN_DELAY)))


def _settled(p: P, e: Answered, budgets: Budgets) -> Decision:
    """Settling is after the point of no return: a verdict only says how it ended."""
    if e.verdict is Verdict.VERIFIED:
        q = _enter(
            p.model_copy(update={"outcome": Outcome.COMPLETED}), Phase.COMPLETED, e.at, budgets
        )
        return Decision(progress=_note(q, e.reason), action=Finish(Outcome.COMPLETED))
    assert p.phase_deadline is not None
    if e.verdict is Verdict.UNKNOWN and e.at < p.phase_deadline:
        return Decision(progress=p, action=WaitUntil(min(p.phase_deadline, e.at + RERUN_DELAY)))
    return _unsettled(p, e.at, f"settle unconfirmed: {e.reason}", budgets)


def _unsettled(p: P, at: datetime, reason: str, budgets: Budgets) -> Decision:
    q = _enter(
        p.model_copy(update={"outcome": Outcome.COMPLETED_UNSETTLED}), Phase.COMPLETED, at, budgets
    )
    return Decision(progress=_note(q, reason), action=Finish(Outcome.COMPLETED_UNSETTLED))


def _deleted(p: P, e: Deleted, budgets: Budgets) -> Decision:
    if p.phase is not Phase.DELETING or _ended(p):
        return Decision(progress=p, accepted=False, reply="no delete under way")
    if not e.ok:
        q = _note(p, f"delete failed: {e.reason}", outcome=Outcome.COMPLETED_UNSETTLED)
        return Decision(progress=q, action=Finish(Outcome.COMPLETED_UNSETTLED, clear=False))
    q = _note(p, e.reason) if e.reason else p
    return Decision(
        progress=_enter(q, Phase.SETTLING, e.at, budgets), action=RunPhase(Phase.SETTLING)
    )


def _not_deleted(p: P, e: NotDeleted, budgets: Budgets) -> Decision:
    """The delete's guard refused before any delete: a definite fault aborts (nothing was
    deleted, so the abort is still possible); anything else drains again, and an abort,
    a cancellation or a cancel-intent kept while Deleting now takes effect."""
    if p.phase is not Phase.DELETING or _ended(p) or p.restoring:
        return Decision(progress=p, accepted=False, reply="no delete under way")
    if e.verdict is Verdict.VERIFIED:
        return Decision(progress=p, accepted=False, reply="a refusal is never VERIFIED")
    if e.verdict is Verdict.FAILED:
        return _restore(p, f"delete refused: {e.reason}", e.at, budgets)
    why = _interruption(p)
    if why:
        return _restore(_note(p, f"delete refused: {e.reason}"), why, e.at, budgets)
    return _drain_again(p, f"delete refused: {e.reason}", e.at, budgets)


def _restored(p: P, e: Restored) -> Decision:
    """Level-based: a member the restore must put back counts as back only when this
    round confirmed it (``restored``) or found it gone; anything else is unrestored,
    including a member the round never reached ("nothing was done" is never success)."""
    if not p.restoring:
        return Decision(progress=p, accepted=False, reply="no restore under way")
    unrestored = dict(e.held)
    for name in p.restorable:
        if name not in e.restored and name not in e.gone and name not in unrestored:
            unrestored[name] = "not confirmed back in service: the restore did not reach it"
    for name in e.restored:
        unrestored.pop(name, None)
    was_back = not p.unrestored and p.restore_rounds > 0
    confirm_at = list(p.confirm_at)
    if unrestored:
        confirm_at = []  # planned again once they are back
    elif was_back:
        confirm_at = [t for t in confirm_at if t > e.at]  # a due re-read just confirmed it
    elif e.timed:
        confirm_at = [e.at + d for d in CONFIRM_AGAIN]
    q = p.model_copy(
        update={
            "restoring": False,
            "unrestored": unrestored,
            "restore_rounds": p.restore_rounds + 1,
            "confirm_at": confirm_at,
            "outcome": Outcome.ABORTED,
        }
    )
    if e.reason:
        q = _note(q, e.reason)
    if unrestored and unrestored != p.unrestored:  # noted once per change, not per round
        q = _note(
            q,
            "not yet back in service: "
            + "; ".join(f"{k}: {v}" for k, v in sorted(unrestored.items())),
        )
    elif p.unrestored and not unrestored:
        q = _note(q, "every member that qualifies is back in service")
    if confirm_at and not p.confirm_at:
        q = _note(q, "a router's selection was confirmed by time: the routers are read again")
    if q.cancel_intent is not None and not settled(q) and _abandon_due(q, e.at):
        return _abandon(q)
    if hold_ends(q):  # a cancel-intent with every member back, or a retry token
        return _hold_ended(q)
    return _hold(q, e.at)


def _abandon_due(p: Progress, at: datetime) -> bool:
    return p.end_asked_at is not None and at >= p.end_asked_at + ABANDON_AFTER


def _abandon(p: P) -> Decision:
    """The hold was asked to end and members are still not back after ``ABANDON_AFTER``:
    end, naming them (status.retirement stays, with a Warning Event and an alert)."""
    names = ", ".join(sorted(p.unrestored)) or "(routers' re-reads not done)"
    q = _note(
        p,
        f"abandoned: not back in service {ABANDON_AFTER.total_seconds() / 60:.0f} min after "
        f"the hold was asked to end: {names}",
        outcome=Outcome.ABANDONED,
        recheck_at=None,
    )
    return Decision(progress=q, action=Finish(Outcome.ABANDONED, clear=False))


def _hold(p: P, at: datetime) -> Decision:
    """Hold; wake up for what is due: members still to put back (after a backoff), a
    router re-read after a confirmation by time, the abandon bound of an ended hold."""
    due: list[datetime] = []
    if p.unrestored:
        when = p.recheck_at
        if when is None or when <= at:
            when = at + recheck_delay(p.restore_rounds - 1)
        due.append(when)
    due += p.confirm_at
    if p.cancel_intent is not None and p.end_asked_at is not None and not settled(p):
        due.append(p.end_asked_at + ABANDON_AFTER)
    if not due:
        return Decision(progress=p.model_copy(update={"recheck_at": None}), action=Hold())
    when = max(min(due), at + MIN_WAIT)
    return Decision(
        progress=p.model_copy(update={"recheck_at": when}), action=Hold(recheck_at=when)
    )


#: The shortest timer a hold sets (a due time already past is acted on this soon).
MIN_WAIT = timedelta(seconds=1)


def _woke(p: P, e: Woke, budgets: Budgets) -> Decision:
    if (
        not p.admitted
        and p.deadline is None
        and not p.restoring
        and not held(p)
        and _interruption(p)
    ):
        return _restore(p, _interruption(p), e.at, budgets)  # admission was interrupted
    if held(p) and not p.restoring:
        if hold_ends(p):
            return _hold_ended(p)
        if e.history_long:
            return Decision(progress=p, action=CarryOn())
        if not settled(p) and p.recheck_at is not None and e.at >= p.recheck_at:
            q = p.model_copy(update={"restoring": True, "recheck_at": None})
            why = "confirm the routers' selection again" if not p.unrestored else ""
            return Decision(progress=q, action=Restore(why or "evaluate held members again"))
        return _hold(p, e.at)
    if _ended(p) or p.restoring or p.phase not in WHAT:
        return Decision(progress=p, accepted=False, reply="nothing is waiting")
    if p.phase is Phase.SETTLING:
        assert p.phase_deadline is not None
        if e.at >= p.phase_deadline:
            return _unsettled(p, e.at, "settle unconfirmed: settle budget exhausted", budgets)
        return Decision(progress=p, action=RunPhase(p.phase))
    why = _interruption(p)
    if why:
        return _restore(p, why, e.at, budgets)
    assert p.phase_deadline is not None
    if e.at >= p.phase_deadline:
        what = WHAT[p.phase]
        return _restore(p, f"{what} budget exhausted: no verdict by the deadline", e.at, budgets)
    return Decision(progress=p, action=RunPhase(p.phase))


def _hold_ended(p: P) -> Decision:
    """A cancel-intent with every member back ends the retirement (capacity retained); a
    retry token starts a fresh attempt (its own admission and restore take over)."""
    if p.cancel_intent is not None:
        q = p.model_copy(update={"outcome": Outcome.CAPACITY_RETAINED})
        return Decision(progress=q, action=Finish(Outcome.CAPACITY_RETAINED))
    assert p.retry_token is not None
    q = _note(p, f"retry token {p.retry_token!r} accepted: a fresh attempt starts")
    return Decision(progress=q, action=StartAttempt(p.retry_token))


def _abort_requested(p: P, e: AbortRequested) -> Decision:
    refusal = abort_refusal(p)
    if refusal:
        return Decision(
            progress=_note(p, f"abort signal ignored: {refusal}"), accepted=False, reply=refusal
        )
    q = _note(p, f"abort requested: {e.reason}", abort_requested=e.reason)
    return Decision(progress=q, reply=f"aborting in phase {p.phase}")


def _intent_cancelled(p: P, e: IntentCancelled) -> Decision:
    if p.cancel_intent is not None or _ended(p):
        return Decision(progress=p, accepted=False, reply="ignored")
    q = _note(p, f"intent cancelled: {e.reason}", cancel_intent=e.reason, end_asked_at=e.at)
    if not abortable(p.phase) and not held(p) and not p.restoring:
        q = _note(q, "intent cancelled after the point of no return: the deletes finish")
    return Decision(progress=q, reply="intent cancelled")


def _cancelled(p: P, e: Cancelled) -> Decision:
    """A cancellation (the UI's "Request Cancellation") is an abort that keeps the
    replica: the retirement aborts, restores and holds until a person retries, the intent
    goes away, or the spec declares the replica again (SPEC section 7); it never ends the
    workflow, so the watcher never starts the same intent again behind the person's back.
    While held it also drops a retry not yet started."""
    if p.cancelled or _ended(p):
        return Decision(progress=p, accepted=False, reply="ignored")
    if held(p) or p.restoring:
        dropped = f" (retry token {p.retry_token!r} dropped)" if p.retry_token else ""
        q = _note(
            p,
            f"cancelled while {'held' if held(p) else 'aborting'}{dropped}: the retirement "
            "holds with the replica kept; retry, cancel the intent or scale up to end it",
            cancelled=True,
            retry_token=None,
        )
        return Decision(progress=q)
    if not abortable(p.phase):
        # The remaining deletes finish (a refused delete aborts then: ``_not_deleted``).
        return Decision(
            progress=_note(p, f"cancelled in {p.phase}: finishing it first", cancelled=True)
        )
    q = _note(
        p,
        f"cancelled in {p.phase}: aborting; the retirement then holds with the replica kept",
        cancelled=True,
        abort_requested=p.abort_requested or "workflow cancelled",
    )
    return Decision(progress=q)


def _retry_offered(p: P, e: RetryOffered) -> Decision:
    decision = decide_retry(
        token=e.token,
        last_consumed=p.last_consumed_retry_token,
        aborted=(held(p) or p.restoring) and p.retry_token is None,
    )
    if decision is RetryDecision.ACCEPT:
        q = p.model_copy(update={"retry_token": e.token})
        return Decision(progress=q, reply="a fresh attempt starts", retry=decision)
    if decision is RetryDecision.REPLAY:
        return Decision(
            progress=_note(p, f"retry token {e.token!r} is a replay: ignored"),
            accepted=False,
            reply="replay: ignored",
            retry=decision,
        )
    return Decision(
        progress=_note(p, f"retry token {e.token!r} ignored: not aborted"),
        accepted=False,
        reply=f"not aborted (phase {p.phase}): ignored",
        retry=decision,
    )
