"""``FakeTemporal``: the part of ``temporalio.client.Client`` the watcher's reconcile uses,
in memory, for offline tests of ``watcher.reconcile.Reconciler``.

The surface is exactly what the reconcile calls: ``start_workflow`` (one workflow ID per
deployment, so a start while a run of that ID is running raises
``WorkflowAlreadyStartedError``, as Temporal refuses it; a closed ID may start again, as
the default ID-reuse policy allows), and ``get_workflow_handle(id)`` with ``describe``
(an ``RPCError`` NOT_FOUND for an unknown ID), ``query`` (the run's ``RetirementState``),
``signal``, ``execute_update`` and ``result`` (a completed run's ``RetirementState``, of
the run named by ``run_id`` or else the latest).  The ``retry`` update answers with the
product's own rule (``retirement.retry.decide_retry``) over the run's state; the state is
whatever the test puts there (``running``, ``set_state``, ``close``): the workflow itself
is not run.  ``list_workflows`` lists every run its visibility query selects, judged as
the server does for the queries the product sends (``tests.helpers.visibility``).

Any method can be made to fail (``fail``), a hook can act between calls (``on``), and
every call is recorded (``calls``).  Hand it to the reconcile with ``client()``.

Why the client's surface and not ``watcher.retirements.Retirements``'s: the watcher and the
CLI reach Temporal only through ``Retirements``, so a fake of the client puts the
project's own wrapper (its error classification, its one retry of a query refused as
stale, its call counting) under every reconcile test; a fake of the wrapper would have to
imitate that classification and could drift from it.  The surface stays small: only the
client calls ``Retirements`` makes.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from retirement.models import RetirementRequest, RetirementState, RetryResult
from retirement.phases import Outcome
from retirement.retry import RetryDecision, decide_retry
from tests.helpers.visibility import STATUS_NAMES, matches
from workflows.mirror import SA_OUTCOME, SA_PHASE, initial_search_attributes

__all__ = ["FakeHandle", "FakeRun", "FakeTemporal", "TemporalCall", "rpc_error"]

WORKFLOW_TYPE = "Retirement"


def rpc_error(status: RPCStatusCode = RPCStatusCode.UNAVAILABLE, message: str = "") -> RPCError:
    """An ``RPCError`` as the client raises it (``message`` defaults to the status name)."""
    return RPCError(message or status.name.lower(), status, b"")


@dataclass(frozen=True)
class TemporalCall:
    """One recorded call: the method, the workflow ID, and what it carried."""

    method: str  # start_workflow | describe | query | signal | execute_update | result
    workflow_id: str
    name: str = ""  # the workflow run method, query, signal or update called
    arg: Any = None
    options: dict[str, Any] = field(default_factory=dict)  # start_workflow's keywords


@dataclass
class FakeRun:
    """One run of a workflow ID."""

    run_id: str
    state: RetirementState
    status: WorkflowExecutionStatus = WorkflowExecutionStatus.RUNNING
    task_queue: str = ""
    search_attributes: Any = None


@dataclass(frozen=True)
class FakeDescription:
    """What ``describe`` answers (the reconcile reads ``status``)."""

    id: str
    run_id: str
    status: WorkflowExecutionStatus
    task_queue: str


def _fn_name(fn: Any) -> str:
    return str(getattr(fn, "__name__", fn))


class FakeHandle:
    """``get_workflow_handle(id)``: always the latest run of the ID (``result``: the run
    ``run_id`` when given)."""

    def __init__(self, fake: FakeTemporal, workflow_id: str, run_id: str | None = None) -> None:
        self._fake, self.id, self.run_id = fake, workflow_id, run_id

    async def describe(self, **_: Any) -> FakeDescription:
        run = self._fake._enter("describe", self.id)
        return FakeDescription(
            id=self.id, run_id=run.run_id, status=run.status, task_queue=run.task_queue
        )

    async def query(self, query: Any, *args: Any, **_: Any) -> RetirementState:
        run = self._fake._enter("query", self.id, name=_fn_name(query))
        return run.state.model_copy(deep=True)

    async def result(self, **_: Any) -> RetirementState:
        latest = self._fake._enter("result", self.id, arg=self.run_id)
        runs = self._fake.runs[self.id]
        run = next((r for r in runs if r.run_id == self.run_id), latest)
        if run.status is WorkflowExecutionStatus.RUNNING:
            raise NotImplementedError("FakeTemporal does not wait for a running run's result")
        if run.status is not WorkflowExecutionStatus.COMPLETED:
            raise WorkflowFailureError(cause=ApplicationError(f"run {run.status.name}"))
        return run.state.model_copy(deep=True)

    async def signal(self, signal: Any, arg: Any = None, **_: Any) -> None:
        self._fake._enter("signal", self.id, name=_fn_name(signal), arg=arg, running=True)

    async def execute_update(self, update: Any, arg: Any = None, **_: Any) -> Any:
        name = _fn_name(update)
        run = self._fake._enter("execute_update", self.id, name=name, arg=arg, running=True)
        if name != "retry":
            raise NotImplementedError(f"FakeTemporal answers only the retry update, not {name}")
        decision = decide_retry(
            token=arg.token,
            last_consumed=run.state.last_consumed_retry_token,
            aborted=run.state.outcome is Outcome.ABORTED and run.state.retry_token is None,
        )
        if decision is RetryDecision.ACCEPT:
            run.state = run.state.model_copy(update={"retry_token": arg.token})
        return RetryResult(decision=str(decision), message=f"token {arg.token}: {decision}")


@dataclass(frozen=True)
class FakeListed:
    """One entry of a visibility list, with the search attributes Temporal lists: the
    ones the workflow starts with, phase and outcome as it keeps them upserted."""

    id: str
    run_id: str
    typed_search_attributes: TypedSearchAttributes = TypedSearchAttributes.empty
    status: WorkflowExecutionStatus = WorkflowExecutionStatus.RUNNING
    start_time: datetime | None = None


def _listed_attributes(state: RetirementState) -> TypedSearchAttributes:
    """What visibility shows of a run: its start attributes, phase and outcome now."""
    start = initial_search_attributes(state.request)
    now = {SA_PHASE.name: state.phase.value, SA_OUTCOME.name: state.outcome.value}
    return TypedSearchAttributes(
        [
            SearchAttributePair(p.key, now.get(p.key.name, p.value))  # type: ignore[arg-type]
            for p in start.search_attributes
        ]
    )


class FakeTemporal:
    """In-memory workflows by ID (latest run last); see the module docstring."""

    def __init__(self) -> None:
        self.runs: dict[str, list[FakeRun]] = {}
        self.calls: list[TemporalCall] = []
        self.hooks: dict[str, Callable[[TemporalCall], None]] = {}
        self._failures: dict[str, deque[BaseException]] = {}
        self._ids = itertools.count(1)

    def client(self) -> Client:
        """This fake typed as the client the reconcile takes."""
        return cast(Client, self)

    # ------------------------------------------------------------ setting up

    def running(
        self, request: RetirementRequest, *, workflow_id: str | None = None, **state: Any
    ) -> FakeRun:
        """A running run of ``request`` (its ID per deployment unless given), with
        ``state`` fields of ``RetirementState`` set (for example ``outcome``, ``target``)."""
        wid = workflow_id or f"retirement/{request.namespace}/{request.deployment}"
        base = RetirementState.begin(workflow_id=wid, request=request)
        run = FakeRun(run_id=f"run-{next(self._ids)}", state=base.model_copy(update=state))
        self.runs.setdefault(wid, []).append(run)
        return run

    def set_state(self, workflow_id: str, **state: Any) -> None:
        """Change fields of the latest run's state."""
        run = self.latest(workflow_id)
        run.state = run.state.model_copy(update=state)

    def close(
        self,
        workflow_id: str,
        status: WorkflowExecutionStatus = WorkflowExecutionStatus.COMPLETED,
        **state: Any,
    ) -> None:
        """The latest run ends with ``status`` (and ``state`` fields, e.g. its outcome)."""
        self.set_state(workflow_id, **state)
        self.latest(workflow_id).status = status

    def fail(self, method: str, error: BaseException, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error``."""
        self._failures.setdefault(method, deque()).extend([error] * times)

    def on(self, method: str, hook: Callable[[TemporalCall], None]) -> None:
        """Run ``hook`` at every call of ``method``, before it answers (or fails)."""
        self.hooks[method] = hook

    # ------------------------------------------------------------ reading

    def latest(self, workflow_id: str) -> FakeRun:
        """The latest run of ``workflow_id`` (KeyError: none)."""
        return self.runs[workflow_id][-1]

    def called(self, method: str) -> list[TemporalCall]:
        """The recorded calls of ``method``."""
        return [c for c in self.calls if c.method == method]

    # ------------------------------------------------------------ the client surface

    def list_workflows(self, query: str | None = None, **_: Any) -> AsyncIterator[FakeListed]:
        """A visibility list: every run (closed ones too, as the server keeps them) that
        ``query`` selects (``tests.helpers.visibility``: a query it cannot judge raises)."""
        self._record(TemporalCall("list_workflows", "", arg=query))
        listed = []
        for wid, runs in self.runs.items():
            for run in runs:
                attributes = _listed_attributes(run.state)
                fields = {
                    "WorkflowId": wid,
                    "WorkflowType": WORKFLOW_TYPE,
                    "ExecutionStatus": STATUS_NAMES[run.status],
                    **{p.key.name: str(p.value) for p in attributes.search_attributes},
                }
                if matches(query, fields):
                    listed.append(FakeListed(wid, run.run_id, attributes, run.status))

        async def each() -> AsyncIterator[FakeListed]:
            for item in listed:
                yield item

        return each()

    def get_workflow_handle(
        self, workflow_id: str, *, run_id: str | None = None, **_: Any
    ) -> FakeHandle:
        return FakeHandle(self, workflow_id, run_id)

    async def start_workflow(
        self,
        workflow: Any,
        arg: RetirementRequest,
        *,
        id: str,
        task_queue: str,
        search_attributes: Any = None,
        **options: Any,
    ) -> FakeHandle:
        call = TemporalCall(
            "start_workflow",
            id,
            name=_fn_name(workflow),
            arg=arg,
            options={"task_queue": task_queue, "search_attributes": search_attributes, **options},
        )
        self._record(call)
        runs = self.runs.get(id, [])
        if runs and runs[-1].status is WorkflowExecutionStatus.RUNNING:
            raise WorkflowAlreadyStartedError(id, WORKFLOW_TYPE, run_id=runs[-1].run_id)
        run = self.running(arg, workflow_id=id)
        run.task_queue, run.search_attributes = task_queue, search_attributes
        return FakeHandle(self, id)

    # ------------------------------------------------------------ plumbing

    def _record(self, call: TemporalCall) -> None:
        self.calls.append(call)
        hook = self.hooks.get(call.method)
        if hook is not None:
            hook(call)
        queue = self._failures.get(call.method)
        if queue:
            raise queue.popleft()

    def _enter(
        self,
        method: str,
        workflow_id: str,
        *,
        name: str = "",
        arg: Any = None,
        running: bool = False,
    ) -> FakeRun:
        self._record(TemporalCall(method, workflow_id, name=name, arg=arg))
        runs = self.runs.get(workflow_id)
        if not runs:
            raise rpc_error(RPCStatusCode.NOT_FOUND, f"workflow {workflow_id} not found")
        if running and runs[-1].status is not WorkflowExecutionStatus.RUNNING:
            raise rpc_error(RPCStatusCode.NOT_FOUND, "workflow execution already completed")
        return runs[-1]
