"""Refuse workflow activations whose clock did not advance with their events.

The retirement decides on ``workflow.now()`` (budgets, deadlines, the age of a drain
reading), and a replay must see the same clock as the live run did.  The Temporal SDK's
core breaks that in one race, reproduced on the dev server
(``tests/workflows/test_stale_activation_on_dev_server.py``) and seen in the fault
campaign as retirements wedged by ``[TMPRL1100] Nondeterminism error``:

1. the worker holding the run's sticky queue dies while the run waits (a timer, an
   activity); its sticky queue is now dead;
2. a query arrives (the watcher, the CLI, the Temporal UI opening the workflow): no
   workflow task is pending, so the server dispatches it directly, first to the dead
   sticky queue; while it waits there (the sticky schedule-to-start timeout) the timer
   fires or the activity completes;
3. the query then goes to the normal queue with the whole history, which now ends in a
   workflow task *scheduled but not started*; core applies the new events to the run
   and activates the workflow live, on the clock of the last task that *started*;
4. the workflow decides on that old clock, the run stays cached, and the commands go out
   with the next real task, whose recorded start time is later.  A replay of the history
   (after any later eviction or restart) decides on the recorded clock, disagrees, and
   every task of the run fails from then on.

Such an activation is recognisable: it is live (not a replay), it carries new events (the
history grew since the instance's last activation), and its timestamp did not move on,
whereas every real workflow task that brings events also brings a ``WorkflowTaskStarted``
with a later time.  ``StaleActivationGuard`` wraps the workflow runner and fails exactly
those activations without running the workflow: core then fails the query (the caller
reads again later) and evicts the run, and the next real task replays the history on the
recorded clocks.  Nothing else changes: the worker keeps its workflow cache.

A server clock stepped backwards by more than a task's length could make a real task look
stale; it is then failed and retried until the server's clock passes the last start time
again (Temporal's own timers misbehave under such a step too).

Known misses (read in the core that ships with the SDK, ``workflow_machines.rs``,
``managed_run.rs``; not seen in the campaign): when the task just before the race was a
speculative Update task the server discarded (a rejected update), core lowers the history
length by its two events but keeps its clock, so a race that then brings one event looks
like no new event; and when that task gave the workflow no job (core completes it without
an activation), the stale activation carries that task's later clock.  Both need a
rejected update right before the race; neither can be told from a real task by clock and
length alone, and refusing a real task would fail it, so they are left, not guessed at.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import WorkflowInstance

from retirement.names import STALE_ACTIVATION_REFUSED
from worker.delegating import DelegatingInstance, WrappingRunner

log = logging.getLogger(__name__)

#: Jobs that read the workflow without moving it on: an activation carrying only these
#: decides nothing.
_READ_ONLY_JOBS = frozenset({"query_workflow", "remove_from_cache"})

#: The failure message of a refused activation (core hands it to the query's caller).
REFUSED = (
    f"{STALE_ACTIVATION_REFUSED}: new events on the clock of an earlier task "
    "(a query raced a workflow task); the run is evicted and replays on the next task"
)


@dataclass(frozen=True)
class Seen:
    """The clock and history length of the last activation that moved an instance on
    (a query's activation does not count: it may carry a history that ran ahead)."""

    timestamp_ns: int
    history_length: int


def seen_of(act: WorkflowActivation) -> Seen | None:
    """What ``act`` tells of the run's clock (None: it carries no timestamp)."""
    if not act.HasField("timestamp"):
        return None
    return Seen(timestamp_ns=act.timestamp.ToNanoseconds(), history_length=act.history_length)


def moves(act: WorkflowActivation) -> bool:
    """Whether ``act`` carries a job that moves the workflow on (not only reads it)."""
    return any(job.WhichOneof("variant") not in _READ_ONLY_JOBS for job in act.jobs)


def is_stale(last: Seen | None, act: WorkflowActivation) -> bool:
    """Whether ``act`` moves the workflow on with new events on an old clock."""
    now = seen_of(act)
    if last is None or now is None or act.is_replaying or not moves(act):
        return False
    return now.history_length > last.history_length and now.timestamp_ns <= last.timestamp_ns


def refusal(act: WorkflowActivation) -> WorkflowActivationCompletion:
    """The failed completion that refuses ``act``."""
    completion = WorkflowActivationCompletion(run_id=act.run_id)
    completion.failed.failure.message = REFUSED
    return completion


class _GuardedInstance(DelegatingInstance):
    """A workflow instance whose stale activations are refused (``is_stale``)."""

    def __init__(self, inner: WorkflowInstance) -> None:
        super().__init__(inner)
        self._last: Seen | None = None

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        if is_stale(self._last, act):
            info = self._inner.get_info()
            log.warning(
                "refused a stale activation of %s (run %s): history %d events on the clock "
                "of the task at %d events",
                info.workflow_id,
                act.run_id,
                act.history_length,
                self._last.history_length if self._last else 0,
            )
            return refusal(act)
        if moves(act):
            self._last = seen_of(act) or self._last
        return self._inner.activate(act)


class StaleActivationGuard(WrappingRunner):
    """``inner`` (the SDK's sandboxed runner, in the product), with stale activations
    refused."""

    def wrap(self, instance: WorkflowInstance) -> WorkflowInstance:
        return _GuardedInstance(instance)
