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

A member with the exact count, read alone, keeps its whole window in one exec
(``decide_in_one``): the one-shot waits for the count to read 0, reads, keeps the window on
the container's own monotonic clock and reads again.  The window holds when both reads
are complete, the count 0 at both, the counters equal, and the reads at least the window
apart; any other outcome starts nothing (the next poll runs a whole window again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retirement.phases import Verdict
from retirement.readings import QuietReads, Sample


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


def decide_in_one(pod: str, seen: QuietReads, *, window_s: float) -> QuietDecision:
    """The decision on a whole window read in one exec of member ``pod`` (``seen``)."""
    none = QuietWindow()
    if seen.busy is not None:
        return QuietDecision(
            none, Verdict.UNKNOWN, f"router-less: {pod} holds {seen.busy} request(s) (GET /load)"
        )
    for s in seen.reads:
        if not s.complete:
            return QuietDecision(none, Verdict.UNKNOWN, f"router-less: {pod} {s.reason}", True)
    first, second = seen.reads
    if first.exact or second.exact:
        held = max(first.exact or 0, second.exact or 0)
        return QuietDecision(
            none, Verdict.UNKNOWN, f"router-less: {pod} holds {held} request(s) (GET /load)"
        )
    if first.counters != second.counters:
        return QuietDecision(
            none, Verdict.UNKNOWN, f"router-less: {pod} counters moved in the quiet window"
        )
    if seen.apart_s < window_s:
        return QuietDecision(
            none,
            Verdict.UNKNOWN,
            f"router-less: {pod} read {seen.apart_s:.1f} s apart, under the {window_s:g} s window",
        )
    return QuietDecision(
        none, Verdict.VERIFIED, f"router-less: counters quiet for {seen.apart_s:.0f} s"
    )
