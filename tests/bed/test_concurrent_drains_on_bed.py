"""Many retirements draining at once on one worker, on the real bed.

Each drain read is a ``pods/exec`` through the real API server; with the worker's default
thread pool, dozens of them overlap.  Every retirement must complete, delete only its own
replica, and no ordinary API call of the worker may be hurt by an exec in flight (an exec
that borrowed the shared API client turned every later call into a websocket upgrade).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import pytest
from kubernetes import client as k8s
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributeKey
from temporalio.testing import WorkflowEnvironment

from kube import Kube
from retirement.budgets import Budgets
from retirement.models import RetirementState
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome, Phase
from testbed.bed import Bed
from tests.bed.conftest import Ctx, create_md
from tests.bed.support import pods_of, retire_routerless, scale
from tests.helpers import eventually_async, eventually_in_thread, model_deployment
from tests.helpers.retirements import end_retirement
from worker.build import build_worker
from worker.config import WorkerConfig
from workflows.mirror import SA_OUTCOME, SA_PHASE
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

#: Deployments retired at once (the safety issue asks for at least 20).
N = 24
#: How long each victim's engine stays busy once every retirement is draining.
BUSY_S = 5.0


@pytest.fixture
async def fleet(bed: Bed, dev_env: WorkflowEnvironment, namespace: str) -> AsyncIterator[Ctx]:
    """One worker with the product's default thread pool."""
    threads = WorkerConfig.parse([], environ={}).max_concurrent_activities
    queue = f"fleet-{uuid.uuid4().hex[:8]}"
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
    client_: Client = dev_env.client
    with ThreadPoolExecutor(max_workers=threads) as pool:
        async with build_worker(client_, task_queue=queue, kube=kube, executor=pool):
            yield Ctx(
                bed=bed,
                client=client_,
                queue=queue,
                core=k8s.CoreV1Api(bed.api_client()),
                ns=namespace,
            )


#: Phases from Draining on (Aborted included: a retirement that never drained is reported).
DRAINING_OR_LATER = {
    p.value
    for p in (Phase.DRAINING, Phase.DELETING, Phase.SETTLING, Phase.COMPLETED, Phase.ABORTED)
}
#: Outcomes a retirement shows once it ended or holds.
DECIDED = {o.value for o in Outcome if o is not Outcome.RUNNING}


async def reached(
    handle: WorkflowHandle[Any, RetirementState], key: SearchAttributeKey[str], values: set[str]
) -> str:
    """Until the retirement's search attribute ``key`` is one of ``values`` (the server
    answers: no worker involved; queries would load the worker under test)."""

    async def value() -> str | None:
        desc = await handle.describe()
        return desc.typed_search_attributes.get(key)

    result: str = await eventually_async(
        value,
        accept=lambda v: v in values,
        what=f"{handle.id} {key.name} in {values}",
        timeout=400,
        interval=1.0,
    )
    return result


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The largest number of ``spans`` open at one instant."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    best = now = 0
    for _, d in edges:
        now += d
        best = max(best, now)
    return best


async def test_many_drains_at_once_on_one_worker_all_complete(fleet: Ctx) -> None:
    ctx = fleet
    names = [f"f{i:02d}" for i in range(N)]
    for name in names:
        create_md(ctx.bed.api_client(), ctx.ns, model_deployment(name))
    op = ctx.bed.operator(ctx.ns)

    def all_serving() -> bool:
        pods = pods_of_all(ctx)
        return sum(1 for p in pods if (p.metadata.labels or {}).get(LABEL_ELIGIBLE)) == 2 * N

    await eventually_in_thread(
        all_serving, what=f"{2 * N} serving pods", timeout=180, ignore=(Exception,)
    )
    victims = {n: pods_of(ctx, n, 1)[0] for n in names}
    keepers = {n: pods_of(ctx, n, 0)[0] for n in names}
    for pod in victims.values():  # busy: two requests in flight on every victim
        hub = op.hub_pod(pod.metadata.uid)
        ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [2, 0]})
    for name in names:  # the spec no longer declares ordinal 1
        scale(ctx, name, 1)
    # Generous budgets: this proves correctness under concurrency on a 2-core bed, not
    # speed (the fleet benchmark measures that).
    budgets = Budgets(overall_s=300, withdrawal_s=60, drain_s=200, settle_s=60, poll_interval_s=1.0)
    handles = await asyncio.gather(
        *(retire_routerless(ctx, n, budgets=budgets, quiet_s=0.5) for n in names)
    )
    try:
        # Busy until every retirement is draining (each reads in-flight work), or has
        # already aborted (reported below, not waited for), then idle.
        await asyncio.gather(*(reached(h, SA_PHASE, DRAINING_OR_LATER) for h in handles))
        await asyncio.sleep(BUSY_S)
        idle_at = time.time()
        for pod in victims.values():
            hub = op.hub_pod(pod.metadata.uid)
            ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
        # Each ends (completed) or holds (aborted: its result never comes): wait for either.
        await asyncio.gather(*(reached(h, SA_OUTCOME, DECIDED) for h in handles))
        results: list[RetirementState] = [await h.query(RetirementWorkflow.state) for h in handles]
    finally:
        # End whatever still runs or holds, so no activity outlives the test's worker.
        for h in handles:
            with contextlib.suppress(Exception):
                await end_retirement(h, timeout=120)
    failed = "\n".join(
        f"{n}: {st.outcome}: " + " | ".join(st.reasons[-4:])
        for n, st in zip(names, results, strict=True)
        if st.outcome is not Outcome.COMPLETED
    )
    done = sum(st.outcome is Outcome.COMPLETED for st in results)
    assert not failed, f"{done}/{N} completed; the others:\n{failed}"
    drains = [
        (
            next(t for p, t in st.phase_timeline if p is Phase.DRAINING),
            next(t for p, t in st.phase_timeline if p is Phase.DELETING),
        )
        for st in results
    ]
    overlap = most_at_once(drains)
    print(f"\n{N} retirements, at most {overlap} draining at once")
    assert overlap >= 20
    for st in results:  # no delete before the engines went idle
        deleting = next(t for p, t in st.phase_timeline if p is Phase.DELETING)
        assert deleting.timestamp() >= idle_at - 1.0
    for n in names:  # only the victims went; every kept replica still serves
        now = {p.metadata.uid: p for p in pods_of(ctx, n)}
        assert victims[n].metadata.uid not in now
        kept = now[keepers[n].metadata.uid]
        assert (kept.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true"


def pods_of_all(ctx: Ctx) -> list[k8s.V1Pod]:
    return list(
        ctx.core.list_namespaced_pod(
            ctx.ns, label_selector="app.kubernetes.io/name=model-deployment"
        ).items
    )
