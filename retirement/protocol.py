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
    #: Evidence of this attempt: when withdrawal and then the drain were VERIFIED.
    withdrawn_at: datetime | None = None
    drained_at: datetime | None = None
    abort_requested: str | None = None
    cancel_intent: str | None = None
    cancelled: bool = False  # the workflow was cancelled (the UI)
    last_consumed_retry_token: str | None = None
    retry_token: str | None = None  # accepted while held: the next attempt's token
    furthest_phase: Phase = Phase.ADMITTED
    #: Members the restore has not yet put back in service, with why (re-evaluated while
    #: held, at ``recheck_at``), and how many restore rounds ran in this hold.
    unrestored: dict[str, str] = Field(default_factory=dict)
    recheck_at: datetime | None = None
    restore_rounds: int = 0
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
    """Admission bound the target."""

    at: datetime


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


@dataclass(frozen=True)
class Deleted:
    """The delete activity ended: ``ok`` unless it could not go on (bad input)."""

    at: datetime
    ok: bool = True
    reason: str = ""


@dataclass(frozen=True)
class Restored:
    """The abort's restore ended; ``held`` names the members it could not yet put back
    (not yet Ready, probe not answered, a router not selecting them yet) and why."""

    at: datetime
    reason: str = ""
    held: tuple[tuple[str, str], ...] = ()


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
    """The workflow was cancelled (the UI): it aborts the same way, then ends."""

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
    """Whether the running phase must stop now: an abort or a cancel-intent arrived while
    the phase may still be stopped."""
    return (
        p.outcome is Outcome.RUNNING
        and not p.restoring
        and abortable(p.phase)
        and (p.abort_requested is not None or p.cancel_intent is not None or p.cancelled)
    )


def hold_ends(p: Progress) -> bool:
    """Whether a held retirement has something to act on."""
    return p.retry_token is not None or p.cancel_intent is not None or p.cancelled


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


def _note(p: P, *reasons: str, **update: object) -> P:
    return p.model_copy(update={**update, "reasons": [*p.reasons, *reasons]})


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
    q = _enter(q.model_copy(update={"admitted": True}), Phase.ADMITTED, e.at, budgets)
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
        return Decision(progress=_enter(p, Phase.DELETING, at, budgets), action=Delete())
    return Decision(progress=_enter(p, following, at, budgets), action=RunPhase(following))


def _evidence_holds(p: Progress) -> bool:
    """Deleting needs withdrawal VERIFIED, then the drain VERIFIED after it, this attempt."""
    return (
        p.withdrawn_at is not None and p.drained_at is not None and p.drained_at >= p.withdrawn_at
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
        q = q.model_copy(update={"drained_at": e.at})
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


def _restored(p: P, e: Restored) -> Decision:
    if not p.restoring:
        return Decision(progress=p, accepted=False, reply="no restore under way")
    unrestored = dict(e.held)
    q = p.model_copy(
        update={
            "restoring": False,
            "unrestored": unrestored,
            "restore_rounds": p.restore_rounds + 1,
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
    if q.cancelled:
        return Decision(
            progress=q.model_copy(update={"outcome": Outcome.CANCELLED}),
            action=Finish(Outcome.CANCELLED),
        )
    if q.cancel_intent is not None:
        return Decision(
            progress=q.model_copy(update={"outcome": Outcome.CAPACITY_RETAINED}),
            action=Finish(Outcome.CAPACITY_RETAINED),
        )
    q = q.model_copy(update={"outcome": Outcome.ABORTED})
    if hold_ends(q):  # a retry token that arrived during the restore
        return _hold_ended(q)
    return _hold(q, e.at)


def _hold(p: P, at: datetime) -> Decision:
    """Hold; with members still to put back, evaluate them again after a backoff."""
    if not p.unrestored:
        return Decision(progress=p.model_copy(update={"recheck_at": None}), action=Hold())
    when = p.recheck_at
    if when is None or when <= at:
        when = at + recheck_delay(p.restore_rounds - 1)
    return Decision(
        progress=p.model_copy(update={"recheck_at": when}), action=Hold(recheck_at=when)
    )


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
        if p.unrestored and p.recheck_at is not None and e.at >= p.recheck_at:
            q = p.model_copy(update={"restoring": True, "recheck_at": None})
            return Decision(progress=q, action=Restore("evaluate held members again"))
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
    if p.cancelled:
        return Decision(
            progress=p.model_copy(update={"outcome": Outcome.CANCELLED}),
            action=Finish(Outcome.CANCELLED),
        )
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
    q = _note(p, f"intent cancelled: {e.reason}", cancel_intent=e.reason)
    if not abortable(p.phase) and not held(p) and not p.restoring:
        q = _note(q, "intent cancelled after the point of no return: the deletes finish")
    return Decision(progress=q, reply="intent cancelled")


def _cancelled(p: P, e: Cancelled) -> Decision:
    if p.cancelled or _ended(p):
        return Decision(progress=p, accepted=False, reply="ignored")
    if held(p):
        return Decision(progress=p.model_copy(update={"cancelled": True}))  # the hold ends
    if p.restoring or not abortable(p.phase):
        # The restore, or the remaining deletes, finish first; the cancellation is kept.
        return Decision(
            progress=_note(p, f"cancelled in {p.phase}: finishing it first", cancelled=True)
        )
    q = _note(
        p,
        f"cancelled in {p.phase}: aborting",
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
