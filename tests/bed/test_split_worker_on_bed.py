"""The worker split in two processes on one task queue (``python -m worker --serve
workflows`` without any kubeconfig, and ``--serve activities``): a retirement behind the
real SGLang gateway completes; every workflow task ran in the first process and every
activity in the second (the histories' worker identities); killing the activities process
mid-retirement and starting another one still completes it, deleting only the victim."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from kubernetes import client
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from retirement.models import RetirementState
from retirement.phases import Outcome, Phase
from testbed.bed import Bed
from testbed.procs import Child
from testbed.worker_process import start_worker_process
from tests.bed.conftest import Ctx
from tests.bed.support import deploy, one_request, pods_of, retire, until
from tests.helpers import eventually_in_thread
from worker.build import Serves

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]


@pytest.fixture
def split_ctx(bed: Bed, dev_env: WorkflowEnvironment, namespace: str) -> Iterator[Ctx]:
    """A task queue served by no worker of this process (the test starts the processes)."""
    yield Ctx(
        bed=bed,
        client=dev_env.client,
        queue=f"split-{uuid.uuid4().hex[:8]}",
        core=client.CoreV1Api(bed.api_client()),
        ns=namespace,
    )


@pytest.fixture
async def processes(split_ctx: Ctx) -> AsyncIterator[dict[Serves, Child]]:
    target = split_ctx.client.service_client.config.target_host
    started: dict[Serves, Child] = {}
    try:
        for serves in (Serves.WORKFLOWS, Serves.ACTIVITIES):
            started[serves] = await asyncio.to_thread(
                start_worker_process,
                split_ctx.bed,
                target=target,
                queue=split_ctx.queue,
                tag=f"{split_ctx.queue}-{serves.value}",
                serves=serves,
            )
        yield started
    finally:
        for child in started.values():
            child.stop(timeout=10)


async def identities(handle: WorkflowHandle[Any, RetirementState]) -> dict[str, set[str]]:
    """The worker identities that started the workflow tasks and the activities."""
    found: dict[str, set[str]] = {"workflow": set(), "activity": set()}
    async for ev in handle.fetch_history_events():
        if ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            found["workflow"].add(ev.workflow_task_started_event_attributes.identity)
        elif ev.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            found["activity"].add(ev.activity_task_started_event_attributes.identity)
    return found


def pid_of(identity: str) -> int:
    return int(identity.split("@", 1)[0])


async def test_workflows_and_activities_in_two_processes_complete_a_retirement(
    split_ctx: Ctx, processes: dict[Serves, Child]
) -> None:
    ctx = split_ctx
    await deploy(ctx, "split")
    victim = pods_of(ctx, "split", 1)[0].metadata.name
    keep = {p.metadata.uid for p in pods_of(ctx, "split", 0)}
    handle = await retire(ctx, "split", 1)
    st = await asyncio.wait_for(handle.result(), 120)
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert st.deleted is not None and st.deleted.deleted == [victim]
    assert {p.metadata.uid for p in pods_of(ctx, "split", 0)} == keep
    seen = await identities(handle)
    assert {pid_of(i) for i in seen["workflow"]} == {processes[Serves.WORKFLOWS].pid}
    assert {pid_of(i) for i in seen["activity"]} == {processes[Serves.ACTIVITIES].pid}


async def test_the_activities_process_killed_mid_drain_and_replaced_still_completes(
    split_ctx: Ctx, processes: dict[Serves, Child]
) -> None:
    ctx = split_ctx
    await deploy(ctx, "split-kill", request_seconds=8.0)
    victim = pods_of(ctx, "split-kill", 1)[0]
    keep = {p.metadata.uid for p in pods_of(ctx, "split-kill", 0)}
    busy = asyncio.create_task(asyncio.to_thread(one_request, victim.status.pod_ip))
    await asyncio.sleep(0.5)  # the request is in the engine: the drain must wait for it
    handle = await retire(ctx, "split-kill", 1)
    await until(handle, lambda s: s.phase is Phase.DRAINING, timeout=60)
    processes[Serves.ACTIVITIES].kill()
    await asyncio.sleep(2)
    assert victim.metadata.name in {p.metadata.name for p in pods_of(ctx, "split-kill", 1)}
    replacement = await asyncio.to_thread(
        start_worker_process,
        ctx.bed,
        target=ctx.client.service_client.config.target_host,
        queue=ctx.queue,
        tag=f"{ctx.queue}-activities-2",
        serves=Serves.ACTIVITIES,
    )
    processes[Serves.ACTIVITIES] = replacement  # stopped by the fixture
    st = await asyncio.wait_for(handle.result(), 150)
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert st.deleted is not None and st.deleted.deleted == [victim.metadata.name]
    status, _ = await busy
    assert status == 200  # the in-flight request finished before the Pod was deleted
    await eventually_in_thread(
        lambda: not pods_of(ctx, "split-kill", 1), what="victim gone", timeout=20
    )
    assert {p.metadata.uid for p in pods_of(ctx, "split-kill", 0)} == keep
