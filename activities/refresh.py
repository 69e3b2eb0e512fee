"""The drain's proof taken again by the delete's guard, when the evidence it was handed is
older than the freshness bound (SPEC section 4).

The delete acts on the drain's last idle read only while that read is younger than
``retirement.progress.freshness_bound`` (two poll intervals and 10 s).  Under a fleet's
load the workflow task between the drain's answer and the delete, and the delete
activity's start, can wait longer than that: on the worker benchmark at N = 200 a
retirement ran its drain five times in a row, each answer 12-14 s old when its workflow
task ran, before one was young enough (2026-12-05).  Each new drain cost execs and two
more workflow tasks in the same herd, so the lag fed itself.

So the guard, finding the evidence stale, takes the proof again itself, immediately
before the delete: by the drain's own rounds (``activities.drain.DrainRounds``, afresh:
nothing is carried over from any earlier attempt), bounded by ``REFRESH_S``.  The same
identity-bound exec reads, the same re-check of labels, Services and routers after
them, two consecutive idle reads with unchanged counters (both in one exec with the exact
count), SGLang's settle.  VERIFIED: the guard goes on to its own checks, and the evidence
is now seconds old.  FAILED (the label put back, a member replaced) passes through: the
retirement aborts.  Anything else refuses UNKNOWN, naming why: the workflow drains again.
Nothing here writes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from activities.drain import RECHECK_HTTP_TIMEOUT_S, DrainRounds
from activities.fairslots import WorkerSlots
from activities.http_client import http_client
from activities.polling import seconds_left, wait_heartbeating
from kube.api import KubeApi
from retirement.models import Observation, PhaseInput
from retirement.phases import Verdict

#: How long the guard may take the drain's proof again: with the exact count one exec
#: suffices (two reads 0.25 s apart); without it two rounds a poll interval apart, or an
#: SGLang engine's gauge settle (``retirement.drain.SGLANG_GAUGE_SETTLE_S``); each read may
#: wait for its exec slot and its exec bound (3 + 5 s).  Well inside the delete's 60 s.
REFRESH_S = 12.0


def refreshed(
    api: KubeApi, inp: PhaseInput, *, stale: str, slots: WorkerSlots | None
) -> Observation:
    """The drain's proof taken now for ``inp.target`` (``stale``: why the handed one does not
    do).  VERIFIED with ``evidence_at`` as the drain's; FAILED as the drain's; anything
    else UNKNOWN with a reason naming the stale evidence and what the reads said.

    Rounds go on only while the members read idle and the rule wants more (the second
    read, SGLang's settle): a member busy again, or a read that is not complete, ends the
    refresh at once.  The guard does not wait for an engine to drain: Deleting cannot be
    aborted, Draining can, and has its own budget."""
    deadline = datetime.now(UTC) + timedelta(seconds=REFRESH_S)
    with http_client(timeout=RECHECK_HTTP_TIMEOUT_S) as http:
        rounds = DrainRounds(
            api,
            inp.model_copy(update={"deadline": deadline}),
            http,
            None if slots is None else slots.execs,
            None if slots is None else slots.waits,
            fresh=True,
        )
        while True:
            obs = rounds.once()
            if obs.verdict is Verdict.FAILED:
                return obs
            if obs.verdict is Verdict.VERIFIED and obs.evidence_at is not None:
                return obs
            left = seconds_left(deadline)
            if rounds.in_flight != 0 or left <= 0:
                return Observation(
                    verdict=Verdict.UNKNOWN,
                    reason=f"{stale}, and read again it is not idle: {obs.reason}",
                    readings=obs.readings,
                )
            wait_heartbeating(min(rounds.next_wait(obs), left), None)
