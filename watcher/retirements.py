"""The retirements in Temporal, as the project calls them: one small wrapper of the client.

Every Temporal call of the watcher (and of the ``retire`` CLI) goes through
``Retirements``: describe a retirement, read its state (query) or its result, start one,
send it cancel-intent, deliver a retry (update or signal), abort it, and list the running
ones.  Temporal's ``RPCError`` is classified here, once, into the few kinds a caller
decides on (as ``kube.errors`` classifies the Kubernetes API's errors):

- ``WorkflowNotFound``: no such workflow, or the run is already closed (NOT_FOUND);
- ``Unreachable``: Temporal could not answer now (UNAVAILABLE, DEADLINE_EXCEEDED,
  RESOURCE_EXHAUSTED, CANCELLED): worth trying again later (``retryable``);
- ``Refused``: any other status (PERMISSION_DENIED, INVALID_ARGUMENT, ...): a fact a retry
  does not change.

Each keeps the RPC's ``status`` and ``message`` (``str(e)`` is the message, as the
``RPCError``'s was).  One error that is not an RPC's is classified too: a state query the
worker refused because it raced a workflow task (``worker.stale_activations``; the run
was evicted and replays) is asked once more, and if refused again it is
``QueryRefused``, an ``Unreachable`` (ask later), not a fact about the retirement.  A
second start of a running retirement (one workflow ID per deployment) raises
``AlreadyRunning``.  The SDK's other errors (a query or an update that
failed in the worker, a run that did not complete) are not RPC errors: they pass through.

``count`` is told the name of every call made (the watcher's
``retire_watcher_temporal_calls_total{call}``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, ClassVar

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from retirement.models import (
    AbortRequest,
    CancelIntent,
    RetirementRequest,
    RetirementState,
    RetryRequest,
    RetryResult,
)
from retirement.names import STALE_ACTIVATION_REFUSED
from workflows import story
from workflows.retirement import RetirementWorkflow, initial_search_attributes

__all__ = [
    "AlreadyRunning",
    "Described",
    "QueryRefused",
    "Refused",
    "Retirements",
    "TemporalError",
    "Unreachable",
    "WorkflowNotFound",
    "classify",
    "error_name",
    "translated",
]

_UNREACHABLE = frozenset(
    {
        RPCStatusCode.UNAVAILABLE,
        RPCStatusCode.DEADLINE_EXCEEDED,
        RPCStatusCode.RESOURCE_EXHAUSTED,
        RPCStatusCode.CANCELLED,
    }
)


class TemporalError(Exception):
    """A failed Temporal call: its RPC ``status`` and ``message``."""

    #: Whether trying the same call again later can succeed.
    retryable: ClassVar[bool] = False
    #: The name the watcher reports a failed Temporal call by, in its metric label and
    #: its Events (``retire_watcher_reconcile_errors_total{error}``): the client's error
    #: name, as before the classification, so dashboards and alerts keep their series.
    reported_as: ClassVar[str] = "RPCError"

    def __init__(self, message: str, status: RPCStatusCode) -> None:
        super().__init__(message)
        self.message, self.status = message, status


class WorkflowNotFound(TemporalError):
    """NOT_FOUND: no such workflow, or (a signal, an update) its run is closed."""


class Unreachable(TemporalError):
    """Temporal did not answer in time or now: try again later."""

    retryable = True


class QueryRefused(Unreachable):
    """The worker refused the state query twice: it raced a workflow task (the run is
    evicted and replays on its recorded clocks).  Ask again later."""

    reported_as = "QueryRefused"


def stale_refusal(e: WorkflowQueryFailedError) -> bool:
    """Whether the query failed because the worker refused a stale activation."""
    return e.message.startswith(STALE_ACTIVATION_REFUSED)


class Refused(TemporalError):
    """Any other RPC status: the server refused the call as made."""


class AlreadyRunning(Exception):
    """A retirement of the deployment already runs (its workflow ID is taken)."""

    def __init__(self, workflow_id: str) -> None:
        super().__init__(f"a retirement is already running ({workflow_id})")
        self.workflow_id = workflow_id


def classify(e: RPCError) -> TemporalError:
    """The project's kind of the client's ``RPCError``."""
    if e.status is RPCStatusCode.NOT_FOUND:
        return WorkflowNotFound(e.message, e.status)
    if e.status in _UNREACHABLE:
        return Unreachable(e.message, e.status)
    return Refused(e.message, e.status)


def error_name(e: BaseException) -> str:
    """The name an error is reported by in logs, metric labels and Events: a
    ``TemporalError``'s ``reported_as``, else its type's name."""
    return e.reported_as if isinstance(e, TemporalError) else type(e).__name__


@contextmanager
def translated() -> Iterator[None]:
    """Raise the client's ``RPCError`` as the project's ``TemporalError``."""
    try:
        yield
    except RPCError as e:
        raise classify(e) from e


@dataclass(frozen=True)
class Described:
    """What ``describe`` tells of a retirement's latest run."""

    run_id: str
    status: WorkflowExecutionStatus | None

    @property
    def running(self) -> bool:
        return self.status is WorkflowExecutionStatus.RUNNING


