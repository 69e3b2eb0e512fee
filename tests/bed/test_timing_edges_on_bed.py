"""The timing edges on the real bed (SPEC sections 4, 6, 7): what a person or the world
does at the wrong moment, judged by what the real servers say (the Pod and its UID in
the API server, the eligibility label, the real SGLang gateway's own worker list), not by
the product's view of itself.

- the kube-apiserver stalled (SIGSTOP) when a retirement aborts, until 45 s after its
  restore was scheduled: the restore's attempts fail, then start after their deadline;
  the retirement must never say every member is back while the gateway does not select
  the replica, and must put it back once the API server returns;
- a UI "Request Cancellation" with the watcher running: the retirement aborts and holds,
  the replica keeps its label and the gateway's selection for a minute, and the watcher
  does not start the same intent again;
- the label put back by a person between the drain's last round and the delete: the
  delete's last guard keeps the replica;
- the drain's answer decided on a minute late (a workflow task in a fleet's herd): the
  delete's guard reads the real engine again through ``pods/exec`` before it deletes,
  and keeps the replica while the engine reads busy.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import httpx
import pytest
from temporalio import activity
from temporalio.worker import Worker

from activities import Kube, RetirementActivities
from retirement.budgets import Budgets
from retirement.models import (
    AbortRequest,
    Observation,
    PhaseInput,
    RetirementState,
    workflow_id_for,
)
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome, Phase, Verdict
from tests.bed.conftest import Ctx
from tests.bed.support import (
    WatchCtx,
    deploy,
    finish,
    pods_of,
    retire,
    runs,
    scale,
    state,
    until,
    wait_state,
    wctx,
)
from tests.helpers import eventually_async, eventually_in_thread
from worker.build import workflow_runner
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

__all__ = ["wctx"]  # the watcher tests' fixture: a worker, and watchers on demand

#: How long the API server stays stalled after the restore was scheduled: past the
#: restore's own deadline (``workflows.options.RESTORE_BUDGET``, 30 s).
RESTORE_STALL_S = 45.0
LONG = Budgets(overall_s=240, withdrawal_s=30, drain_s=180, settle_s=20, poll_interval_s=0.5)


def gateway_urls(router: str) -> set[str]:
    """What the real SGLang gateway routes to, read from the gateway itself."""
    with httpx.Client(trust_env=False, timeout=5) as http:
        return {w["url"] for w in http.get(router + "/workers").json()["workers"]}


def url_of(pod: Any) -> str:
    return f"http://{pod.status.pod_ip}:8000"


def label_of(ctx: Ctx, pod: Any) -> str | None:
    live = ctx.core.read_namespaced_pod(pod.metadata.name, ctx.ns)
    assert live.metadata.uid == pod.metadata.uid, "the replica was deleted or replaced"
    labels: dict[str, str] = live.metadata.labels or {}
    return labels.get(LABEL_ELIGIBLE)


async def busy_victim(ctx: Ctx, name: str) -> tuple[str, Any]:
    """A two-replica vLLM deployment behind the real SGLang gateway (0.3.2: its discovery
    never re-adds a relabelled worker, so the restore must ask and read it back), whose
    ordinal-1 engine reads one request running (its drain holds)."""
    router = await deploy(ctx, name)
    assert router is not None
    victim = pods_of(ctx, name, 1)[0]
    await eventually_in_thread(
        lambda: url_of(victim) in gateway_urls(router), what="gateway selects the victim"
    )
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})
    return router, victim


def apiserver_pid(ctx: Ctx) -> int:
    [child] = [c for c in ctx.bed.cp.children if c.name == "kube-apiserver"]
    return int(child.proc.pid)


async def test_api_server_stalled_through_an_abort_never_reads_as_every_member_back(
    ctx: Ctx,
) -> None:
    name = "stall"
    router, victim = await busy_victim(ctx, name)
    handle = await retire(ctx, name, 1, budgets=LONG)
    await wait_state(handle, Phase.DRAINING)
    assert url_of(victim) not in await asyncio.to_thread(gateway_urls, router)
    pid = apiserver_pid(ctx)
    os.kill(pid, signal.SIGSTOP)
    stalled_at = time.monotonic()
    lies: list[str] = []
    restoring_at: float | None = None
    try:
        await handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="oncall"))
        # The stall lasts until the restore has been scheduled and then longer than its
        # 30 s deadline, so attempts start past it (the defect: such an attempt did
        # nothing and read as every member back).  Meanwhile and after: whenever the
        # retirement says it holds with nothing left to put back, the gateway must
        # select the replica.
        while restoring_at is None or time.monotonic() - restoring_at < RESTORE_STALL_S:
            st: RetirementState = await handle.query(RetirementWorkflow.state)
            if restoring_at is None and st.restoring:
                restoring_at = time.monotonic()
            if settled(st):
                lies.append(f"{time.monotonic() - stalled_at:.0f} s: {st.reasons[-1]}")
            assert time.monotonic() - stalled_at < 120, "the restore never began"
            await asyncio.sleep(0.5)
    finally:
        os.kill(pid, signal.SIGCONT)
    print(f"\nAPI server stalled {time.monotonic() - stalled_at:.0f} s")
    returned_at = time.monotonic()
    back = False
    while time.monotonic() - returned_at < 150:
        st = await handle.query(RetirementWorkflow.state)
        selected = url_of(victim) in await asyncio.to_thread(gateway_urls, router)
        if settled(st) and not selected:
            lies.append(f"+{time.monotonic() - returned_at:.0f} s: {st.reasons[-1]}")
        if settled(st) and selected:
            back = True
            break
        await asyncio.sleep(0.5)
    assert not lies, f"said every member back while the gateway did not select it: {lies}"
    assert back, f"not back {time.monotonic() - returned_at:.0f} s after the API server: {st}"
    assert await asyncio.to_thread(label_of, ctx, victim) == "true"
    assert st.deleted is None and st.outcome is Outcome.ABORTED
    print(f"\nback in service {time.monotonic() - returned_at:.1f} s after the API server")
    await finish(handle)


def settled(st: RetirementState) -> bool:
    """The retirement holds and says every member is back (nothing left to re-read)."""
    return (
        st.outcome is Outcome.ABORTED
        and not st.restoring
        and not st.unrestored
        and not st.confirm_at
        and st.restored is not None
    )


async def test_a_ui_cancel_with_the_watcher_running_keeps_the_replica_serving(
    wctx: WatchCtx,
) -> None:
    """The UI's "Request Cancellation" on a running retirement: it aborts and holds; the
    watcher, which derives the same intent from the spec all along, never starts it again,
    so the replica keeps its label and the gateway's selection."""
    name = "uicancel"
    router, victim = await busy_victim(wctx, name)
    wctx.watcher("--budgets", LONG.model_dump_json())
    await asyncio.to_thread(scale, wctx, name, 1)
    st = await eventually_async(
        lambda: state(wctx, name),
        accept=lambda s: s.phase is Phase.DRAINING,
        what="the watcher's retirement draining",
        timeout=60,
        ignore=(Exception,),
    )
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)
    handle = wctx.client.get_workflow_handle(wid)
    run_id = (await handle.describe()).run_id
    await handle.cancel()
    await eventually_async(
        lambda: state(wctx, name),
        accept=settled,
        what="aborted, held, every member back",
        timeout=60,
    )
    watched_from = time.monotonic()
    while time.monotonic() - watched_from < 60:
        assert await asyncio.to_thread(label_of, wctx, victim) == "true"
        assert url_of(victim) in await asyncio.to_thread(gateway_urls, router)
        st = await state(wctx, name)
        assert st.outcome is Outcome.ABORTED and st.attempt == 1
        await asyncio.sleep(1)
    assert [r.run_id for r in await runs(wctx.client, wid)] == [run_id]  # no new retirement
    assert st.cancelled and st.deleted is None
    await finish(handle)


