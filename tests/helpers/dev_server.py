"""Retirements on the real dev server with fake activities: the ``running`` fixture (a
worker of ``RetirementWorkflow`` over ``tests/workflows/fakes.py``'s ``FakeWorld`` on a
fresh task queue), a retirement started on it as the watcher would (``start``), and a
query until it reaches a phase (``until``). Shared by the dev-server tests of
``tests/workflows``."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from retirement.models import RetirementRequest, RetirementState, workflow_id_for
from retirement.phases import Outcome, Phase
from tests.helpers import eventually_async
from tests.workflows.fakes import FakeWorld
from worker.build import workflow_runner
from workflows import story
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow, initial_search_attributes


@pytest.fixture
async def running(dev_env: WorkflowEnvironment) -> AsyncIterator[tuple[Client, FakeWorld, str]]:
    world = FakeWorld()
    queue = f"tq-{uuid.uuid4().hex[:8]}"
    async with Worker(
        dev_env.client,
        task_queue=queue,
        workflows=[RetirementWorkflow],
        workflow_runner=workflow_runner(converter=dev_env.client.data_converter),
        activities=world.activities(),
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    ):
        yield dev_env.client, world, queue


async def start(client: Client, queue: str, **kw: Any) -> WorkflowHandle[Any, RetirementState]:
    req = RetirementRequest(
        namespace="ops", deployment=f"md-{uuid.uuid4().hex[:6]}", role="server", ordinal=1, **kw
    )
    return await client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=workflow_id_for(namespace="ops", deployment=req.deployment),
        task_queue=queue,
        result_type=RetirementState,
        search_attributes=initial_search_attributes(req),
        static_summary=story.summary(req),
        static_details=story.details(req),
    )


async def until(
    handle: WorkflowHandle[Any, RetirementState], phase: Phase, outcome: Outcome | None = None
) -> RetirementState:
    """Query the retirement until it is in ``phase`` (with ``outcome``, when given)."""
    return await eventually_async(
        lambda: handle.query(RetirementWorkflow.state),
        accept=lambda st: st.phase is phase and (outcome is None or st.outcome is outcome),
        what=f"retirement in {phase} {outcome or ''}",
        timeout=15,
        interval=0.05,
    )