def _uncounted(call: str) -> None:
    pass


class Retirements:
    """The project's Temporal calls, over a connected ``Client``."""

    def __init__(self, client: Client, *, count: Callable[[str], None] = _uncounted) -> None:
        self.client, self._count = client, count

    async def describe(self, workflow_id: str) -> Described:
        """The latest run of ``workflow_id`` (``WorkflowNotFound``: none)."""
        self._count("describe")
        with translated():
            desc = await self.client.get_workflow_handle(workflow_id).describe()
        return Described(run_id=desc.run_id, status=desc.status)

    async def state(
        self,
        workflow_id: str,
        *,
        run_id: str | None = None,
        rpc_timeout: timedelta | None = None,
    ) -> RetirementState:
        """The state of the retirement (its latest run, or ``run_id``): the state query."""
        handle = self.client.get_workflow_handle(workflow_id, run_id=run_id)
        for attempt in (1, 2):
            self._count("query")
            try:
                with translated():
                    st: RetirementState = await handle.query(
                        RetirementWorkflow.state, rpc_timeout=rpc_timeout
                    )
                return st
            except WorkflowQueryFailedError as e:
                if not stale_refusal(e):
                    raise
                if attempt == 2:
                    raise QueryRefused(e.message, RPCStatusCode.UNAVAILABLE) from e
        raise AssertionError("unreachable")

    async def result(
        self, workflow_id: str, *, run_id: str | None = None, rpc_timeout: timedelta | None = None
    ) -> RetirementState:
        """The final state of the closed run ``run_id`` (else the latest): its result."""
        self._count("result")
        handle = self.client.get_workflow_handle(
            workflow_id, run_id=run_id, result_type=RetirementState
        )
        with translated():
            final: RetirementState = await handle.result(follow_runs=False, rpc_timeout=rpc_timeout)
        return final

    async def start(self, request: RetirementRequest, *, workflow_id: str, task_queue: str) -> None:
        """Start the retirement of ``request`` (``AlreadyRunning``: one runs)."""
        self._count("start_workflow")
        try:
            with translated():
                await self.client.start_workflow(
                    RetirementWorkflow.run,
                    request,
                    id=workflow_id,
                    task_queue=task_queue,
                    search_attributes=initial_search_attributes(request),
                    static_summary=story.summary(request),
                    static_details=story.details(request),
                )
        except WorkflowAlreadyStartedError as e:
            raise AlreadyRunning(workflow_id) from e

    async def cancel_intent(self, workflow_id: str, reason: str) -> None:
        """Tell the retirement its intent went away (the cancel-intent signal)."""
        self._count("signal")
        with translated():
            await self.client.get_workflow_handle(workflow_id).signal(
                RetirementWorkflow.cancel_intent, CancelIntent(reason=reason)
            )

    async def retry(self, workflow_id: str, request: RetryRequest) -> RetryResult:
        """Deliver a retry token and read the decision (the retry update)."""
        self._count("execute_update")
        with translated():
            res: RetryResult = await self.client.get_workflow_handle(workflow_id).execute_update(
                RetirementWorkflow.retry, request
            )
        return res

    async def retry_signal(self, workflow_id: str, request: RetryRequest) -> None:
        """Deliver a retry token without waiting for the decision (the retry signal)."""
        self._count("signal")
        with translated():
            await self.client.get_workflow_handle(workflow_id).signal(
                RetirementWorkflow.retry_signal, request
            )

    async def abort(self, workflow_id: str, request: AbortRequest) -> Any:
        """Abort the retirement and read the answer (the abort update)."""
        self._count("execute_update")
        with translated():
            return await self.client.get_workflow_handle(workflow_id).execute_update(
                RetirementWorkflow.abort, request
            )

    async def abort_signal(self, workflow_id: str, request: AbortRequest) -> None:
        """Abort the retirement without waiting for the answer (the abort signal)."""
        self._count("signal")
        with translated():
            await self.client.get_workflow_handle(workflow_id).signal(
                RetirementWorkflow.abort_signal, request
            )

    async def each(self, query: str) -> AsyncIterator[Any]:
        """The workflows the visibility ``query`` lists, as the client lists them, one
        page at a time as they are read (a caller that stops early reads no more pages)."""
        self._count("list_workflows")
        with translated():
            async for wf in self.client.list_workflows(query):
                yield wf

    async def listing(self, query: str) -> list[Any]:
        """Every workflow the visibility ``query`` lists (paged)."""
        return [wf async for wf in self.each(query)]
