"""The short steps as local activities (``workflows.retirement.LOCAL_STEPS_PATCH``), on the
time-skipping server with fake activities: admission, disqualification and the last
publish run inside the workflow task that asks for them (a marker each, no activity
events, three workflow tasks fewer per retirement); a local step's own error is an
observation like a remote one's (never a failed workflow); an abort while a local
disqualification hangs cancels it and waits for it to stop before the restore; a
workflows-only worker (no remote activities) runs them."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from retirement.models import AbortRequest, RetirementState
from retirement.phases import Outcome, Phase
from testbed.history_steps import activity_steps
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import (
    COMPLETE_STEPS,
    FakeWorld,
    request,
    running,
    start,
)
from worker.build import workflow_runner
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

Handle = WorkflowHandle[Any, RetirementState]
#: A query the time-skipping server leaves unanswered (it does at times under a flood of
#: them, local steps or not) is given up after this, and asked again.
QUERY_TIMEOUT = timedelta(seconds=2)


async def steps(handle: Handle) -> list[tuple[str, bool]]:
    """(activity type, local) of every activity of the run, in order."""
    history = await handle.fetch_history()
    return [(s.name, s.local) for s in activity_steps(history.events)]


async def workflow_tasks(handle: Handle) -> int:
    history = await handle.fetch_history()
    return sum(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for e in history.events)


async def test_the_short_steps_run_locally_in_five_workflow_tasks(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    handle = await start(client, queue, request())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert await steps(handle) == COMPLETE_STEPS
    # One to start, admit and disqualify; one after each remote activity (withdraw, drain,
    # delete, settle) that also ends the run after settle's: 8 before.
    assert await workflow_tasks(handle) == 5
    assert [p.phase for p in world.published][-1] is Phase.COMPLETED


async def test_a_local_admission_error_is_a_refusal(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.refusal = "raise"
    st: RetirementState = await (await start(client, queue, request())).result()
    assert st.outcome is Outcome.REFUSED
    assert any("admission failed" in r and "422" in r for r in st.reasons), st.reasons


async def test_a_local_disqualify_error_reads_unknown_and_runs_again(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    """Its own error arrives in the workflow unwrapped (not an ``ActivityError``): still an
    UNKNOWN observation with the reason, and the phase runs again."""
    client, world, queue = world_worker
    world.behaviour["disqualify"] = "raise-once"
    handle = await start(client, queue, request())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert world.calls.count("disqualify") == 2
    assert any("disqualify failed" in r and "422" in r for r in st.reasons), st.reasons


async def test_a_failed_last_publish_is_a_reason_and_the_retirement_completes(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["publish"] = "failed"
    st: RetirementState = await (await start(client, queue, request())).result()
    assert st.outcome is Outcome.COMPLETED
    assert any(r.startswith("publish failed") for r in st.reasons), st.reasons


async def test_an_abort_during_a_local_disqualify_waits_for_it_to_stop_then_restores(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    """The abort reaches the workflow on the workflow task's heartbeat (a local activity
    holds the task open); the disqualification is cancelled and waited for before the
    restore puts the label back."""
    client, world, queue = world_worker
    world.behaviour["disqualify"] = "hang"
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event("disqualify").wait(), 10)
    await asyncio.wait_for(
        handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="operator")), 30
    )
    await asyncio.wait_for(world.started_event("restore").wait(), 30)
    assert world.stopped == ["disqualify"]
    assert world.calls.index("restore") > world.calls.index("disqualify")
    for _ in range(200):
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        if st.outcome is Outcome.ABORTED and not st.restoring:
            break
        await asyncio.sleep(0.05)
    assert st.outcome is Outcome.ABORTED and "delete" not in world.calls
    await end_retirement(handle)


async def test_a_workflows_only_worker_runs_the_short_steps(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """``--serve workflows``: no activity task is polled, the local steps run; the remote
    activities run on another worker of the task queue (here: remote ones only)."""
    client = time_skipping_env.client
    local_world, remote_world = FakeWorld(), FakeWorld()
    queue = f"tq-{uuid.uuid4()}"
    with ThreadPoolExecutor(max_workers=4) as pool:
        async with (
            Worker(
                client,
                task_queue=queue,
                workflows=[RetirementWorkflow],
                workflow_runner=workflow_runner(converter=client.data_converter),
                activities=[local_world.admit, local_world.disqualify, local_world.publish],
                activity_executor=pool,
                no_remote_activities=True,
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            ),
            Worker(
                client,
                task_queue=queue,
                activities=remote_world.activities(),
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            ),
        ):
            handle = await start(client, queue, request())
            st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert local_world.calls == ["admit", "disqualify"]
    assert remote_world.calls == ["withdraw", "drain", "delete", "settle"]
    assert [p.phase for p in local_world.published][-1] is Phase.COMPLETED


async def hammer(handle: Handle, stop: asyncio.Event) -> None:
    """Query ``handle`` every 2 ms until ``stop``."""
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a query racing the run's end
            await handle.query(RetirementWorkflow.state, rpc_timeout=QUERY_TIMEOUT)
        await asyncio.sleep(0.002)


async def test_the_histories_of_retirements_queried_throughout_replay(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """Queries while a local step runs may end the workflow task before the workflow has
    seen the step's result (its marker closes the task; the result comes with the next
    one), where a replay hands the result over in the same task.  Nothing the workflow
    asks may depend on which task it runs in: every patch of a local run is asked as the
    run starts.  Twenty retirements (half complete, half abort and hold), each queried
    every few milliseconds from its start, then every history replayed."""
    await queried_then_replayed(time_skipping_env.client)


async def test_the_same_on_the_dev_server(dev_env: WorkflowEnvironment) -> None:
    await queried_then_replayed(dev_env.client)


async def queried_then_replayed(client: Client) -> None:
    """Twenty retirements queried throughout (``hammer``), then each history replayed."""
    world = FakeWorld()
    async with running(client, world) as queue:
        handles = []
        for i in range(20):
            if i % 2:
                world.behaviour["drain"] = "failed"
            else:
                world.behaviour.pop("drain", None)
            handle = await start(client, queue, request())
            handles.append(handle)
            stop = asyncio.Event()
            hammering = asyncio.create_task(hammer(handle, stop))
            ended = False
            for _ in range(400):
                try:
                    st: RetirementState = await handle.query(
                        RetirementWorkflow.state, rpc_timeout=QUERY_TIMEOUT
                    )
                except RPCError:  # the time-skipping server times queries out at times
                    continue
                ended = st.outcome is Outcome.COMPLETED or (
                    st.outcome is Outcome.ABORTED and not st.restoring
                )
                if ended:
                    break
                await asyncio.sleep(0.01)
            stop.set()
            await hammering
            assert ended, f"{handle.id} did not end: {st.phase}/{st.outcome}"
        histories = [await h.fetch_history() for h in handles]
        for h in handles[1::2]:
            await end_retirement(h)
    replayer = Replayer(workflows=[RetirementWorkflow], data_converter=client.data_converter)
    failures = []
    for history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures.append(f"{history.workflow_id}: {result.replay_failure}")
    assert not failures, failures
