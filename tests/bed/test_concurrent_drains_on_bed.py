"""Many retirements draining at once on one worker, on the real bed.

Each drain read is a ``pods/exec`` through the real API server; with the worker's default
thread pool, dozens of them overlap.  Every retirement must complete, delete only its own
replica, and no ordinary API call of the worker may be hurt by an exec in flight (an exec
that borrowed the shared API client turned every later call into a websocket upgrade).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

import pytest
from kubernetes import client as k8s
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from kube import Kube
from retirement.budgets import Budgets
from retirement.models import RetirementState
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome, Phase
from testbed.bed import Bed
from tests.bed.conftest import create_md
from tests.bed.test_retirement_on_bed import Ctx, pods_of, retire_routerless, scale, until
from tests.helpers import eventually_in_thread, model_deployment
from worker.build import build_worker
from worker.config import parser

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

#: Deployments retired at once (the safety issue asks for at least 20).
N = 24
#: How long each victim's engine stays busy once its retirement has started.
BUSY_S = 10.0


@pytest.fixture
async def fleet(bed: Bed, dev_env: WorkflowEnvironment, namespace: str) -> AsyncIterator[Ctx]:
    """One worker with the product's default thread pool."""
    threads = parser(environ={}).parse_args([]).max_concurrent_activities
    queue = f"fleet-{uuid.uuid4().hex[:8]}"
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
    client_: Client = dev_env.client
    with ThreadPoolExecutor(max_workers=threads) as pool:
        async with build_worker(client_, task_queue=queue, kube=kube, executor=pool):
            yield Ctx(bed=bed, client=client_, queue=queue,
                      core=k8s.CoreV1Api(bed.api_client()), ns=namespace)


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

    await eventually_in_thread(all_serving, what=f"{2 * N} serving pods", timeout=180,
                               ignore=(Exception,))
    victims = {n: pods_of(ctx, n, 1)[0] for n in names}
    keepers = {n: pods_of(ctx, n, 0)[0] for n in names}
    for pod in victims.values():  # busy: two requests in flight on every victim
        hub = op.hub_pod(pod.metadata.uid)
        ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [2, 0]})
    for name in names:  # the spec no longer declares ordinal 1
        scale(ctx, name, 1)
    # Generous budgets: this proves correctness under concurrency on a 2-core bed, not
    # speed (the fleet benchmark measures that).
    budgets = Budgets(overall_s=300, withdrawal_s=60, drain_s=200, settle_s=60,
                      poll_interval_s=1.0)
    handles = await asyncio.gather(*(
        retire_routerless(ctx, n, budgets=budgets, quiet_s=0.5) for n in names))
    await asyncio.sleep(BUSY_S)
    idle_at = time.time()
    for pod in victims.values():
        hub = op.hub_pod(pod.metadata.uid)
        ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
    # Each ends (completed) or holds (aborted: its result never comes): wait for either.
    results: list[RetirementState] = await asyncio.gather(*(
        until(h, lambda st: st.outcome is not Outcome.RUNNING, timeout=400) for h in handles))

    for h, st in zip(handles, results, strict=True):
        if st.outcome is Outcome.ABORTED:
            await h.cancel()  # held: end it (its replica was restored)
    outcomes = {n: st.outcome for n, st in zip(names, results, strict=True)}
    assert all(o is Outcome.COMPLETED for o in outcomes.values()), {
        n: (st.outcome, st.reasons[-3:]) for n, st in zip(names, results, strict=True)
        if st.outcome is not Outcome.COMPLETED}
    drains = [(next(t for p, t in st.phase_timeline if p is Phase.DRAINING),
               next(t for p, t in st.phase_timeline if p is Phase.DELETING)) for st in results]
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
    return list(ctx.core.list_namespaced_pod(
        ctx.ns, label_selector="app.kubernetes.io/name=model-deployment").items)
