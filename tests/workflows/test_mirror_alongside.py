"""The mirror's snapshots ride along with the phase activities (``Mirror.take``/``back``),
on the time-skipping server with fake activities: every phase change is published once,
in order, with one publish activity for a whole retirement (its last snapshot); what a
phase did not publish goes out by the publish activity before anything later; an abort
while a phase carries snapshots loses none and keeps the order."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from retirement.models import AbortRequest, PhaseInput, RetirementRequest, RetirementState
from retirement.phases import ORDER, Outcome, Phase
from tests.workflows.fakes import FakeWorld, running, start
from workflows.retirement import RetirementWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

ALL = list(ORDER)  # every phase of a retirement that completes


@dataclass
class LeavingWorld(FakeWorld):
    """Phases leave the snapshots of ``unpublished`` to the workflow (a status write that
    took longer than ``END_WAIT_S``), and everything after them in the same phase."""

    unpublished: set[Phase] = field(default_factory=set)

    def _carry(self, inp: PhaseInput) -> int:
        phases = [p.phase for p in inp.mirror]
        cut = next((i for i, p in enumerate(phases) if p in self.unpublished), None)
        if cut is None:
            return super()._carry(inp)
        self.published.extend(inp.mirror[:cut])
        return cut


@pytest.fixture
async def world_worker(
    time_skipping_env: WorkflowEnvironment,
) -> AsyncIterator[tuple[Client, LeavingWorld, str]]:
    world = LeavingWorld()
    async with running(time_skipping_env.client, world) as queue:
        yield time_skipping_env.client, world, queue


def request() -> RetirementRequest:
    return RetirementRequest(
        namespace="ns", deployment=f"md-{uuid.uuid4().hex[:8]}", role="server", ordinal=1
    )


async def activities(handle: WorkflowHandle) -> list[str]:  # type: ignore[type-arg]
    """The activity types the history scheduled, in order."""
    history = await handle.fetch_history()
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def test_a_retirement_publishes_every_phase_once_with_one_publish_activity(
    world_worker: tuple[Client, LeavingWorld, str],
) -> None:
    client, world, queue = world_worker
    handle = await start(client, queue, request())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert [p.phase for p in world.published] == ALL
    assert world.published[-1].clear
    kinds = await activities(handle)
    assert kinds.count("publish") == 1 and kinds[-1] == "publish"


async def test_what_a_phase_did_not_publish_goes_out_first_by_activity(
    world_worker: tuple[Client, LeavingWorld, str],
) -> None:
    """Withdrawing left unpublished by its phase: the publish activity sends it, scheduled
    with the drain; while it runs, later snapshots stay queued behind it (here the fake
    phases are quicker than a publish, so they all go by activity), all in order."""
    client, world, queue = world_worker
    world.unpublished = {Phase.WITHDRAWING}
    handle = await start(client, queue, request())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert [p.phase for p in world.published] == ALL
    kinds = await activities(handle)
    assert kinds.count("publish") >= 2
    assert kinds.index("publish") > kinds.index("withdraw")
    assert "publish" not in kinds[: kinds.index("withdraw")]
    assert not [r for r in st.reasons if r.startswith("publish failed")]


async def test_an_abort_while_a_phase_carries_snapshots_keeps_them_in_order(
    world_worker: tuple[Client, LeavingWorld, str],
) -> None:
    """The withdrawal hangs (carrying its snapshots, which it published) and is aborted:
    the restore's snapshots come after, and the last one shows the abort."""
    client, world, queue = world_worker
    world.behaviour["withdraw"] = "hang"
    handle = await start(client, queue, request())
    await world.started_event("withdraw").wait()
    await handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="operator"))
    for _ in range(200):
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        shown = world.published[-1] if world.published else None
        if st.outcome is Outcome.ABORTED and shown is not None and shown.outcome is st.outcome:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"never held with the abort shown: {world.published}")
    # Whatever the cancelled phase carried may go out twice, never out of order.
    phases = [p.phase for p in world.published]
    assert [k for k, _ in itertools.groupby(phases)] == [
        Phase.ADMITTED,
        Phase.DISQUALIFIED,
        Phase.WITHDRAWING,
        Phase.ABORTED,
    ], phases
