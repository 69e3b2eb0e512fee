"""Histories of retirements disturbed from their first milliseconds replay as they ran.

A worker replays a retirement's history whenever it takes its next workflow task without
it cached (a restart, an eviction, a query); a history that does not replay wedges the
retirement (TMPRL1100).  Histories recorded on the quiet paths prove little about the
races, so here retirements are queried every 2 ms from their start, and sent an abort
(update or signal) or a cancel-intent a few milliseconds in, then every history is
replayed.  These tests caught admission and disqualification as local activities
(reverted, docs/benchmarks.md): a signal that arrives while a local step runs reaches
the workflow before the step's result live and after it on replay."""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from datetime import timedelta
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from retirement.models import AbortRequest, CancelIntent, RetirementRequest, RetirementState
from retirement.phases import Outcome
from tests.helpers.retirements import ENDED, end_retirement
from tests.workflows.fakes import FakeWorld, running, start
from workflows.retirement import RetirementWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

Handle = WorkflowHandle[Any, RetirementState]
#: A query the time-skipping server leaves unanswered (it does at times under a flood of
#: them) is given up after this, and asked again.
QUERY_TIMEOUT = timedelta(seconds=2)


def request() -> RetirementRequest:
    return RetirementRequest(
        namespace="ns", deployment=f"md-{uuid.uuid4().hex[:8]}", role="server", ordinal=1
    )


async def hammer(handle: Handle, stop: asyncio.Event) -> None:
    """Query ``handle`` every 2 ms until ``stop``."""
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a query racing the run's end
            await handle.query(RetirementWorkflow.state, rpc_timeout=QUERY_TIMEOUT)
        await asyncio.sleep(0.002)


async def settled_state(handle: Handle) -> RetirementState:
    """Query until the retirement has ended or holds (aborted, its restore done)."""
    for _ in range(3000):
        with contextlib.suppress(RPCError):
            st: RetirementState = await handle.query(
                RetirementWorkflow.state, rpc_timeout=QUERY_TIMEOUT
            )
            if st.outcome in ENDED or (st.outcome is Outcome.ABORTED and not st.restoring):
                return st
        await asyncio.sleep(0.01)
    raise AssertionError(f"{handle.id} neither ended nor held")


async def replay_failures(client: Client, histories: list[WorkflowHistory]) -> list[str]:
    replayer = Replayer(workflows=[RetirementWorkflow], data_converter=client.data_converter)
    failures = []
    for history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        if result.replay_failure is not None:
            failures.append(f"{history.workflow_id}: {result.replay_failure}")
    return failures


async def queried_then_replayed(client: Client) -> None:
    """Twenty retirements (half complete, half abort on a failed drain and hold), each
    queried every 2 ms from its start; then every history replays."""
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
            st = await settled_state(handle)
            stop.set()
            await hammering
            assert st.outcome in (Outcome.COMPLETED, Outcome.ABORTED), st.outcome
        histories = [await h.fetch_history() for h in handles]
        for h in handles[1::2]:
            await end_retirement(h)
    assert not await replay_failures(client, histories)


async def test_retirements_queried_throughout_replay(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    await queried_then_replayed(time_skipping_env.client)


async def test_retirements_queried_throughout_replay_on_the_dev_server(
    dev_env: WorkflowEnvironment,
) -> None:
    await queried_then_replayed(dev_env.client)


async def test_aborts_and_cancel_intents_in_the_first_milliseconds_replay(
    dev_env: WorkflowEnvironment,
) -> None:
    """An abort (update or signal) or a cancel-intent sent 0-50 ms into a retirement,
    under a flood of queries: each run ends or holds and its history replays.  Twenty
    retirements, the moments and the kinds drawn from a fixed seed; on the dev server
    (the time-skipping server leaves a workflow task whose completion it refused, a cancel
    of an activity that had just completed, unretried: measured)."""
    client = dev_env.client
    world = FakeWorld()
    rng = random.Random(18)
    async with running(client, world) as queue:
        handles = []
        for _ in range(20):
            handle = await start(client, queue, request())
            handles.append(handle)
            stop = asyncio.Event()
            hammering = asyncio.create_task(hammer(handle, stop))
            await asyncio.sleep(rng.uniform(0.0, 0.05))
            kind = rng.choice(["abort-update", "abort-signal", "cancel-intent"])
            with contextlib.suppress(Exception):  # refused: past the point of no return
                if kind == "abort-update":
                    await handle.execute_update(
                        RetirementWorkflow.abort, AbortRequest(reason="fuzz")
                    )
                elif kind == "abort-signal":
                    await handle.signal(
                        RetirementWorkflow.abort_signal, AbortRequest(reason="fuzz")
                    )
                else:
                    await handle.signal(
                        RetirementWorkflow.cancel_intent, CancelIntent(reason="fuzz")
                    )
            st = await settled_state(handle)
            stop.set()
            await hammering
            if st.outcome is Outcome.ABORTED:
                await end_retirement(handle)
        histories = [await h.fetch_history() for h in handles]
    assert not await replay_failures(client, histories)
