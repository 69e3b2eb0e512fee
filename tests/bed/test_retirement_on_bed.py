"""Full retirements on the real bed: the dev server, the real activities in a worker, the
kube-apiserver + kwok + engine emulators, and the real SGLang gateway."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from kubernetes import client
from temporalio.client import WorkflowHandle

from retirement.budgets import Budgets
from retirement.models import AbortRequest, RetirementRequest, RetirementState, workflow_id_for
from retirement.names import (
    ANNOTATION_PROM_PORT,
    GROUP,
    LABEL_ELIGIBLE,
    PLURAL,
    VERSION,
)
from retirement.phases import ORDER, Outcome, Phase
from tests.bed.conftest import Ctx, create_md
from tests.bed.support import (
    SHORT,
    Witness,
    deploy,
    finish,
    one_request,
    phase_durations,
    pods_of,
    retire,
    retire_routerless,
    scale,
    serving,
    until,
    wait_for_outcome,
    wait_state,
)
from tests.helpers import eventually_in_thread, model_deployment
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

TIMINGS: dict[str, dict[str, float]] = {}


def gateway_selection(router: str) -> Callable[[], set[str]]:
    """What the real SGLang gateway routes to, read from the gateway itself."""

    def read() -> set[str]:
        with httpx.Client(trust_env=False, timeout=2) as http:
            return {w["url"] for w in http.get(router + "/workers").json()["workers"]}

    return read


@pytest.mark.parametrize("engine", ["vLLM", "SGLang"])
async def test_full_retirement_deletes_only_the_retired_replica(ctx: Ctx, engine: str) -> None:
    name = f"full-{engine.lower()}"
    router = await deploy(ctx, name, engine=engine)
    assert router is not None
    keep = {p.metadata.name: p.metadata.uid for p in pods_of(ctx, name, 0)}
    victim = pods_of(ctx, name, 1)[0]
    witness = Witness(ctx, victim, gateway_selection(router))
    await eventually_in_thread(
        lambda: f"http://{victim.status.pod_ip}:8000" in gateway_selection(router)(),
        what="the gateway selects the victim",
    )
    scale(ctx, name, 1)
    witness.start()
    t0 = time.monotonic()
    handle = await retire(ctx, name, 1)
    st = await handle.result()
    wall = time.monotonic() - t0
    assert st.outcome is Outcome.COMPLETED, st.reasons
    # Read by the witness, not the product: the gateway stopped selecting the victim
    # before its delete began, and did not select it again.
    assert await asyncio.to_thread(witness.verdict) == ""
    assert st.deleted is not None and st.deleted.deleted == [victim.metadata.name]
    await eventually_in_thread(
        lambda: not pods_of(ctx, name, 1), what="victim gone", timeout=20, ignore=(Exception,)
    )
    left = {p.metadata.name: p.metadata.uid for p in pods_of(ctx, name, 0)}
    assert left == keep  # the other replica is untouched
    assert all(
        (p.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true" for p in pods_of(ctx, name, 0)
    )
    with httpx.Client(trust_env=False, timeout=5) as http:
        urls = {w["url"] for w in http.get(router + "/workers").json()["workers"]}
    assert f"http://{victim.status.pod_ip}:8000" not in urls
    # status.retirement is cleared (no operation) and each phase left an Event.
    md = client.CustomObjectsApi(ctx.bed.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ctx.ns, PLURAL, name
    )
    assert (md.get("status") or {}).get("retirement") is None
    events = ctx.core.list_namespaced_event(ctx.ns).items
    reasons = {e.reason for e in events if e.involved_object.name == name}
    assert {f"Retirement{p}" for p in ORDER} <= reasons, reasons
    events, executions = await history_cost(handle)
    TIMINGS[engine] = {
        **phase_durations(st),
        "wall": round(wall, 2),
        "history_events": events,
        "executions": executions,
    }
    print(f"\n{engine} retirement: {TIMINGS[engine]}")


async def test_busy_engine_aborts_at_drain_budget_and_restores(ctx: Ctx) -> None:
    name = "busy"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [3, 1]})
    budgets = Budgets(overall_s=60, withdrawal_s=20, drain_s=6, settle_s=10, poll_interval_s=0.5)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=1)
    st = await wait_state(handle, Phase.ABORTED)
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert st.history[-1].furthest_phase is Phase.DRAINING
    assert any("drain budget exhausted" in r for r in st.reasons), st.reasons
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.uid == victim.metadata.uid  # nothing deleted
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"  # label restored
    assert "in_flight=4" in " ".join(st.last_readings.values())
    await finish(handle)


async def test_port_annotation_not_a_number_is_refused_without_exec(ctx: Ctx) -> None:
    name = "badport"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    ctx.core.patch_namespaced_pod(
        victim.metadata.name, ctx.ns, {"metadata": {"annotations": {ANNOTATION_PROM_PORT: "80a"}}}
    )
    handle = await retire(ctx, name, 1)
    st = await handle.result()
    assert st.outcome is Outcome.REFUSED
    assert any("'80a' is not a port number" in r for r in st.reasons), st.reasons
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"  # nothing was touched
    assert [p for p, _ in st.phase_timeline] == [Phase.ADMITTED]


async def test_replaced_pod_mid_drain_survives(ctx: Ctx) -> None:
    name = "replaced"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # hold the drain
    budgets = Budgets(overall_s=60, withdrawal_s=20, drain_s=30, settle_s=10, poll_interval_s=0.5)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=1)
    await wait_state(handle, Phase.DRAINING)
    # Someone else replaces the Pod: same name, new UID (the spec no longer declares the
    # ordinal, so the stand-in operator will not: the test recreates it).
    ctx.core.delete_namespaced_pod(victim.metadata.name, ctx.ns, grace_period_seconds=0)
    await eventually_in_thread(
        lambda: not pods_of(ctx, name, 1), what="victim gone", timeout=30, ignore=(Exception,)
    )
    ctx.core.create_namespaced_pod(
        ctx.ns,
        client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=victim.metadata.name,
                labels=victim.metadata.labels,
                annotations=victim.metadata.annotations,
            ),
            spec=victim.spec,
        ),
    )

    def replacement() -> client.V1Pod | None:
        ps = pods_of(ctx, name, 1)
        return ps[0] if ps and ps[0].metadata.uid != victim.metadata.uid else None

    new = await eventually_in_thread(
        replacement, what="replacement", timeout=30, ignore=(Exception,)
    )
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert any("replaced" in r or "gone" in r for r in st.reasons), st.reasons
    await asyncio.sleep(1)
    now = pods_of(ctx, name, 1)
    assert [p.metadata.uid for p in now] == [new.metadata.uid]  # the replacement survives
    await finish(handle)


async def test_container_restart_mid_drain_reads_unknown_then_aborts(ctx: Ctx) -> None:
    name = "restart"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})
    budgets = Budgets(overall_s=60, withdrawal_s=20, drain_s=8, settle_s=10, poll_interval_s=0.5)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=1)
    await wait_state(handle, Phase.DRAINING)
    # The container restarts: the engine comes back idle, with a new container ID.
    ctx.bed.hub_call("POST", f"/pods/{hub}/restart")
    main = next(s for s in victim.status.container_statuses if s.name == "main")
    ctx.core.patch_namespaced_pod_status(
        victim.metadata.name,
        ctx.ns,
        {
            "status": {
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": main.image,
                        "imageID": "",
                        "ready": True,
                        "restartCount": 1,
                        "containerID": main.container_id + "-r1",
                        "state": {"running": {}},
                    }
                ]
            }
        },
    )
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert any("restarted" in v for v in st.last_readings.values()), st.last_readings
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.uid == victim.metadata.uid
    await finish(handle)


async def test_a_metrics_endpoint_slower_than_the_read_aborts_with_nothing_deleted(
    ctx: Ctx,
) -> None:
    """The engine's metrics answer only after the one-shot's 2 s HTTP timeout (a stalled
    engine, an overloaded node): every read is UNKNOWN, never idle, and the drain aborts at
    its budget with the replica kept and labelled."""
    name = "slowmetrics"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"metrics_mode": "slow"})
    budgets = Budgets(overall_s=60, withdrawal_s=20, drain_s=8, settle_s=10, poll_interval_s=0.5)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=0.5)
    st = await until(handle, lambda s: s.outcome is not Outcome.RUNNING, timeout=90)
    assert st.outcome is Outcome.ABORTED, st.reasons
    assert st.deleted is None
    assert any("GET failed" in v and "Timeout" in v for v in st.last_readings.values()) or any(
        "GET failed" in r for r in st.reasons
    ), (st.last_readings, st.reasons[-3:])
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.uid == victim.metadata.uid
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"
    await finish(handle)


async def test_stale_gauges_cause_no_premature_delete(ctx: Ctx) -> None:
    """Gauges stuck non-zero after a mass abort: the drain holds until they read 0."""
    name = "trap-stale"
    await deploy(ctx, name, router=False, request_seconds=2.0)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [2, 0]})
    handle = await retire_routerless(ctx, name, budgets=SHORT, quiet_s=0.5)
    await wait_state(handle, Phase.DRAINING)
    await asyncio.sleep(3.0)
    held: RetirementState = await handle.query(RetirementWorkflow.state)
    assert held.phase is Phase.DRAINING  # still held by the stale gauges
    cleared = time.time()
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
    st = await handle.result()
    assert st.outcome is Outcome.COMPLETED, st.reasons
    deleting = next(t for p, t in st.phase_timeline if p is Phase.DELETING)
    assert deleting.timestamp() >= cleared
    # Cost stays small however long a phase polls: one activity per phase, no timers.
    events, executions = await history_cost(handle)
    print(f"\nheld drain: {events} history events, {executions} activity+timer executions")
    assert events <= 300 and executions <= 30


async def history_cost(handle: WorkflowHandle[Any, RetirementState]) -> tuple[int, int]:
    """History length and the number of activity and timer executions of a run."""
    from temporalio.api.enums.v1 import EventType

    history = await handle.fetch_history()
    kinds = (EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED, EventType.EVENT_TYPE_TIMER_STARTED)
    return len(history.events), sum(1 for e in history.events if e.event_type in kinds)


async def test_frontend_request_is_caught_by_the_counter_check(ctx: Ctx) -> None:
    """A vLLM request still in the HTTP front end reads as idle gauges; when it reaches the
    scheduler and finishes between the two idle reads, the moved counters stop the drain
    from verifying on that pair, and a third read is needed.

    The guarantee is for front-end delays shorter than the spacing of the reads (the poll
    interval): a request that hides longer than that is invisible to every metric.
    """
    name = "trap-frontend"
    await deploy(ctx, name, router=False, request_seconds=0.1)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    budgets = Budgets(overall_s=90, withdrawal_s=30, drain_s=40, settle_s=20, poll_interval_s=4.0)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=0.1)
    await wait_state(handle, Phase.DRAINING)
    # Sent after the drain's first read began: hidden in the front end for 2.5 s, then it
    # runs 0.1 s and finishes, all before the second read (4 s after the first).
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"frontend_hidden": 2.5})
    status, finished_at = await asyncio.to_thread(one_request, victim.status.pod_ip)
    st = await handle.result()
    assert status == 200
    assert st.outcome is Outcome.COMPLETED, st.reasons
    drain = next(r for r in st.reasons if r.startswith("drain: VERIFIED"))
    assert "after 3 poll(s)" in drain, drain  # the r1/r2 pair was refused: counters moved
    deleting = next(t for p, t in st.phase_timeline if p is Phase.DELETING)
    assert deleting.timestamp() > finished_at


async def test_leader_served_group_measures_the_leader_and_restores_by_probe(ctx: Ctx) -> None:
    """A 2-member leader-served replica: only the leader is measured; on abort the leader
    gets its label back only after its identity-bound probe answers (vLLM 0.29.0)."""
    name = "group"
    create_md(
        ctx.bed.api_client(),
        ctx.ns,
        model_deployment(name, replicas=2, size=2, extra_args=["--data-parallel-size", "2"]),
    )
    op = ctx.bed.operator(ctx.ns)
    await asyncio.to_thread(serving, ctx, name, 2)  # the two leaders
    members = sorted(pods_of(ctx, name, 1), key=lambda p: p.metadata.name)
    leader = next(
        p for p in members if p.metadata.labels["modeldeployment.gpustack.ai/member-index"] == "0"
    )
    hub = op.hub_pod(leader.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})
    budgets = Budgets(overall_s=60, withdrawal_s=20, drain_s=5, settle_s=10, poll_interval_s=0.5)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=0.5)
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert st.target is not None and st.target.shape == "LeaderServed"
    assert st.target.measured == (leader.metadata.name,)
    assert sorted(st.target.uids) == sorted(p.metadata.uid for p in members)
    assert st.restored is not None and st.restored.restored == [leader.metadata.name]
    labels = {p.metadata.name: p.metadata.labels.get(LABEL_ELIGIBLE) for p in pods_of(ctx, name, 1)}
    assert labels[leader.metadata.name] == "true"
    assert all(v is None for k, v in labels.items() if k != leader.metadata.name)
    await finish(handle)


def gateway_workers(router: str) -> set[str]:
    """The worker URLs the real SGLang gateway routes to, read from the gateway itself."""
    with httpx.Client(trust_env=False, timeout=5) as http:
        return {w["url"] for w in http.get(router + "/workers").json()["workers"]}


async def test_abort_after_a_router_removal_puts_the_worker_back_on_the_gateway(
    ctx: Ctx,
) -> None:
    """The SGLang gateway 0.3.2 ignores label changes: withdrawal removes the worker with
    ``DELETE /workers/{id}``, so after an abort the restore must add it back (``POST
    /workers``) and read the gateway selecting it again before the member counts as
    restored."""
    name = "readd"
    router = await deploy(ctx, name)
    assert router is not None
    victim = pods_of(ctx, name, 1)[0]
    url = f"http://{victim.status.pod_ip}:8000"
    await eventually_in_thread(
        lambda: url in gateway_workers(router),
        what="gateway lists it",
        timeout=30,
        ignore=(Exception,),
    )
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # drain holds
    budgets = Budgets(overall_s=120, withdrawal_s=30, drain_s=60, settle_s=20, poll_interval_s=0.5)
    handle = await retire(ctx, name, 1, budgets=budgets)
    st = await wait_state(handle, Phase.DRAINING)
    assert url not in await asyncio.to_thread(gateway_workers, router)  # actively removed
    assert any(r.endswith("|" + url) for r in st.router_removals), st.router_removals
    await handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="oncall"))
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert st.restored is not None, st.reasons
    assert st.restored.restored == [victim.metadata.name], st.restored
    assert not st.restored.held and not st.unrestored
    # Read from the gateway itself: it selects the worker again, and keeps doing so.
    assert url in await asyncio.to_thread(gateway_workers, router)
    await asyncio.sleep(3)
    assert url in await asyncio.to_thread(gateway_workers, router)
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"
    await finish(handle)


async def test_a_label_put_back_mid_drain_aborts_before_any_delete(ctx: Ctx) -> None:
    """Another writer (the real operator, a second watcher) puts the eligibility label back
    while the drain holds: the next drain round sees it and aborts; nothing is deleted,
    however idle the engine reads afterwards."""
    name = "relabel"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # drain holds
    budgets = Budgets(overall_s=90, withdrawal_s=20, drain_s=60, settle_s=10, poll_interval_s=0.5)
    handle = await retire_routerless(ctx, name, budgets=budgets, quiet_s=0.5)
    await wait_state(handle, Phase.DRAINING)
    ctx.core.patch_namespaced_pod(
        victim.metadata.name, ctx.ns, {"metadata": {"labels": {LABEL_ELIGIBLE: "true"}}}
    )
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})  # idle from now on
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert any("label re-added" in r for r in st.reasons), st.reasons
    assert st.deleted is None
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.uid == victim.metadata.uid
    await finish(handle)


async def test_a_replica_the_spec_still_declares_is_refused(ctx: Ctx) -> None:
    """``retire start … --ordinal 1`` while the spec still declares two replicas: admission
    derives the intents from the live spec and Pods and refuses, touching nothing."""
    name = "declared"
    await deploy(ctx, name, router=False)
    victim = pods_of(ctx, name, 1)[0]
    req = RetirementRequest(
        namespace=ctx.ns, deployment=name, role="server", ordinal=1, budgets=SHORT
    )
    handle = await ctx.client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=workflow_id_for(namespace=ctx.ns, deployment=name),
        task_queue=ctx.queue,
        result_type=RetirementState,
    )
    st = await handle.result()
    assert st.outcome is Outcome.REFUSED
    assert any("still declares server ordinal 1" in r for r in st.reasons), st.reasons
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"
