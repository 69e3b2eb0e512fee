"""Between two polls of a busy member: wait in its container for its engine to go idle.

A busy member's next read is spaced out (``retirement.drain.next_read_in``: up to 8 s while
it stays busy), because every read is an exec and a fleet of busy retirements must not
cost one exec per member per second.  The price was latency: an engine that went idle just
after a read waited out the whole spacing before the read that proves it (measured at
N = 50 on the bed: the withdrawal's quiet window and the drain each ~6.5 s after idle).

Where the member counts its requests exactly (vLLM's ``GET /load``), the pause between
two polls is instead one exec of the wait one-shot (``activities.sampling.wait_for_idle``)
that asks the engine for its count every quarter second, inside the container, and ends
when it reads 0: the next poll follows at once.  It costs about what the read it replaces
cost (one exec per spacing), and it is never evidence: the poll after it reads the member
as every poll does, bound to the admitted container, and folds that read into the rule.

When it cannot wait (no exact count, no wait slot free, the exec failed), the pause is the
plain wait the poll loop planned; a wait that ended on anything but idle is followed by
what is left of that plain wait, so a failing wait never turns into a tight loop of execs.
Nor does a count that disagrees with the read: when a wait ended on idle and the read
after it was still busy (the gauges still show work the count no longer holds, or a new
request came in), the next pause is plain; waiting resumes after it.
"""

from __future__ import annotations

import time
from typing import Any

from temporalio import activity
from temporalio.exceptions import CancelledError

from activities import polling
from activities.fairslots import FairSlots
from activities.fencing import heartbeat
from activities.oneshot import MAX_WAIT_S
from activities.sampling import wait_for_idle
from kube.api import KubeApi
from retirement.models import MemberTarget, Target

#: A pause shorter than this is a plain wait: a wait exec for less would cost an exec for
#: a fraction of a second saved.
MIN_WAIT_S = 1.5


class IdleWait:
    """One polling attempt's pauses: ``plan`` names the busy member to wait on and how long
    the wait may last; ``pause`` (``activities.polling.poll_until``'s) carries it out."""

    def __init__(self, api: KubeApi, target: Target, slots: FairSlots) -> None:
        self.api, self.target, self.slots = api, target, slots
        self._member: MemberTarget | None = None
        self._up_to = 0.0
        #: The last pause ended because the count read 0.
        self._ended_idle = False
        #: What the last wait saw (for the log and tests); "" when the last pause was plain.
        self.last = ""

    def plan(self, member: MemberTarget | None, up_to: float) -> None:
        """The next pause waits on ``member`` (None: a plain wait) for up to ``up_to`` s;
        plain after a wait that ended on idle when the poll after it still found a member
        busy (``member`` given again)."""
        if member is not None and self._ended_idle:
            member = None
        self._member, self._up_to, self._ended_idle = member, min(up_to, MAX_WAIT_S), False

    def pause(self, seconds: float, details: Any) -> None:
        """Wait for the planned member to go idle (up to the planned time), else
        ``seconds``, heartbeating ``details`` at least once a second.  Cancellation raises."""
        member, up_to, self._member, self.last = self._member, self._up_to, None, ""
        began = time.monotonic()
        if member is not None and up_to >= MIN_WAIT_S:

            def tick() -> None:
                if activity.in_activity() and activity.is_cancelled():
                    raise CancelledError("cancelled while waiting for the engine to go idle")
                heartbeat(details)

            waited = wait_for_idle(
                self.api, self.target, member, wait_s=up_to, slots=self.slots, tick=tick
            )
            if waited is not None:
                self.last, self._ended_idle = waited.said, waited.idle
                if not waited.idle:
                    rest = seconds - (time.monotonic() - began)
                    if rest > 0:
                        polling.wait_heartbeating(rest, details)
                return
        polling.wait_heartbeating(seconds, details)
