"""The abort side of the protocol: the restore's result, the hold, and what ends it.

The handlers ``retirement.protocol.decide`` gives these events to: a restore that ended
(``_restored``), the hold and its wake-ups (``_hold``, ``_abandon``, ``_hold_ended``), and
what handlers deliver at any time (an abort, a cancel-intent, a workflow cancellation, a
retry token; SPEC sections 6 and 7).  None of them needs the phase flow; ``_woke``, which
needs both, stays in ``retirement.protocol``.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from retirement.phases import Outcome, abortable
from retirement.progress import (
    ABANDON_AFTER,
    CONFIRM_AGAIN,
    P,
    Progress,
    _ended,
    _note,
    abort_refusal,
    held,
    hold_ends,
    recheck_delay,
    settled,
)
from retirement.retry import RetryDecision, decide_retry
from retirement.vocabulary import (
    AbortRequested,
    Cancelled,
    Decision,
    Finish,
    Hold,
    IntentCancelled,
    Restored,
    RetryOffered,
    StartAttempt,
)


def _restored(p: P, e: Restored) -> Decision[P]:
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


def _abandon(p: P) -> Decision[P]:
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


def _hold(p: P, at: datetime) -> Decision[P]:
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


def _hold_ended(p: P) -> Decision[P]:
    """A cancel-intent with every member back ends the retirement (capacity retained); a
    retry token starts a fresh attempt (its own admission and restore take over)."""
    if p.cancel_intent is not None:
        q = p.model_copy(update={"outcome": Outcome.CAPACITY_RETAINED})
        return Decision(progress=q, action=Finish(Outcome.CAPACITY_RETAINED))
    assert p.retry_token is not None
    q = _note(p, f"retry token {p.retry_token!r} accepted: a fresh attempt starts")
    return Decision(progress=q, action=StartAttempt(p.retry_token))


def _abort_requested(p: P, e: AbortRequested) -> Decision[P]:
    refusal = abort_refusal(p)
    if refusal:
        return Decision(
            progress=_note(p, f"abort signal ignored: {refusal}"), accepted=False, reply=refusal
        )
    q = _note(p, f"abort requested: {e.reason}", abort_requested=e.reason)
    return Decision(progress=q, reply=f"aborting in phase {p.phase}")


def _intent_cancelled(p: P, e: IntentCancelled) -> Decision[P]:
    if p.cancel_intent is not None or _ended(p):
        return Decision(progress=p, accepted=False, reply="ignored")
    q = _note(p, f"intent cancelled: {e.reason}", cancel_intent=e.reason, end_asked_at=e.at)
    if not abortable(p.phase) and not held(p) and not p.restoring:
        q = _note(q, "intent cancelled after the point of no return: the deletes finish")
    return Decision(progress=q, reply="intent cancelled")


def _cancelled(p: P, e: Cancelled) -> Decision[P]:
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


def _retry_offered(p: P, e: RetryOffered) -> Decision[P]:
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
