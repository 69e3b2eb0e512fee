"""The project's wrapper of the Temporal calls (``watcher.retirements``): ``RPCError``
classified once (not found, unreachable and retryable, refused), the message kept as the
error's text and the name it is reported by kept as before (``RPCError``); a second start
is ``AlreadyRunning``; every call is counted by its client method's name."""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCStatusCode

from retirement.models import RetirementRequest, RetryRequest
from tests.helpers.fake_temporal import FakeTemporal, rpc_error
from watcher.reporting import unreachable
from watcher.retirements import (
    AlreadyRunning,
    QueryRefused,
    Refused,
    Retirements,
    Unreachable,
    WorkflowNotFound,
    classify,
    error_name,
)
from watcher.running import QUERY
from worker.stale_activations import REFUSED

WID = "retirement/ns/md"
REQ = RetirementRequest(namespace="ns", deployment="md", role="server", ordinal=1)


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (RPCStatusCode.NOT_FOUND, WorkflowNotFound, False),
        (RPCStatusCode.UNAVAILABLE, Unreachable, True),
        (RPCStatusCode.DEADLINE_EXCEEDED, Unreachable, True),
        (RPCStatusCode.RESOURCE_EXHAUSTED, Unreachable, True),
        (RPCStatusCode.CANCELLED, Unreachable, True),
        (RPCStatusCode.PERMISSION_DENIED, Refused, False),
        (RPCStatusCode.INVALID_ARGUMENT, Refused, False),
    ],
)
def test_rpc_errors_are_classified_once(
    status: RPCStatusCode, kind: type[Exception], retryable: bool
) -> None:
    e = classify(rpc_error(status, "what the server said"))
    assert type(e) is kind and e.retryable is retryable
    assert (str(e), e.message, e.status) == ("what the server said", "what the server said", status)
    assert error_name(e) == "RPCError"  # the metric label and Events keep their name
    assert error_name(KeyError("x")) == "KeyError"


def world() -> tuple[FakeTemporal, Retirements, list[str]]:
    fake, counted = FakeTemporal(), []
    return fake, Retirements(fake.client(), count=counted.append), counted


async def test_describe_and_signal_of_no_workflow_are_not_found() -> None:
    _, retirements, counted = world()
    with pytest.raises(WorkflowNotFound):
        await retirements.describe(WID)
    with pytest.raises(WorkflowNotFound):
        await retirements.cancel_intent(WID, "gone")
    assert counted == ["describe", "signal"]


async def test_a_second_start_is_already_running_and_a_failure_is_classified() -> None:
    fake, retirements, counted = world()
    await retirements.start(REQ, workflow_id=WID, task_queue="q")
    assert (await retirements.describe(WID)).running
    with pytest.raises(AlreadyRunning):
        await retirements.start(REQ, workflow_id=WID, task_queue="q")
    fake.fail("query", rpc_error(RPCStatusCode.UNAVAILABLE))
    with pytest.raises(Unreachable):
        await retirements.state(WID)
    assert (await retirements.state(WID)).request == REQ
    assert (await retirements.retry(WID, RetryRequest(token="t-1"))).decision
    assert [wf.id for wf in await retirements.listing(QUERY)] == [WID]
    assert counted == [
        "start_workflow",
        "describe",
        "start_workflow",
        "query",
        "query",
        "execute_update",
        "list_workflows",
    ]


async def test_a_query_the_worker_refused_as_stale_is_asked_again() -> None:
    """A state query that raced a workflow task is refused by the worker's guard (the run
    is evicted and replays): asked once more, it is answered."""
    fake, retirements, counted = world()
    await retirements.start(REQ, workflow_id=WID, task_queue="q")
    fake.fail("query", WorkflowQueryFailedError(REFUSED))
    assert (await retirements.state(WID)).request == REQ
    assert counted[-2:] == ["query", "query"]


async def test_a_query_refused_twice_is_unreachable_not_a_fact_about_the_retirement() -> None:
    fake, retirements, _ = world()
    await retirements.start(REQ, workflow_id=WID, task_queue="q")
    fake.fail("query", WorkflowQueryFailedError(REFUSED), times=2)
    with pytest.raises(QueryRefused) as caught:
        await retirements.state(WID)
    e = caught.value
    assert isinstance(e, Unreachable) and e.retryable and unreachable(e)
    assert error_name(e) == "QueryRefused"
    # Any other failure of the query handler is the worker's answer: it passes through.
    fake.fail("query", WorkflowQueryFailedError("boom"))
    with pytest.raises(WorkflowQueryFailedError):
        await retirements.state(WID)
