"""How the workflow carries out each action of the protocol: run one activity (or wait)
and report what happened as an event for ``retirement.protocol.decide``.

Rules of execution, not of the protocol:
- a step that may be interrupted (an abortable phase, admission, a rerun timer) watches
  ``interrupted(state)``; when it turns true the running activity is cancelled, and a
  phase activity is waited for until it has stopped (``WAIT_CANCELLATION_COMPLETED``), so
  nothing it does can land after the restore; admission only reads (``TRY_CANCEL``);
- a workflow cancellation is reported to the protocol (``on_cancel``) and the step goes
  on: an abortable step then sees ``interrupted`` and stops; any other step (the deletes,
  settling, the restore) finishes first;
- an activity error is an observation like any other: UNKNOWN for a phase, a refusal for
  admission, a failed restore; never a crashed workflow;
- queueing never silently eats a budget: a phase activity may wait in the task queue only
  until its phase deadline (ScheduleToStart), and an activity that timed out before it
  ever started (no worker slot free) is reported as such (``failure``), not as a generic
  timeout; one that started late says so itself (``activities.polling.late_start``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from activities import RetirementActivities
    from retirement.models import (
        Admission,
        AdmitInput,
        DeleteResult,
        Observation,
        PhaseInput,
        PublishInput,
        RestoreResult,
        RetirementState,
    )
    from retirement.phases import Phase, Verdict, abortable
    from retirement.protocol import (
        Admitted,
        Answered,
        Deleted,
        Event,
        NotDeleted,
        Refused,
        Restored,
        Woke,
        freshness_bound,
        hold_ends,
        interrupted,
    )
    from workflows.mirror import Mirror
    from workflows.options import (
        ADMIT,
        ADMIT_TIMEOUT,
        BACKSTOP,
        DELETE_SCHEDULE_TIMEOUT,
        DELETE_TIMEOUT,
        GRACE,
        HEARTBEAT,
        PERSISTENT,
        RESTORE_BUDGET,
        RESTORE_SCHEDULE_TIMEOUT,
        RESTORE_TIMEOUT,
        SHORT,
    )
    from workflows.wording import (
        PHASE_ACTIVITY,
        SUMMARY,
        backstop_summary,
        failure,
        hold_summary,
        queue_timeout,
        rerun_summary,
    )


class Steps:
    """Carries out actions for one workflow run.  It reads the run's state through the
    callable it is given and never writes it: what an activity reported goes back inside
    the event, for ``decide`` to record."""

    def __init__(
        self,
        *,
        state: Callable[[], RetirementState],
        on_cancel: Callable[[], None],
        mirror: Mirror,
    ) -> None:
        self._state = state
        self._on_cancel = on_cancel
        #: The phase activities carry the mirror's queued snapshots (``Mirror.take``).
        self._mirror = mirror
        #: This run's delete guard takes stale evidence again (``GUARD_REFRESH_PATCH``,
        #: asked as the run starts): set by the workflow, read by ``delete``.
        self.guard_refreshes = False

    # ------------------------------------------------------------------ actions

    async def admit(self) -> Event:
        """Run admission; an error or exhausted retries is a refusal."""
        s = self._state()
        handle = workflow.start_activity_method(
            RetirementActivities.admit,
            AdmitInput(request=s.request, workflow_id=s.workflow_id),
            start_to_close_timeout=ADMIT_TIMEOUT,
            retry_policy=ADMIT,
            summary=f"bind {s.request.role}:{s.request.ordinal} (reads only)",
        )
        if not await self._until_done(handle, interruptible=True, timeout=None):
            return Woke(at=workflow.now())
        try:
            admission: Admission = handle.result()
        except ActivityError as e:
            return Refused(at=workflow.now(), reason=f"admission failed: {e.cause or e}")
        if admission.target is None:
            return Refused(at=workflow.now(), reason=admission.refusal)
        return Admitted(
            at=workflow.now(),
            restorable=tuple(admission.target.restorable()),
            target=admission.target,
        )

    async def run_phase(self, phase: Phase) -> Event:
        """Run ``phase``'s activity until its verdict, the phase deadline, or (abortable
        phases) an interruption."""
        s = self._state()
        assert s.phase_deadline is not None and s.target is not None
        remaining = s.phase_deadline - workflow.now()
        if remaining <= timedelta(0):
            return Woke(at=workflow.now())
        taken = self._mirror.take()
        handle = workflow.start_activity_method(
            PHASE_ACTIVITY[phase],
            self._phase_input(s.phase_deadline, mirror=taken),
            start_to_close_timeout=remaining + GRACE,
            schedule_to_close_timeout=remaining + GRACE,
            # Not started by the phase deadline: the phase cannot be done, and the reason
            # says why (``failure``) rather than a bare "no verdict by the deadline".
            schedule_to_start_timeout=remaining,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=SHORT,
            summary=SUMMARY[phase],
            # A cancelled phase activity is waited for: one still running could remove a
            # label or a router worker after the restore put it back.
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        try:
            done = await self._until_done(
                handle,
                interruptible=abortable(phase),
                timeout=remaining + GRACE + BACKSTOP,
                timeout_summary=backstop_summary(phase),
            )
        finally:
            self._mirror.back(taken, published=_mirrored(handle))
        now = workflow.now()
        if not done:
            return Woke(at=now)
        try:
            obs: Observation = handle.result()
        except ActivityError as e:
            return Answered(
                at=now,
                phase=phase,
                verdict=Verdict.UNKNOWN,
                reason=failure(PHASE_ACTIVITY[phase].__name__, e),
            )
        return Answered(
            at=now,
            phase=phase,
            verdict=obs.verdict,
            reason=obs.reason,
            polls=obs.polls,
            evidence_at=obs.evidence_at,
            readings=tuple(obs.readings.items()),
            router_removals=tuple(obs.router_removals),
        )

    async def wait_until(self, until: datetime) -> Event:
        """A durable timer that an interruption cuts short."""
        summary = rerun_summary(self._state().phase)
        while True:
            left = until - workflow.now()
            if left <= timedelta(0):
                break
            try:
                await workflow.wait_condition(
                    lambda: interrupted(self._state()), timeout=left, timeout_summary=summary
                )
                break
            except TimeoutError:
                break
            except asyncio.CancelledError:
                self._on_cancel()
        return Woke(at=workflow.now())

    async def delete(self) -> Event:
        """The point of no return, guarded: the activity confirms everything once more
        immediately before its first delete and refuses (``NotDeleted``: nothing touched)
        otherwise; once a delete is sent it runs to its end whatever arrives meanwhile.

        In a run whose guard reads stale evidence again (``guard_refreshes``) it may wait
        in the task queue up to the freshness bound, and is told when the workflow found
        the evidence stale (``read_again``).  Otherwise it may wait there only while the
        drain's evidence is fresh.  One that could not start in time is run once more
        without that bound but told that an earlier one may have begun (a retried attempt
        may have deleted members before its retry waited too long), so it finishes what
        was begun, or, if nothing was, takes the stale evidence again before any delete
        (``activities.refresh``) or refuses."""
        s = self._state()
        assert s.phase_deadline is not None and s.target is not None
        assert s.idle_read_at is not None
        bound = freshness_bound(s.request.budgets)
        fresh_left = bound - (workflow.now() - s.idle_read_at)
        try:
            return await self._delete_once(
                # A guard that reads stale evidence again (``guard_refreshes``) may start
                # up to the freshness bound late, however stale the evidence is now: an
                # abort that arrives meanwhile is refused (Deleting), so that wait stays
                # bounded as it was.
                schedule_to_start=bound
                if self.guard_refreshes
                else max(fresh_left, timedelta(seconds=1)),
                may_have_begun=False,
                read_again=fresh_left <= timedelta(0),
            )
        except ActivityError as e:
            if not queue_timeout(e):
                # A non-retryable error (Invalid: the server refuses the request),
                # or retries that ran out (the API server down, RBAC without delete, for
                # ``DELETE_SCHEDULE_TIMEOUT``): the deletes cannot finish now; what was
                # deleted is in the error, and status.retirement stays for a person.
                return Deleted(at=workflow.now(), ok=False, reason=str(e.cause or e))
        try:
            return await self._delete_once(
                schedule_to_start=None,
                may_have_begun=True,
                read_again=workflow.now() - s.idle_read_at > bound,
            )
        except ActivityError as e:
            return Deleted(at=workflow.now(), ok=False, reason=str(e.cause or e))

    async def _delete_once(
        self, *, schedule_to_start: timedelta | None, may_have_begun: bool, read_again: bool
    ) -> Event:
        s = self._state()
        assert s.phase_deadline is not None
        taken = self._mirror.take()
        inp = self._phase_input(s.phase_deadline, mirror=taken).model_copy(
            update={
                "evidence_at": s.idle_read_at,
                "fresh_s": freshness_bound(s.request.budgets).total_seconds(),
                "delete_may_have_begun": may_have_begun,
                "read_again": read_again,
            }
        )
        handle = workflow.start_activity_method(
            RetirementActivities.delete,
            inp,
            start_to_close_timeout=DELETE_TIMEOUT,
            schedule_to_close_timeout=DELETE_SCHEDULE_TIMEOUT,
            schedule_to_start_timeout=schedule_to_start,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=PERSISTENT,
            summary="confirm once more, then delete the admitted Pods (UID preconditions) "
            "and their own Workload",
        )
        try:
            await self._until_done(handle, interruptible=False, timeout=None)
        finally:
            self._mirror.back(taken, published=_mirrored(handle))
        result: DeleteResult = handle.result()
        if result.refused is not None:
            return NotDeleted(
                at=workflow.now(), verdict=result.refused.verdict, reason=result.refused.reason
            )
        note = f"replaced, not touched: {', '.join(result.replaced)}" if result.replaced else ""
        return Deleted(at=workflow.now(), reason=note, result=result)

    async def restore(self) -> Event:
        """Put the replica back in service; runs to its end whatever arrives meanwhile.
        What it did not confirm back stays to do (``decide`` counts the restorable members
        from admission, so an attempt that did nothing is never read as success)."""
        s = self._state()
        if s.target is None:
            return Restored(at=workflow.now(), result=RestoreResult())
        handle = workflow.start_activity_method(
            RetirementActivities.restore,
            self._phase_input(workflow.now() + RESTORE_BUDGET),
            start_to_close_timeout=RESTORE_TIMEOUT,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=SHORT,
            schedule_to_close_timeout=RESTORE_SCHEDULE_TIMEOUT,
            summary="put the eligibility label and the routers' selection back on members "
            "that still qualify",
        )
        await self._until_done(handle, interruptible=False, timeout=None)
        try:
            restored: RestoreResult = handle.result()
        except ActivityError as e:
            return Restored(
                at=workflow.now(),
                reason=failure("restore", e),
                result=RestoreResult(failed={"*": str(e.cause or e)}),
            )
        return Restored(
            at=workflow.now(),
            held=tuple(sorted(restored.held.items())),
            restored=tuple(restored.restored),
            gone=tuple(sorted(restored.failed)),
            timed=restored.timed,
            result=restored,
        )

    async def hold(self, recheck_at: datetime | None) -> Event:
        """Held until something ends the hold, or until ``recheck_at`` (members still to
        put back); with nothing to recheck there is no timer at all."""
        summary = hold_summary(self._state())
        while True:
            timeout = None if recheck_at is None else max(recheck_at - workflow.now(), timedelta(0))
            try:
                await workflow.wait_condition(
                    lambda: hold_ends(self._state()), timeout=timeout, timeout_summary=summary
                )
            except asyncio.CancelledError:
                self._on_cancel()
                continue
            except TimeoutError:
                pass
            return Woke(
                at=workflow.now(), history_long=workflow.info().is_continue_as_new_suggested()
            )

    # ------------------------------------------------------------------ helpers

    def _phase_input(
        self, deadline: datetime, *, mirror: list[PublishInput] | None = None
    ) -> PhaseInput:
        s = self._state()
        assert s.target is not None
        return PhaseInput(
            mirror=mirror or [],
            target=s.target,
            deadline=deadline,
            poll_interval_s=s.request.budgets.poll_interval_s,
            routerless_policy=s.request.routerless_policy,
            quiet_window_s=s.request.quiet_window_s,
            router_removals=list(s.router_removals),
        )

    async def _until_done(
        self,
        handle: workflow.ActivityHandle[Any],
        *,
        interruptible: bool,
        timeout: timedelta | None,
        timeout_summary: str | None = None,
    ) -> bool:
        """Wait for ``handle``; True when it finished by itself.  False when it was
        cancelled (an interruption, or ``timeout``) and has stopped."""
        while True:
            try:
                await workflow.wait_condition(
                    lambda: handle.done() or (interruptible and interrupted(self._state())),
                    timeout=timeout,
                    timeout_summary=timeout_summary,
                )
            except asyncio.CancelledError:
                self._on_cancel()
                continue
            except TimeoutError:
                pass
            break
        if handle.done():
            return True
        handle.cancel()
        while not handle.done():
            try:
                await workflow.wait_condition(handle.done)
            except asyncio.CancelledError:
                self._on_cancel()
        return False


def _mirrored(handle: workflow.ActivityHandle[Any]) -> int:
    """How many carried snapshots a phase activity published: its result says so; one
    that failed, was cancelled, or has not ended counts none."""
    if not handle.done() or handle.cancelled() or handle.exception() is not None:
        return 0
    return int(getattr(handle.result(), "mirrored", 0))