@asynccontextmanager
async def worker_with(ctx: Ctx, queue: str, activities: list[Any]) -> AsyncIterator[None]:
    """A worker running RetirementWorkflow (the product's runner) and ``activities`` on
    ``queue`` (eight activity threads), for a test that replaces one of the activities."""
    with ThreadPoolExecutor(max_workers=8) as pool:
        async with Worker(
            ctx.client,
            task_queue=queue,
            workflows=[RetirementWorkflow],
            workflow_runner=workflow_runner(converter=ctx.client.data_converter),
            activities=activities,
            activity_executor=pool,
            max_concurrent_activities=8,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        ):
            yield


class PersonRelabels:
    """The drain activity as the worker runs it, after which (its last round read idle, the
    delete not yet begun) a person puts the eligibility label back with kubectl."""

    def __init__(self, acts: RetirementActivities, ctx: Ctx, pod: str) -> None:
        self._acts, self._ctx, self._pod = acts, ctx, pod
        self.relabelled = False

    @activity.defn(name="drain")
    def drain(self, inp: PhaseInput) -> Observation:
        obs = self._acts.drain(inp)
        if obs.verdict is Verdict.VERIFIED and not self.relabelled:
            patch = {"metadata": {"labels": {LABEL_ELIGIBLE: "true"}}}
            self._ctx.core.patch_namespaced_pod(self._pod, self._ctx.ns, patch)
            self.relabelled = True
        return obs


