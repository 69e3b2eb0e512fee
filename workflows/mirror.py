"""The mirror of a retirement outside Temporal: typed search attributes for the UI, its
metrics (``workflows.metrics``), and ``status.retirement`` plus an Event on the
ModelDeployment for kubectl users.

The workflow is the truth; the mirror never delays a protocol step.  Search attributes are
upserted in place (a command, no round trip).  The snapshots queued when a phase activity
starts ride along with it (``take``; ``activities.alongside`` publishes them while the
phase runs, and what it did not publish comes back with its result, ``back``): that costs
no workflow task, where a publish activity costs one when it completes.  Any other
snapshot, and any a phase did not publish, goes out by the publish activity, in a
background task that works through the queue in order, so a slow or failing status
subresource costs no budget and never delays a restore; the workflow waits for the queue
only when it ends or continues as new.  Never two publishers at once: a phase takes
snapshots only while no publish activity runs, and the background task waits while a
phase carries some.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import (
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities import RetirementActivities
    from retirement.models import PublishInput, RetirementRequest, RetirementState
    from retirement.phases import Outcome, Phase
    from workflows.metrics import RetirementMetrics
    from workflows.options import PUBLISH_SCHEDULE_TIMEOUT, PUBLISH_TIMEOUT, SHORT
    from workflows.story import current

#: The patch (``workflow.patched``) under which phase activities carry snapshots:
#: histories recorded before it replay with a publish activity for every snapshot.
ALONGSIDE_PATCH = "mirror-alongside-phases"

SA_DEPLOYMENT = SearchAttributeKey.for_keyword("RetirementDeployment")
SA_ROLE = SearchAttributeKey.for_keyword("RetirementRole")
SA_ORDINAL = SearchAttributeKey.for_int("RetirementOrdinal")
SA_PHASE = SearchAttributeKey.for_keyword("RetirementPhase")
SA_OUTCOME = SearchAttributeKey.for_keyword("RetirementOutcome")
#: Every custom search attribute of a retirement (``retire setup`` registers them).
SEARCH_ATTRIBUTES = (SA_DEPLOYMENT, SA_ROLE, SA_ORDINAL, SA_PHASE, SA_OUTCOME)


def search_attribute_updates(
    *, namespace: str, deployment: str, role: str, ordinal: int, phase: Phase, outcome: Outcome
) -> list[SearchAttributeUpdate[Any]]:
    """The typed search attributes of a retirement, as upserts."""
    return [
        SA_DEPLOYMENT.value_set(f"{namespace}/{deployment}"),
        SA_ROLE.value_set(role),
        SA_ORDINAL.value_set(ordinal),
        SA_PHASE.value_set(phase.value),
        SA_OUTCOME.value_set(outcome.value),
    ]


def initial_search_attributes(request: RetirementRequest) -> TypedSearchAttributes:
    """The search attributes to start a retirement with (the UI can filter it at once)."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(SA_DEPLOYMENT, f"{request.namespace}/{request.deployment}"),
        SearchAttributePair(SA_ROLE, request.role),
        SearchAttributePair(SA_ORDINAL, request.ordinal),
        SearchAttributePair(SA_PHASE, Phase.ADMITTED.value),
        SearchAttributePair(SA_OUTCOME, Outcome.RUNNING.value),
    ]
    return TypedSearchAttributes(pairs)


def snapshot(
    s: RetirementState, *, phase: Phase, at: datetime, outcome: Outcome, clear: bool
) -> PublishInput:
    """What ``publish`` writes for ``s`` as it entered ``phase`` at ``at``."""
    req = s.request
    return PublishInput(
        namespace=req.namespace,
        deployment=req.deployment,
        workflow_id=s.workflow_id,
        phase=phase,
        outcome=outcome,
        reason=s.reason,
        role=req.role,
        ordinal=req.ordinal,
        target=s.target,
        started_at=s.started_at or at,
        deadline=s.deadline,
        phase_started_at=at,
        last_consumed_retry_token=s.last_consumed_retry_token,
        clear=clear,
    )


