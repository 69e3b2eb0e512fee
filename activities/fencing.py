"""Fencing of every change an activity makes to the world to the attempt that owns it
(SPEC section 7): an attempt that may have lost its claim makes no further change.

Temporal times an attempt out when no heartbeat reaches the server within its heartbeat
timeout, and when it outlives its start-to-close or schedule-to-close timeout; it then
retries it, or the workflow moves on (the restore).  Nothing stops the attempt's thread:
the SDK only learns of it on a later heartbeat's answer, and a thread that spent 40 s in
API calls without heartbeating finds out after its next change, too late.  Waiting for the
cancellation (``WAIT_CANCELLATION_COMPLETED``) covers the attempt the server tracks, not an
orphan.

So each attempt keeps a local claim (a lease it grants itself): it holds while every gap
between its heartbeats has stayed short enough that the server cannot have timed it out
(the gap, plus the SDK's heartbeat throttle, plus a margin, under the heartbeat timeout)
and the attempt's other timeouts have not passed.  A gap too long loses the claim for the
rest of the attempt (the server may have moved on; a retried attempt gets a claim of its
own).  ``fence`` is called immediately before each change: it heartbeats, then refuses
(raises) unless the claim holds and no cancellation has arrived.

Every heartbeat of an activity goes through ``heartbeat`` here, so the claim sees them all.
Outside an activity (offline tests of the logic) there is no claim and nothing is fenced.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

#: How often a worker sends heartbeats at most (the worker's setting,
#: ``workflows.options.HEARTBEAT_THROTTLE``): a heartbeat may reach the server this much
#: later than the SDK is asked to send it.
THROTTLE_S = 2.0
#: Slack for the network and the server's timers.
MARGIN_S = 1.0


class ClaimLost(ApplicationError):
    """The attempt may have been timed out by the server: it changes nothing more.  A
    retryable error: if the server still tracks the attempt, a retry gets a fresh claim."""

    def __init__(self, why: str) -> None:
        super().__init__(f"no change made: {why}", type="ClaimLost")


class Claim:
    """One attempt's claim to change the world."""

    def __init__(
        self,
        *,
        heartbeat_timeout_s: float | None,
        expires_in_s: float | None = None,
        started_ago_s: float = 0.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._clock = clock if clock is not None else monotonic
        now = self._clock()
        #: The longest gap between heartbeats that keeps the claim (None: no heartbeat
        #: timeout, the claim is bounded by the attempt's other timeouts only).
        self.max_gap_s = (
            None if heartbeat_timeout_s is None else heartbeat_timeout_s - THROTTLE_S - MARGIN_S
        )
        self._expires = None if expires_in_s is None else now + expires_in_s - MARGIN_S
        self._last = now - max(0.0, started_ago_s)
        self.lost = ""
        self._gap("before the attempt's first heartbeat", now)

    def _gap(self, where: str, now: float) -> None:
        gap = now - self._last
        if not self.lost and self.max_gap_s is not None and gap > self.max_gap_s:
            self.lost = (
                f"{gap:.1f} s passed without a heartbeat ({where}); the server may have timed "
                f"this attempt out (heartbeats must follow within {self.max_gap_s:.0f} s)"
            )

    def beat(self) -> None:
        """Record a heartbeat sent now."""
        now = self._clock()
        self._gap("between heartbeats", now)
        self._last = now

    def refusal_now(self) -> str:
        """As ``refusal``, counting the time since the last heartbeat as a gap too: for a
        thread working beside the attempt's own (``activities.alongside``), which sees no
        heartbeat of its own and must stop when the attempt has gone quiet too long (it may
        be stuck, and the server may have moved on)."""
        self._gap("since the last heartbeat", self._clock())
        return self.refusal()

    def refusal(self) -> str:
        """Why this attempt may not change anything now ("" when it may)."""
        if self.lost:
            return self.lost
        if self._expires is not None and self._clock() >= self._expires:
            return "the attempt's timeout has passed"
        return ""


@dataclass
class _Attempt:
    claim: Claim | None
    #: The details last heartbeated (at first, those an earlier attempt left): a bare
    #: heartbeat sends them again, so it never wipes what a retry resumes from.
    details: tuple[Any, ...] = ()


def monotonic() -> float:
    """The claims' clock (a test moves it to make a call take long without waiting)."""
    return time.monotonic()


_current: contextvars.ContextVar[_Attempt | None] = contextvars.ContextVar("claim", default=None)


def attempt_claim() -> Claim:
    """A claim for the running activity attempt, from its info: the heartbeat timeout, the
    start-to-close and schedule-to-close deadlines, and how long ago the server started it."""
    info = activity.info()
    now = datetime.now(UTC)
    started_ago = max(0.0, (now - info.started_time).total_seconds())
    ends: list[float] = []
    if info.start_to_close_timeout:
        ends.append(_left(info.started_time + info.start_to_close_timeout, now))
    if info.schedule_to_close_timeout:
        ends.append(_left(info.scheduled_time + info.schedule_to_close_timeout, now))
    hb = info.heartbeat_timeout
    return Claim(
        heartbeat_timeout_s=hb.total_seconds() if hb else None,
        expires_in_s=min(ends) if ends else None,
        started_ago_s=started_ago,
    )


def _left(when: datetime, now: datetime) -> float:
    return (when - now) / timedelta(seconds=1)


@contextmanager
def held() -> Iterator[Claim | None]:
    """Run an activity body under a claim of its attempt (none outside an activity)."""
    if not activity.in_activity():
        yield None
        return
    attempt = _Attempt(attempt_claim(), tuple(activity.info().heartbeat_details))
    token = _current.set(attempt)
    try:
        heartbeat()
        yield attempt.claim
    finally:
        _current.reset(token)


def heartbeat(*details: Any) -> None:
    """Heartbeat ``details`` (when in an activity; none given: the last ones again) and
    note it on the attempt's claim."""
    if not activity.in_activity():
        return
    attempt = _current.get()
    if attempt is not None:
        if details:
            attempt.details = details
        else:
            details = attempt.details
        if attempt.claim is not None:
            attempt.claim.beat()
    activity.heartbeat(*details)


def fence(what: str) -> None:
    """Immediately before a change (``what``): heartbeat, then raise ``CancelledError`` if
    the attempt was asked to stop, or ``ClaimLost`` if it may have lost its claim."""
    if not activity.in_activity():
        return
    heartbeat()
    if activity.is_cancelled():
        raise CancelledError(f"cancelled before {what}")
    attempt = _current.get()
    why = attempt.claim.refusal() if attempt is not None and attempt.claim is not None else ""
    if why:
        raise ClaimLost(f"{what} not done: {why}")