async def test_a_label_put_back_between_the_last_drain_round_and_the_delete_keeps_it(
    ctx: Ctx,
) -> None:
    name = "relabel"
    router = await deploy(ctx, name)
    assert router is not None
    victim = pods_of(ctx, name, 1)[0]
    kube = Kube.from_config(kubeconfig=str(ctx.bed.cp.kubeconfig))
    acts = RetirementActivities(kube)
    person = PersonRelabels(acts, ctx, victim.metadata.name)
    queue = f"{ctx.queue}-relabel"
    activities = [a for a in acts.all() if a.__name__ != "drain"] + [person.drain]
    async with worker_with(ctx, queue, activities):
        handle = await retire(ctx, name, 1, queue=queue)
        st = await until(handle, settled, timeout=90)
        assert person.relabelled
        assert st.deleted is None, st.deleted
        assert any("delete refused: label re-added by someone else" in r for r in st.reasons)
        assert Phase.DELETING in [p for p, _ in st.phase_timeline]
        # The API server still has the replica, the same Pod, labelled and routed to.
        assert await asyncio.to_thread(label_of, ctx, victim) == "true"
        await eventually_in_thread(
            lambda: url_of(victim) in gateway_urls(router), what="gateway selects it"
        )
        await finish(handle)


class LateDrain:
    """The drain activity as the worker runs it, whose first VERIFIED answer reaches the
    workflow as if its workflow task had run a minute late (its idle read stamped 60 s
    earlier: past the freshness bound).  With ``then_busy`` the engine then reads one
    request running (the emulator's stale-gauges trap) until the test clears it."""

    def __init__(self, acts: RetirementActivities, ctx: Ctx, hub: str, *, then_busy: bool) -> None:
        self._acts, self._ctx, self._hub, self._busy = acts, ctx, hub, then_busy
        self.runs = 0

    @activity.defn(name="drain")
    def drain(self, inp: PhaseInput) -> Observation:
        obs = self._acts.drain(inp)
        self.runs += 1
        if obs.verdict is not Verdict.VERIFIED or self.runs > 1:
            return obs
        assert obs.evidence_at is not None
        if self._busy:
            self._ctx.bed.hub_call("POST", f"/pods/{self._hub}/traps", {"stale_gauges": [1, 0]})
        return obs.model_copy(update={"evidence_at": obs.evidence_at - timedelta(seconds=60)})


async def late_drain_worker(
    ctx: Ctx, name: str, *, then_busy: bool
) -> tuple[Any, LateDrain, Any, Any]:
    """A deployment behind the real SGLang gateway, its victim, and what a worker needs to
    run its retirement with ``LateDrain`` for the drain."""
    await deploy(ctx, name)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    acts = RetirementActivities(Kube.from_config(kubeconfig=str(ctx.bed.cp.kubeconfig)))
    late = LateDrain(acts, ctx, hub, then_busy=then_busy)
    activities = [a for a in acts.all() if a.__name__ != "drain"] + [late.drain]
    return victim, late, activities, hub


def pod_uid(ctx: Ctx, name: str) -> str | None:
    pods = ctx.core.list_namespaced_pod(ctx.ns, field_selector=f"metadata.name={name}").items
    return pods[0].metadata.uid if pods else None


async def test_stale_evidence_is_read_again_on_the_real_engine_before_the_delete(
    ctx: Ctx,
) -> None:
    name = "late-idle"
    victim, late, activities, _ = await late_drain_worker(ctx, name, then_busy=False)
    queue = f"{ctx.queue}-{name}"
    async with worker_with(ctx, queue, activities):
        handle = await retire(ctx, name, 1, queue=queue)
        st = await until(handle, lambda st: st.outcome is not Outcome.RUNNING, timeout=90)
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert late.runs == 1  # no second drain activity: the guard took the proof again
    assert any("the delete's guard reads the engines again first" in r for r in st.reasons)
    assert st.deleted is not None and st.deleted.deleted == [victim.metadata.name]
    assert await asyncio.to_thread(pod_uid, ctx, victim.metadata.name) != victim.metadata.uid


async def test_stale_evidence_read_again_busy_keeps_the_replica_until_it_is_idle(
    ctx: Ctx,
) -> None:
    name = "late-busy"
    victim, late, activities, hub = await late_drain_worker(ctx, name, then_busy=True)
    queue = f"{ctx.queue}-{name}"
    async with worker_with(ctx, queue, activities):
        handle = await retire(ctx, name, 1, queue=queue)
        st = await until(
            handle, lambda st: any("read again it is not idle" in r for r in st.reasons)
        )
        # The refusal is recorded: the API server still has the very same Pod.
        assert st.deleted is None
        assert await asyncio.to_thread(pod_uid, ctx, victim.metadata.name) == victim.metadata.uid
        assert any("delete refused" in r and "draining again" in r for r in st.reasons)
        ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
        st = await until(handle, lambda st: st.outcome is not Outcome.RUNNING, timeout=90)
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert late.runs >= 2
    assert await asyncio.to_thread(pod_uid, ctx, victim.metadata.name) != victim.metadata.uid
