"""What ``retirement.protocol.decide`` is told and what it answers.

The events (what happened: an activity's answer, an abort, a cancel-intent, a workflow
cancellation, a wait that ended, a retry token; each carries its own time, and an
activity's answer what the activity reported, for ``decide`` to record), the actions
(the one thing to do next), their unions ``Event`` and ``Action``, and ``Decision``,
which carries the new ``Progress`` and the action back.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Generic

from retirement.phases import Outcome, Phase, Verdict
from retirement.progress import P
from retirement.reports import DeleteResult, RestoreResult, Target
from retirement.retry import RetryDecision

# ----------------------------------------------------------------------------- events


@dataclass(frozen=True)
class Started:
    """The attempt begins (the workflow started, or continued as new)."""

    at: datetime


@dataclass(frozen=True)
class Admitted:
    """Admission bound ``target`` (recorded as ``Progress.target``); ``restorable``: the
    members an abort must put back."""

    at: datetime
    restorable: tuple[str, ...] = ()
    target: Target | None = None


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
    #: The activity's last readings per member (none: the earlier ones stay), recorded as
    #: ``Progress.last_readings``.
    readings: tuple[tuple[str, str], ...] = ()
    #: The router removals withdrawal asked for, added to ``Progress.router_removals``.
    router_removals: tuple[str, ...] = ()


@dataclass(frozen=True)
class Deleted:
    """The delete activity ended: ``ok`` unless it could not go on (bad input); ``result``
    what it did (recorded as ``Progress.deleted``)."""

    at: datetime
    ok: bool = True
    reason: str = ""
    result: DeleteResult | None = None


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
    confirmed back.  ``timed``: a router's selection counted only after lasting a while.
    ``result``: what the restore reported (recorded as ``Progress.restored``)."""

    at: datetime
    reason: str = ""
    held: tuple[tuple[str, str], ...] = ()
    restored: tuple[str, ...] = ()
    gone: tuple[str, ...] = ()
    timed: bool = False
    result: RestoreResult | None = None


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
class Decision(Generic[P]):
    """What ``decide`` returns: the new progress, what to do next, and a reply for the
    handler that delivered the event.

    ``action`` is None for the events handlers deliver (an abort, a cancel-intent, a
    cancellation, a retry token): they only change the progress, and the running step
    notices through ``interrupted`` or ``hold_ends`` and reports ``Woke``."""

    progress: P
    action: Action | None = None
    reply: str = ""
    accepted: bool = True
    retry: RetryDecision | None = None  # what a retry token did