class Mirror:
    """Upserts search attributes and publishes snapshots in order, in the background."""

    def __init__(self, *, already: RetirementState | None = None) -> None:
        """``already``: a state an earlier run of this workflow mirrored (carried on)."""
        self._queue: list[PublishInput] = []
        self._task: asyncio.Task[None] | None = None
        self._upserted: tuple[Phase, Outcome] | None = None
        self._published = len(already.phase_timeline) if already else 0  # entries queued
        self._outcome = already.outcome if already else Outcome.RUNNING
        self._reason = already.reason if already else ""
        self.failures: list[str] = []
        self._metrics = RetirementMetrics(already=already)
        self._publishing = False  # a publish activity is running
        self._riding = False  # a phase activity carries snapshots

    def show(self, s: RetirementState, *, clear: bool = False) -> None:
        """Mirror ``s``: upsert the search attributes on a phase or outcome change; queue
        one snapshot per phase entered since the last call (each phase change is an Event),
        or one for a changed outcome; ``clear`` marks the last one final.  The UI's
        current details follow every change (no history cost)."""
        workflow.set_current_details(current(s, workflow.now()))
        self._metrics.show(s)
        if self._upserted != (s.phase, s.outcome):
            self._upserted = (s.phase, s.outcome)
            req = s.request
            workflow.upsert_search_attributes(
                search_attribute_updates(
                    namespace=req.namespace,
                    deployment=req.deployment,
                    role=req.role,
                    ordinal=req.ordinal,
                    phase=s.phase,
                    outcome=s.outcome,
                )
            )
        entries = s.phase_timeline[self._published :]
        self._published = len(s.phase_timeline)
        for i, (phase, at) in enumerate(entries):
            last = i == len(entries) - 1
            self._queue.append(
                snapshot(
                    s,
                    phase=phase,
                    at=at,
                    clear=clear and last,
                    outcome=s.outcome if last else Outcome.RUNNING,
                )
            )
        # While held, what is still not back in service changes the reason: show it.
        news = s.outcome is Outcome.ABORTED and not s.restoring and s.reason != self._reason
        if not entries and (clear or s.outcome is not self._outcome or news):
            when = s.phase_started_at or s.started_at
            if when is not None:
                self._queue.append(
                    snapshot(s, phase=s.phase, at=when, outcome=s.outcome, clear=clear)
                )
        self._outcome = s.outcome
        self._reason = s.reason
        self._start()

    def take(self) -> list[PublishInput]:
        """The queued snapshots, for the phase activity about to start to publish alongside
        it; none while a publish activity runs (they stay queued for it), and none in a
        history recorded before phases carried them."""
        if self._publishing or self._riding or not self._queue:
            return []
        if not workflow.patched(ALONGSIDE_PATCH):
            return []
        taken, self._queue = self._queue, []
        self._riding = True
        return taken

    def back(self, taken: list[PublishInput], *, published: int) -> None:
        """The phase activity that carried ``taken`` ended, having published the first
        ``published`` of them (0 when it failed or was cancelled: it may have published
        some; published again, a snapshot is the same write and the same Event).  The rest
        go out first, before anything queued since."""
        if not taken:
            return
        self._riding = False
        self._queue[:0] = taken[max(0, published) :]
        self._start()

    def _start(self) -> None:
        if self._riding or not self._queue:
            return
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._work())

    async def flush(self, *, on_cancel: Callable[[], None]) -> None:
        """Wait until every queued snapshot was published (or failed).  A cancellation
        of the workflow meanwhile is handed to ``on_cancel`` (the protocol decides on it)
        and the wait goes on: the last snapshots still go out."""
        while self._task is not None and not self._task.done():
            try:
                await asyncio.shield(self._task)
            except asyncio.CancelledError:
                on_cancel()

    async def _work(self) -> None:
        while self._queue and not self._riding:
            payload = self._queue.pop(0)
            self._publishing = True
            try:
                await workflow.execute_activity_method(
                    RetirementActivities.publish,
                    payload,
                    start_to_close_timeout=PUBLISH_TIMEOUT,
                    schedule_to_close_timeout=PUBLISH_SCHEDULE_TIMEOUT,
                    retry_policy=SHORT,
                    summary=f"mirror {payload.phase}/{payload.outcome} on the ModelDeployment",
                )
            except ActivityError as e:
                # Publishing is a mirror for kubectl users; the workflow is the truth.
                self.failures.append(f"publish failed: {e.cause or e}")
            finally:
                self._publishing = False
