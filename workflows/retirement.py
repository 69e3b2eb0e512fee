"""RetirementWorkflow: one durable retirement of one replica (SPEC sections 4 and 7).

The workflow decides; activities touch the world.  One workflow ID per deployment makes
Temporal refuse a second start atomically.  Each polling phase (withdraw, drain, settle) is
one heartbeating activity that polls inside itself, so history stays small whatever a
phase lasts.  After an abort the workflow holds with no timer until a new retry token (a
fresh attempt, via continue-as-new with fresh budgets and a fresh admission), a
cancel-intent, or a cancellation.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import (
    RetryPolicy,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from retirement.budgets import overall_deadline, phase_deadline
    from retirement.models import (
        AbortRequest,
        Admission,
        AdmitInput,
        AttemptRecord,
        CancelIntent,
        DeleteResult,
        Observation,
        PhaseInput,
        PublishInput,
        RestoreResult,
        RetirementRequest,
        RetirementState,
        RetryRequest,
        RetryResult,
        Target,
    )
    from retirement.phases import ORDER, Outcome, Phase, Verdict, abortable
    from retirement.retry import RetryDecision, decide_retry

SA_DEPLOYMENT = SearchAttributeKey.for_keyword("RetirementDeployment")
SA_ROLE = SearchAttributeKey.for_keyword("RetirementRole")
SA_ORDINAL = SearchAttributeKey.for_int("RetirementOrdinal")
SA_PHASE = SearchAttributeKey.for_keyword("RetirementPhase")
SA_OUTCOME = SearchAttributeKey.for_keyword("RetirementOutcome")

#: Errors an activity raises that retrying cannot mend (a 404/409/422, bad input).
NON_RETRYABLE = ["NotFound", "Conflict", "Invalid", "BadInput"]
#: Slack between an activity's own deadline and the workflow's timeout of it.
GRACE = timedelta(seconds=15)
HEARTBEAT = timedelta(seconds=10)
#: How long the workflow waits before running a phase activity again after an early UNKNOWN.
RERUN_DELAY = timedelta(seconds=5)
SHORT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    non_retryable_error_types=NON_RETRYABLE,
)
ADMIT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=30,
    non_retryable_error_types=NON_RETRYABLE,
)
#: After the point of no return the deletes must finish: retry until they do.
PERSISTENT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    non_retryable_error_types=["BadInput"],
)


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


class _Aborted(Exception):
    """Internal: the current attempt must abort (before the point of no return)."""


@workflow.defn(name="Retirement")
class RetirementWorkflow:
    """Retire one replica (or surplus members) of a ModelDeployment."""

    @workflow.init
    def __init__(self, request: RetirementRequest) -> None:
        self._req = request
        self._phase = Phase.ADMITTED
        self._outcome = Outcome.RUNNING
        self._target: Target | None = None
        self._started_at: datetime | None = None
        self._deadline: datetime | None = None
        self._phase_started_at: datetime | None = None
        self._phase_deadline: datetime | None = None
        self._readings: dict[str, str] = {}
        self._reasons: list[str] = []
        self._abort: str | None = None
        self._cancel_intent: str | None = None
        self._retry_token: str | None = None
        self._last_token = request.last_consumed_retry_token
        self._deleted: DeleteResult | None = None
        self._restored: RestoreResult | None = None
        self._history = list(request.history)
        self._timeline: list[tuple[Phase, datetime]] = []
        #: A cancellation that arrived while a shielded activity ran: acted on afterwards.
        self._cancelled = False

    # ----------------------------------------------------------------- handlers

    @workflow.query
    def state(self) -> RetirementState:
        """The whole state: phase, target, deadlines, last readings, reasons, attempts."""
        return RetirementState(
            workflow_id=workflow.info().workflow_id,
            request=self._req,
            attempt=self._req.attempt,
            phase=self._phase,
            outcome=self._outcome,
            target=self._target,
            started_at=self._started_at,
            deadline=self._deadline,
            phase_started_at=self._phase_started_at,
            phase_deadline=self._phase_deadline,
            last_readings=dict(self._readings),
            reasons=list(self._reasons),
            abort_requested=self._abort,
            last_consumed_retry_token=self._last_token,
            deleted=self._deleted,
            restored=self._restored,
            history=self._history_with_current(),
            phase_timeline=list(self._timeline),
        )

    @workflow.update
    def abort(self, request: AbortRequest) -> str:
        """Abort the retirement: the replica is kept and serving again."""
        return self._do_abort(request)

    def _do_abort(self, request: AbortRequest) -> str:
        self._abort = request.reason
        self._reasons.append(f"abort requested: {request.reason}")
        return f"aborting in phase {self._phase}"

    @abort.validator
    def _validate_abort(self, request: AbortRequest) -> None:
        refusal = self._abort_refusal()
        if refusal:
            raise ValueError(refusal)

    @workflow.signal(name="abort")
    def abort_signal(self, request: AbortRequest) -> None:
        """The ``abort`` update as a signal, for CLIs that cannot send updates."""
        refusal = self._abort_refusal()
        if refusal:
            self._reasons.append(f"abort signal ignored: {refusal}")
            return
        self._do_abort(request)

    @workflow.update
    def retry(self, request: RetryRequest) -> RetryResult:
        """Deliver a retry token; a new token on an aborted retirement starts a fresh attempt."""
        return self._do_retry(request)

    def _do_retry(self, request: RetryRequest) -> RetryResult:
        decision = decide_retry(
            token=request.token, last_consumed=self._last_token, aborted=self._held()
        )
        if decision is RetryDecision.ACCEPT:
            self._retry_token = request.token
            return RetryResult(decision=decision.value, message="a fresh attempt starts")
        if decision is RetryDecision.REPLAY:
            self._reasons.append(f"retry token {request.token!r} is a replay: ignored")
            return RetryResult(decision=decision.value, message="replay: ignored")
        self._reasons.append(f"retry token {request.token!r} ignored: not aborted")
        return RetryResult(decision=decision.value,
                           message=f"not aborted (phase {self._phase}): ignored")

    @workflow.signal(name="retry")
    def retry_signal(self, request: RetryRequest) -> None:
        """The ``retry`` update as a signal."""
        self._do_retry(request)

    @workflow.signal
    def cancel_intent(self, request: CancelIntent) -> None:
        """The intent went away (the spec re-declares the ordinal): end, capacity retained."""
        if self._cancel_intent is None:
            self._cancel_intent = request.reason
            self._reasons.append(f"intent cancelled: {request.reason}")

    # ----------------------------------------------------------------- main

    @workflow.run
    async def run(self, request: RetirementRequest) -> RetirementState:
        """Run one attempt; hold after an abort; continue-as-new for a fresh attempt."""
        self._started_at = workflow.now()
        try:
            await self._attempt()
        except asyncio.CancelledError:
            await self._on_cancelled()
            raise
        if self._cancelled and self._outcome in (Outcome.ABORTED, Outcome.RUNNING):
            # Cancelled while a shielded step ran: it aborted (and restored) meanwhile.
            self._outcome = Outcome.CANCELLED
            await self._upsert()
            await self._publish(clear=True)
            raise asyncio.CancelledError("workflow cancelled")
        if self._outcome is not Outcome.ABORTED:
            return self.state()
        # Held: no timer, so history does not grow however long the hold lasts.
        try:
            await workflow.wait_condition(
                lambda: self._retry_token is not None or self._cancel_intent is not None
            )
        except asyncio.CancelledError:
            self._outcome = Outcome.CANCELLED
            await self._publish(clear=True)
            raise
        if self._retry_token is None:
            self._outcome = Outcome.CAPACITY_RETAINED
            self._finish_record(self._cancel_intent or "intent cancelled")
            await self._publish(clear=True)
            return self.state()
        self._finish_record(f"retry token {self._retry_token!r}")
        workflow.continue_as_new(
            self._req.model_copy(
                update={
                    "attempt": self._req.attempt + 1,
                    "last_consumed_retry_token": self._retry_token,
                    "history": [*self._history],
                }
            )
        )

    async def _attempt(self) -> None:
        req = self._req
        try:
            admission: Admission = await workflow.execute_activity(
                "admit",
                AdmitInput(request=req, workflow_id=workflow.info().workflow_id),
                result_type=Admission,
                start_to_close_timeout=timedelta(seconds=30),
                # The API server may be down for a while; after ~2.5 min of attempts, or on
                # a 404/409/422, refuse (nothing was touched; the watcher derives the intent
                # again later).
                retry_policy=ADMIT,
            )
        except ActivityError as e:
            if isinstance(e.cause, CancelledError):
                raise  # the workflow is being cancelled: not a refusal
            admission = Admission(refusal=f"admission failed: {e.cause or e}")
        now = workflow.now()
        self._deadline = overall_deadline(admitted_at=now, budgets=req.budgets)
        if admission.target is None:
            self._outcome = Outcome.REFUSED
            self._reasons.append(f"admission refused: {admission.refusal}")
            self._finish_record(admission.refusal)
            await self._enter(Phase.ADMITTED, clear=True)
            return
        self._target = admission.target
        await self._enter(Phase.ADMITTED)
        try:
            await self._before_point_of_no_return(admission.target)
        except _Aborted as e:
            await self._abort_now(str(e))
            return
        await self._delete_and_settle(admission.target)

    async def _before_point_of_no_return(self, target: Target) -> None:
        self._check_abort()
        obs = await self._phase_activity(Phase.DISQUALIFIED, "disqualify", target)
        self._require(obs, "disqualify")
        self._check_abort()
        obs = await self._phase_activity(Phase.WITHDRAWING, "withdraw", target)
        self._require(obs, "withdrawal")
        self._check_abort()
        # The drain starts only after withdrawal was VERIFIED in this attempt.
        obs = await self._phase_activity(Phase.DRAINING, "drain", target)
        self._require(obs, "drain")
        self._check_abort()

    async def _delete_and_settle(self, target: Target) -> None:
        # Point of no return: a cancellation or an abort no longer stops the deletes.
        await self._enter(Phase.DELETING)
        try:
            self._deleted = await self._shielded(
                workflow.execute_activity(
                    "delete", self._phase_input(target), result_type=DeleteResult,
                    start_to_close_timeout=timedelta(seconds=60),
                    schedule_to_close_timeout=timedelta(minutes=30),
                    retry_policy=PERSISTENT,
                )
            )
        except ActivityError as e:
            # Only a BadInput error gets here; nothing more can be deleted safely.
            self._reasons.append(f"delete failed: {e.cause or e}")
            self._outcome = Outcome.COMPLETED_UNSETTLED
            self._finish_record("delete failed")
            await self._publish()
            return
        if self._deleted.replaced:
            self._reasons.append(
                f"replaced, not touched: {', '.join(self._deleted.replaced)}"
            )
        obs = await self._shielded(self._phase_activity(Phase.SETTLING, "settle", target))
        if obs.verdict is Verdict.VERIFIED:
            self._outcome = Outcome.COMPLETED
        else:
            self._outcome = Outcome.COMPLETED_UNSETTLED
            self._reasons.append(f"settle unconfirmed: {obs.reason}")
        self._finish_record(obs.reason)
        await self._enter(Phase.COMPLETED, clear=True)

    # ----------------------------------------------------------------- phases

    def _phase_input(self, target: Target) -> PhaseInput:
        assert self._phase_deadline is not None
        return PhaseInput(
            target=target,
            deadline=self._phase_deadline,
            poll_interval_s=self._req.budgets.poll_interval_s,
            routerless_policy=self._req.routerless_policy,
            quiet_window_s=self._req.quiet_window_s,
        )

    async def _phase_activity(self, phase: Phase, name: str, target: Target) -> Observation:
        """Enter ``phase`` and run its activity until a verdict, the phase deadline, or an
        abort request (which cancels the activity).

        A polling activity answers UNKNOWN only at the deadline it is given; should it answer
        UNKNOWN earlier (its clock differs, its worker restarted), the workflow waits on a
        durable timer and runs it again, never past the phase deadline.
        """
        await self._enter(phase)
        assert self._phase_deadline is not None
        interruptible = abortable(phase)
        last = Observation(verdict=Verdict.UNKNOWN, reason="no answer")
        while True:
            remaining = self._phase_deadline - workflow.now()
            if remaining <= timedelta(0):
                return Observation(verdict=Verdict.UNKNOWN, reason=last.reason,
                                   readings=last.readings)
            obs = await self._run_once(phase, name, target, remaining, interruptible)
            if obs.readings:
                self._readings = dict(obs.readings)
            if obs.verdict is not Verdict.UNKNOWN or self._interrupted(interruptible):
                return obs
            last = obs
            left = self._phase_deadline - workflow.now()
            if left <= timedelta(0):
                return obs
            try:
                await workflow.wait_condition(
                    lambda: self._interrupted(interruptible), timeout=min(left, RERUN_DELAY)
                )
            except TimeoutError:
                continue

    def _interrupted(self, interruptible: bool) -> bool:
        return interruptible and (self._abort is not None or self._cancel_intent is not None)

    async def _run_once(self, phase: Phase, name: str, target: Target, remaining: timedelta,
                        interruptible: bool) -> Observation:
        handle = workflow.start_activity(
            name,
            self._phase_input(target),
            result_type=Observation,
            start_to_close_timeout=remaining + GRACE,
            schedule_to_close_timeout=remaining + GRACE,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=SHORT,
        )
        try:
            await workflow.wait_condition(
                lambda: handle.done() or self._interrupted(interruptible),
                timeout=remaining + GRACE,
            )
        except asyncio.CancelledError:
            if interruptible:
                handle.cancel()
                raise
            shielded: Observation = await self._shielded(handle)
            return shielded
        except TimeoutError:
            handle.cancel()
            return Observation(verdict=Verdict.UNKNOWN,
                               reason=f"{phase} budget exhausted (no answer)")
        if not handle.done():
            handle.cancel()
            return Observation(verdict=Verdict.FAILED,
                               reason=self._abort or self._cancel_intent or "abort")
        try:
            result: Observation = handle.result()
            return result
        except ActivityError as e:
            return Observation(verdict=Verdict.UNKNOWN, reason=f"{name} failed: {e.cause or e}")

    def _require(self, obs: Observation, what: str) -> None:
        self._reasons.append(f"{what}: {obs.verdict} after {obs.polls} poll(s): {obs.reason}")
        if obs.verdict is Verdict.VERIFIED:
            return
        if self._abort is not None or self._cancel_intent is not None:
            raise _Aborted(self._abort or self._cancel_intent or "abort")
        if obs.verdict is Verdict.FAILED:
            raise _Aborted(f"{what} failed: {obs.reason}")
        raise _Aborted(f"{what} budget exhausted: {obs.reason}")

    def _check_abort(self) -> None:
        if self._abort is not None:
            raise _Aborted(f"abort requested: {self._abort}")
        if self._cancel_intent is not None:
            raise _Aborted(f"intent cancelled: {self._cancel_intent}")
        assert self._deadline is not None
        if workflow.now() >= self._deadline:
            raise _Aborted("overall budget exhausted")

    async def _abort_now(self, reason: str) -> None:
        self._reasons.append(f"aborted in {self._phase}: {reason}")
        furthest = self._phase
        await self._enter(Phase.ABORTED)
        self._restored = await self._restore()
        if self._cancel_intent is not None:
            self._outcome = Outcome.CAPACITY_RETAINED
            self._finish_record(reason, furthest)
            await self._publish(clear=True)
            return
        self._outcome = Outcome.ABORTED
        self._finish_record(reason, furthest)
        await self._upsert()
        await self._publish()

    async def _restore(self) -> RestoreResult:
        if self._target is None:
            return RestoreResult()
        try:
            restored: RestoreResult = await self._shielded(
                workflow.execute_activity(
                    "restore",
                    PhaseInput(target=self._target,
                               deadline=workflow.now() + timedelta(seconds=30),
                               poll_interval_s=self._req.budgets.poll_interval_s),
                    result_type=RestoreResult,
                    start_to_close_timeout=timedelta(seconds=60),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=SHORT,
                    schedule_to_close_timeout=timedelta(minutes=5),
                )
            )
            return restored
        except ActivityError as e:
            self._reasons.append(f"restore failed: {e.cause or e}")
            return RestoreResult(failed={"*": str(e.cause or e)})

    async def _on_cancelled(self) -> None:
        """Cancelling the workflow (the UI) aborts the same way: restore, publish, end."""
        self._abort = self._abort or "workflow cancelled"
        if abortable(self._phase):
            self._reasons.append(f"cancelled in {self._phase}: aborting")
            furthest = self._phase
            await self._enter(Phase.ABORTED)
            self._restored = await self._restore()
            self._finish_record("workflow cancelled", furthest)
        self._outcome = Outcome.CANCELLED
        await self._upsert()
        await self._publish(clear=True)

    # ----------------------------------------------------------------- helpers

    def _abort_refusal(self) -> str:
        if self._outcome is not Outcome.RUNNING:
            return f"nothing to abort: the retirement is {self._outcome}"
        if not abortable(self._phase):
            return f"abort refused: {self._phase} has begun, the remaining deletes finish"
        if self._abort is not None:
            return "abort already requested"
        return ""

    def _held(self) -> bool:
        return self._outcome is Outcome.ABORTED

    async def _enter(self, phase: Phase, *, clear: bool = False) -> None:
        now = workflow.now()
        self._phase = phase
        self._phase_started_at = now
        if self._deadline is not None:
            self._phase_deadline = phase_deadline(
                phase=phase, phase_started_at=now, overall=self._deadline,
                budgets=self._req.budgets,
            )
        self._timeline.append((phase, now))
        await self._upsert()
        await self._publish(clear=clear)

    async def _upsert(self) -> None:
        workflow.upsert_search_attributes(
            search_attribute_updates(
                namespace=self._req.namespace, deployment=self._req.deployment,
                role=self._req.role, ordinal=self._req.ordinal, phase=self._phase,
                outcome=self._outcome,
            )
        )

    async def _publish(self, *, clear: bool = False) -> None:
        """Mirror the state on the ModelDeployment (``status.retirement``) with an Event."""
        assert self._started_at is not None and self._phase_started_at is not None
        payload = PublishInput(
            namespace=self._req.namespace, deployment=self._req.deployment,
            workflow_id=workflow.info().workflow_id, phase=self._phase, outcome=self._outcome,
            reason=self._reasons[-1] if self._reasons else "", role=self._req.role,
            ordinal=self._req.ordinal, target=self._target, started_at=self._started_at,
            deadline=self._deadline, phase_started_at=self._phase_started_at,
            last_consumed_retry_token=self._last_token, clear=clear,
        )
        try:
            await self._shielded(
                workflow.execute_activity(
                    "publish", payload, start_to_close_timeout=timedelta(seconds=20),
                    schedule_to_close_timeout=timedelta(minutes=2), retry_policy=SHORT,
                )
            )
        except ActivityError as e:
            # Publishing is a mirror for kubectl users; the workflow is the truth.
            self._reasons.append(f"publish failed: {e.cause or e}")

    async def _shielded(self, awaitable: Any) -> Any:
        """Await an activity to its end even if the workflow is cancelled meanwhile; the
        cancellation is remembered (an abort before the point of no return)."""
        task = asyncio.ensure_future(awaitable)
        while True:
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                self._cancelled = True
                if self._abort is None and abortable(self._phase):
                    self._abort = "workflow cancelled"
                if task.done():
                    return task.result()
                continue

    def _history_with_current(self) -> list[AttemptRecord]:
        if any(h.attempt == self._req.attempt for h in self._history):
            return list(self._history)
        return [*self._history, self._attempt_record()]

    def _attempt_record(self) -> AttemptRecord:
        return AttemptRecord(
            attempt=self._req.attempt,
            started_at=self._started_at or workflow.now(),
            furthest_phase=max(
                (p for p, _ in self._timeline if p in ORDER),
                key=ORDER.index, default=Phase.ADMITTED,
            ),
            outcome=self._outcome,
            reason=self._reasons[-1] if self._reasons else "",
        )

    def _finish_record(self, reason: str, furthest: Phase | None = None) -> None:
        rec = self._attempt_record().model_copy(
            update={"ended_at": workflow.now(), "reason": reason,
                    **({"furthest_phase": furthest} if furthest else {})}
        )
        self._history = [h for h in self._history if h.attempt != rec.attempt] + [rec]
