"""Queueing never silently eats a phase's budget (issue 9): on the time-skipping test server
and on the dev server, a worker whose only activity slot is taken cannot start the drain
activity; the drain ends at its deadline and the reason says it could not start in time.

The test server does not skip time while an activity is scheduled or running, so these
run in real time, with a short drain budget.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from retirement.budgets import Budgets
from retirement.models import PhaseInput, PublishInput, RetirementRequest, RetirementState
from retirement.phases import Outcome, Phase
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import FakeWorld, running
from workflows.retirement import RetirementWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Longer than the 5 s wait before an UNKNOWN phase runs again (see the test).
DRAIN_S = 8.0


@dataclass
class SaturatedWorld(FakeWorld):
    """The fake world, with a status subresource that hangs on the Draining snapshot until
    ``gate`` is set: the drain that carries it leaves it unpublished (as
    ``activities.alongside`` does after ``END_WAIT_S``), and the publish activity that
    gets it holds the worker's only activity slot meanwhile."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def _carry(self, inp: PhaseInput) -> int:
        phases = [p.phase for p in inp.mirror]
        if Phase.DRAINING not in phases:
            return super()._carry(inp)
        first = phases.index(Phase.DRAINING)
        self.published.extend(inp.mirror[:first])
        return first

    @activity.defn(name="publish")
    async def publish(self, inp: PublishInput) -> None:
        if inp.phase is Phase.DRAINING:
            self.calls.append("publish hangs")
            await self.gate.wait()
        await FakeWorld.publish(self, inp)


@asynccontextmanager
async def saturated(env: WorkflowEnvironment) -> AsyncIterator[tuple[Client, SaturatedWorld, str]]:
    """A worker with one activity slot on ``env``'s server."""
    world = SaturatedWorld()
    try:
        async with running(env.client, world, max_concurrent_activities=1) as queue:
            yield env.client, world, queue
    finally:
        world.gate.set()


async def until(
    handle: WorkflowHandle,  # type: ignore[type-arg]
    done: Callable[[RetirementState], bool],
    *,
    timeout: float = 30.0,
) -> RetirementState:
    """Query until ``done(state)``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        if done(st):
            return st
        if loop.time() > end:
            raise AssertionError(f"still {st.phase}/{st.outcome}: {st.reasons}")
        await asyncio.sleep(0.1)


async def test_a_phase_activity_that_cannot_start_says_so(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """The test server marks the never-started attempt with started event ID -1."""
    async with saturated(time_skipping_env) as (client, world, queue):
        await cannot_start(client, world, queue)


async def test_a_phase_activity_that_cannot_start_says_so_on_the_real_server(
    dev_env: WorkflowEnvironment,
) -> None:
    """The real server marks the never-started attempt with event ID 0 (the test server,
    -1): the reason is the same."""
    async with saturated(dev_env) as (client, world, queue):
        await cannot_start(client, world, queue)


async def cannot_start(client: Client, world: SaturatedWorld, queue: str) -> None:
    """The Draining snapshot's publish takes the only slot once the first drain run, which
    carried it and left it unpublished, answered UNKNOWN (a busy engine): the rerun 5 s
    later finds the slot taken and waits in the queue until the deadline."""
    world.behaviour["drain"] = "unknown"
    req = RetirementRequest(
        namespace="ns",
        deployment=f"md-{uuid.uuid4().hex[:8]}",
        role="server",
        ordinal=1,
        budgets=Budgets(overall_s=60, withdrawal_s=30, drain_s=DRAIN_S, settle_s=30),
    )
    handle = await client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=f"retirement/{req.namespace}/{req.deployment}",
        task_queue=queue,
        result_type=RetirementState,
    )
    await until(handle, lambda st: st.phase is Phase.ABORTED)
    assert "publish hangs" in world.calls
    world.gate.set()  # the slot frees: the restore can run
    st = await until(handle, lambda st: st.outcome is Outcome.ABORTED)
    why = [r for r in st.reasons if r.startswith("aborted in Draining")]
    assert why == [
        "aborted in Draining: drain budget exhausted: drain could not start in time: it "
        "waited in the task queue until its ScheduleToStart timeout (no worker slot free)"
    ], st.reasons
    # The phase still ended at its deadline: the wait in the queue took no extra time.
    entered = next(t for p, t in st.phase_timeline if p is Phase.DRAINING)
    left = next(t for p, t in st.phase_timeline if p is Phase.ABORTED)
    assert DRAIN_S <= (left - entered).total_seconds() <= DRAIN_S + 3
    assert "delete" not in world.calls and "restore" in world.calls
    await end_retirement(handle)  # held: end it while the worker runs, no activity behind
