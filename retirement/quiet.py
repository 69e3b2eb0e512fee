"""The router-less quiet window (``docs/architecture.md``, "Router-less deployments"):
with no router to ask, a deployment whose policy allows it is withdrawn once the measured
members' work counters have not moved for ``quiet_window_s``.

This is the decision only, pure: the caller reads the members in order
(``activities.sampling.sample_member``), stops at the first read that ends the poll
(``ends_reads``), and passes the reads, the monotonic time after them and the window it
kept from the previous poll; it gets back the window to keep, the verdict and why.

- A read that failed (no exec slot, an exec timed out under load) saw nothing, so it
  cannot have seen traffic: the window is kept (and the caller backs off, ``strained``).
  The window still ends only on a poll whose reads work, with the counters of its start:
  they are monotonic and every read that works is bound to the admitted container, so
  equal counters mean no work in between, however many reads failed.  Restarting it
  instead made retirements of 200 started at once run out of budget on "quiet window
  started" (worker benchmark: each read that found no exec slot began the wait again).
- A member whose HTTP front end holds requests (the exact count, ``GET /load``) is not
  quiet, whatever its counters: the window is dropped.
- Counters other than the window's start it again, now.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retirement.phases import Verdict
from retirement.readings import Sample


@dataclass(frozen=True)
class QuietWindow:
    """The counters (per member Pod) the window started with, and when (monotonic
    seconds); ``counters`` None: no window started."""

    counters: Mapping[str, tuple[float, ...]] | None = None
    since: float = 0.0


@dataclass(frozen=True)
class QuietDecision:
    """One poll's decision: the window to keep, the verdict and why, and whether a read
    failed (``strained``: the next read backs off)."""

    window: QuietWindow
    verdict: Verdict
    reason: str
    strained: bool = False


def ends_reads(sample: Sample) -> bool:
    """Whether this read decides the poll on its own (no later member is read): a read
    that failed, or a member holding requests."""
    return not sample.complete or bool(sample.exact)


def decide(
    window: QuietWindow, reads: Sequence[tuple[str, Sample]], *, now: float, window_s: float
) -> QuietDecision:
    """The decision on one poll's ``reads`` ((member Pod, read), in the order read) at
    monotonic time ``now``, given the ``window`` kept from the previous poll."""
    for pod, s in reads:
        if not s.complete:
            return QuietDecision(window, Verdict.UNKNOWN, f"router-less: {pod} {s.reason}", True)
        if s.exact:
            return QuietDecision(
                QuietWindow(),
                Verdict.UNKNOWN,
                f"router-less: {pod} holds {s.exact} request(s) (GET /load)",
            )
    counters = {pod: s.counters for pod, s in reads}
    if window.counters != counters:
        return QuietDecision(
            QuietWindow(counters, now), Verdict.UNKNOWN, "router-less: quiet window started"
        )
    quiet_s = now - window.since
    if quiet_s >= window_s:
        return QuietDecision(
            window, Verdict.VERIFIED, f"router-less: counters quiet for {quiet_s:.0f} s"
        )
    return QuietDecision(
        window, Verdict.UNKNOWN, f"router-less: quiet for {quiet_s:.0f} s of {window_s:g}"
    )
