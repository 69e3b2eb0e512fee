"""RetirementWorkflow: one durable retirement of one replica (SPEC sections 4 and 7).

The workflow holds one state object (``RetirementState``), feeds every event to the
protocol's decision function (``retirement.protocol.decide``) and carries out the action it
returns (``workflows.steps``); the mirror (``workflows.mirror``) shows the state in the UI
and on the ModelDeployment.  It holds no rule of its own.

One workflow ID per deployment makes Temporal refuse a second start atomically.  Each
polling phase is one heartbeating activity that polls inside itself, so history stays small
whatever a phase lasts.  After an abort the workflow holds with no timer until a retry
token (a fresh attempt, via continue-as-new with fresh budgets and a fresh admission), a
cancel-intent, or a cancellation.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from retirement.models import (
        AbortRequest,
        CancelIntent,
        RetirementRequest,
        RetirementState,
        RetryRequest,
        RetryResult,
    )
    from retirement.protocol import (
        AbortRequested,
        Action,
        Admit,
        Cancelled,
        CarryOn,
        Decision,
        Delete,
        Event,
        Finish,
        Hold,
        IntentCancelled,
        Restore,
        RetryOffered,
        RunPhase,
        StartAttempt,
        Started,
        WaitUntil,
        Woke,
        abort_refusal,
        decide,
    )
    from workflows.mirror import Mirror, initial_search_attributes
    from workflows.steps import Steps

__all__ = ["GUARD_REFRESH_PATCH", "RetirementWorkflow", "initial_search_attributes"]

#: The patch (``workflow.patched``, asked once as a run starts) under which the delete's
#: guard takes the drain's proof again on stale evidence (``decide``'s ``guard_refreshes``):
#: runs recorded before it drain again instead.
GUARD_REFRESH_PATCH = "guard-refreshes-stale-evidence"


@workflow.defn(name="Retirement")
class RetirementWorkflow:
    """Retire one replica (or surplus members) of a ModelDeployment."""

    @workflow.init
    def __init__(self, request: RetirementRequest) -> None:
        if request.resume is not None:  # a long hold, continued as new
            self._s = request.resume.model_copy(
                update={"request": request.model_copy(update={"resume": None})}
            )
        else:
            self._s = RetirementState.begin(
                workflow_id=workflow.info().workflow_id, request=request
            )
        self._mirror = Mirror(already=self._s if request.resume is not None else None)
        self._steps = Steps(state=lambda: self._s, on_cancel=self._on_cancel, mirror=self._mirror)

    # ----------------------------------------------------------------- handlers

    @workflow.query
    def state(self) -> RetirementState:
        """The whole state: phase, target, deadlines, last readings, reasons, attempts."""
        return self._s

    @workflow.update
    def abort(self, request: AbortRequest) -> str:
        """Abort the retirement: the replica is kept and serving again."""
        return self._apply(AbortRequested(at=workflow.now(), reason=request.reason)).reply

    @abort.validator
    def _validate_abort(self, request: AbortRequest) -> None:
        refusal = abort_refusal(self._s)
        if refusal:
            raise ValueError(refusal)

    @workflow.signal(name="abort")
    def abort_signal(self, request: AbortRequest) -> None:
        """The ``abort`` update as a signal, for CLIs that cannot send updates."""
        self._apply(AbortRequested(at=workflow.now(), reason=request.reason))

    @workflow.update
    def retry(self, request: RetryRequest) -> RetryResult:
        """Deliver a retry token; a new token on an aborted retirement starts a fresh attempt."""
        d = self._apply(RetryOffered(at=workflow.now(), token=request.token))
        return RetryResult(decision=str(d.retry), message=d.reply)

    @workflow.signal(name="retry")
    def retry_signal(self, request: RetryRequest) -> None:
        """The ``retry`` update as a signal."""
        self._apply(RetryOffered(at=workflow.now(), token=request.token))

    @workflow.signal
    def cancel_intent(self, request: CancelIntent) -> None:
        """The intent went away: end before the point of no return, capacity retained."""
        self._apply(IntentCancelled(at=workflow.now(), reason=request.reason))

    # ----------------------------------------------------------------- main

    @workflow.run
    async def run(self, request: RetirementRequest) -> RetirementState:
        """Carry out what the protocol decides until it says finish or start afresh."""
        resumed = request.resume is not None
        # Asked once, as the run starts: what this run's delete guard does with stale
        # evidence decides where a drain's answer leads (``decide``'s guard_refreshes).
        self._steps.guard_refreshes = workflow.patched(GUARD_REFRESH_PATCH)
        action = self._apply(
            Woke(at=workflow.now()) if resumed else Started(at=workflow.now())
        ).action
        while True:
            if isinstance(action, Finish):
                return await self._finish(action)
            if isinstance(action, StartAttempt | CarryOn):
                if isinstance(action, StartAttempt):
                    self._s = self._s.recorded(ended_at=workflow.now())
                if await self._flush():
                    # A cancellation arrived while the mirror flushed: it is decided on
                    # (it drops a retry not yet started) before anything continues as new.
                    action = self._apply(self._woke()).action
                    continue
                workflow.continue_as_new(
                    self._s.next_request()
                    if isinstance(action, StartAttempt)
                    else self._s.carried_request()
                )
            assert action is not None, "the protocol always says what to do next"
            event = await self._carry_out(action)
            action = self._apply(event).action

    async def _carry_out(self, action: Action) -> Event:
        if isinstance(action, Admit):
            return await self._steps.admit()
        if isinstance(action, RunPhase):
            return await self._steps.run_phase(action.phase)
        if isinstance(action, WaitUntil):
            return await self._steps.wait_until(action.until)
        if isinstance(action, Delete):
            return await self._steps.delete()
        if isinstance(action, Restore):
            return await self._steps.restore()
        assert isinstance(action, Hold), action
        self._s = self._s.recorded(ended_at=workflow.now())
        return await self._steps.hold(action.recheck_at)

    async def _finish(self, action: Finish) -> RetirementState:
        self._s = self._s.recorded(ended_at=workflow.now())
        self._mirror.show(self._s, clear=action.clear)
        await self._flush()  # a cancellation now finds the retirement ended: ignored
        self._note_mirror_failures()
        return self._s

    async def _flush(self) -> bool:
        """Wait for the mirror's queue; True when a cancellation arrived meanwhile (it was
        fed to the protocol)."""
        cancelled = False

        def on_cancel() -> None:
            nonlocal cancelled
            cancelled = True
            self._on_cancel()

        await self._mirror.flush(on_cancel=on_cancel)
        return cancelled

    def _woke(self) -> Woke:
        return Woke(at=workflow.now(), history_long=workflow.info().is_continue_as_new_suggested())

    # ----------------------------------------------------------------- state

    def _apply(self, event: Event) -> Decision[RetirementState]:
        """Feed ``event`` to the protocol, keep its progress, mirror the change."""
        d = decide(
            self._s,
            event,
            budgets=self._s.request.budgets,
            guard_refreshes=self._steps.guard_refreshes,
        )
        self._s = d.progress.recorded()
        self._note_mirror_failures()
        if not isinstance(d.action, Finish):  # _finish mirrors the final state itself
            self._mirror.show(self._s)
        return d

    def _on_cancel(self) -> None:
        self._apply(Cancelled(at=workflow.now()))

    def _note_mirror_failures(self) -> None:
        if self._mirror.failures:
            failures, self._mirror.failures = self._mirror.failures, []
            self._s = self._s.model_copy(update={"reasons": [*self._s.reasons, *failures]})
