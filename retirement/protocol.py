"""The retirement protocol as one pure decision function (SPEC sections 4 and 7).

``decide(progress, event, budgets=...)`` takes what is known of one attempt and the next
thing that happened (an activity's answer, an abort, a cancel-intent, a workflow
cancellation, a wait that ended, a retry token) and returns the new progress and the one
thing to do next; what an activity reported comes inside its event, and ``decide``
records it.  ``RetirementWorkflow`` executes exactly that, holds no rule of its own and
never writes its state; every rule about phases, verdicts, deadlines and retries lives in
``decide``, where it is property-tested over arbitrary event sequences
(``tests/unit/test_protocol.py``).

This module holds ``decide`` and the phase flow (admission, the phase verdicts, the
delete, the wake-ups).  The rest of the protocol is in the modules it imports, each
importing only the ones before it: ``retirement.reports`` (what the activities report),
``retirement.progress`` (``Progress``, its constants, the predicates, the helpers every
handler shares), ``retirement.vocabulary`` (the events, the actions, ``Decision``) and
``retirement.holding`` (the abort side: restore results, the hold, abort, cancel-intent,
cancellation, retry).  Their public names are re-exported here, so ``from
retirement.protocol import X`` works as before.

No I/O, no clock: every event carries its own time, so the function is deterministic and
safe in the workflow sandbox.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from retirement.budgets import Budgets, overall_deadline
from retirement.holding import (
    MIN_WAIT,
    _abort_requested,
    _cancelled,
    _hold,
    _hold_ended,
    _intent_cancelled,
    _restored,
    _retry_offered,
)
from retirement.phases import ORDER, Outcome, Phase, Verdict
from retirement.progress import (
    ABANDON_AFTER,
    CONFIRM_AGAIN,
    FRESH_SLACK,
    REASONS_CAP,
    REASONS_HEAD,
    RECHECK_FIRST,
    RECHECK_MAX,
    WHAT,
    P,
    Progress,
    _ended,
    _enter,
    _note,
    abort_refusal,
    capped,
    freshness_bound,
    held,
    hold_ends,
    interrupted,
    recheck_delay,
    settled,
)
from retirement.vocabulary import (
    AbortRequested,
    Action,
    Admit,
    Admitted,
    Answered,
    Cancelled,
    CarryOn,
    Decision,
    Delete,
    Deleted,
    Event,
    Finish,
    Hold,
    IntentCancelled,
    NotDeleted,
    Refused,
    Restore,
    Restored,
    RetryOffered,
    RunPhase,
    StartAttempt,
    Started,
    WaitUntil,
    Woke,
)

__all__ = [
    "ABANDON_AFTER",
    "CONFIRM_AGAIN",
    "FRESH_SLACK",
    "MIN_WAIT",
    "REASONS_CAP",
    "REASONS_HEAD",
    "RECHECK_FIRST",
    "RECHECK_MAX",
    "RERUN_DELAY",
    "WHAT",
    "AbortRequested",
    "Action",
    "Admit",
    "Admitted",
    "Answered",
    "Cancelled",
    "CarryOn",
    "Decision",
    "Delete",
    "Deleted",
    "Event",
    "Finish",
    "Hold",
    "IntentCancelled",
    "NotDeleted",
    "P",
    "Progress",
    "Refused",
    "Restore",
    "Restored",
    "RetryOffered",
    "RunPhase",
    "StartAttempt",
    "Started",
    "WaitUntil",
    "Woke",
    "abort_refusal",
    "capped",
    "decide",
    "freshness_bound",
    "held",
    "hold_ends",
    "interrupted",
    "recheck_delay",
    "settled",
]

#: How long to wait before running a phase activity again after an early UNKNOWN (its
#: clock differs from the workflow's, or its worker restarted).
RERUN_DELAY = timedelta(seconds=5)


# ----------------------------------------------------------------------------- decide


def decide(p: P, event: Event, *, budgets: Budgets, guard_refreshes: bool = False) -> Decision[P]:
    """The one decision function: ``p`` and ``event`` in, new progress and action out.

    ``guard_refreshes``: the delete's guard of this run takes the drain's proof again when
    the evidence it is handed is older than the freshness bound (``activities.refresh``),
    so a drain VERIFIED on evidence that is stale by the time it is decided on moves on to
    the delete instead of draining again (a workflow patch: runs recorded before it, and
    runs of code without it, drain again)."""
    p = _recorded(p, event)
    if isinstance(event, Started):
        return _started(p, event)
    if isinstance(event, Admitted | Refused):
        return _admission(p, event, budgets)
    if isinstance(event, Answered):
        return _answered(p, event, budgets, guard_refreshes=guard_refreshes)
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


def _recorded(p: P, e: Event) -> P:
    """``p`` with what the activity behind ``e`` reported: the target admission bound, a
    phase's last readings and router removals (each removal once), what the delete or the
    restore did.  Recorded whatever is decided on the event: it happened."""
    update: dict[str, object] = {}
    if isinstance(e, Admitted) and e.target is not None:
        update["target"] = e.target
    elif isinstance(e, Answered):
        if e.readings:
            update["last_readings"] = dict(e.readings)
        removals = list(dict.fromkeys([*p.router_removals, *e.router_removals]))
        if removals != p.router_removals:
            update["router_removals"] = removals
    elif isinstance(e, Deleted) and e.result is not None:
        update["deleted"] = e.result
    elif isinstance(e, Restored) and e.result is not None:
        update["restored"] = e.result
    return p.model_copy(update=update) if update else p


def _started(p: P, e: Started) -> Decision[P]:
    if p.started_at is not None:
        return Decision(progress=p, accepted=False, reply="already started")
    return Decision(progress=p.model_copy(update={"started_at": e.at}), action=Admit())


def _admission(p: P, e: Admitted | Refused, budgets: Budgets) -> Decision[P]:
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


def _next(
    p: P, done: Phase, at: datetime, budgets: Budgets, *, guard_refreshes: bool = False
) -> Decision[P]:
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
        if stale and not guard_refreshes:
            return _drain_again(p, stale, at, budgets)
        if stale:
            # The delete's guard takes the drain's proof again before any delete (and
            # refuses, UNKNOWN: drain again, when it cannot): a workflow task that ran late
            # costs one fresh read there, not a whole drain activity and two more tasks.
            p = _note(p, f"{stale}: the delete's guard reads the engines again first")
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


def _drain_again(p: P, why: str, at: datetime, budgets: Budgets) -> Decision[P]:
    """Not deleting on this evidence: read the engines again (Draining stays abortable)."""
    if p.deadline is not None and at >= p.deadline:
        return _restore(p, f"{why}; overall budget exhausted", at, budgets)
    q = _note(p, f"not deleting: {why}: draining again", drained_at=None, idle_read_at=None)
    return Decision(
        progress=_enter(q, Phase.DRAINING, at, budgets), action=RunPhase(Phase.DRAINING)
    )


def _restore(p: P, reason: str, at: datetime, budgets: Budgets) -> Decision[P]:
    q = _enter(p, Phase.ABORTED, at, budgets)
    q = _note(q, f"aborted in {p.phase}: {reason}", restoring=True)
    return Decision(progress=q, action=Restore(reason))


def _answered(p: P, e: Answered, budgets: Budgets, *, guard_refreshes: bool) -> Decision[P]:
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
    return _next(q, p.phase, e.at, budgets, guard_refreshes=guard_refreshes)


def _unknown(p: P, at: datetime, exhausted: str, budgets: Budgets) -> Decision[P]:
    """UNKNOWN holds: never a step forward.  Before the phase deadline the activity runs
    again after a short wait; at the deadline the attempt aborts."""
    why = _interruption(p)
    if why:
        return _restore(p, why, at, budgets)
    assert p.phase_deadline is not None
    if at >= p.phase_deadline:
        return _restore(p, exhausted, at, budgets)
    return Decision(progress=p, action=WaitUntil(min(p.phase_deadline, at + RERUN_DELAY)))


def _settled(p: P, e: Answered, budgets: Budgets) -> Decision[P]:
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


def _unsettled(p: P, at: datetime, reason: str, budgets: Budgets) -> Decision[P]:
    q = _enter(
        p.model_copy(update={"outcome": Outcome.COMPLETED_UNSETTLED}), Phase.COMPLETED, at, budgets
    )
    return Decision(progress=_note(q, reason), action=Finish(Outcome.COMPLETED_UNSETTLED))


def _deleted(p: P, e: Deleted, budgets: Budgets) -> Decision[P]:
    if p.phase is not Phase.DELETING or _ended(p):
        return Decision(progress=p, accepted=False, reply="no delete under way")
    if not e.ok:
        q = _note(p, f"delete failed: {e.reason}", outcome=Outcome.COMPLETED_UNSETTLED)
        return Decision(progress=q, action=Finish(Outcome.COMPLETED_UNSETTLED, clear=False))
    q = _note(p, e.reason) if e.reason else p
    return Decision(
        progress=_enter(q, Phase.SETTLING, e.at, budgets), action=RunPhase(Phase.SETTLING)
    )


def _not_deleted(p: P, e: NotDeleted, budgets: Budgets) -> Decision[P]:
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


def _woke(p: P, e: Woke, budgets: Budgets) -> Decision[P]:
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
