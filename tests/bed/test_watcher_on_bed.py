"""The watcher on the real bed: scale-downs become retirements one at a time, scale-ups
cancel them, retry annotations are delivered, and it survives SIGKILL and failover."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
import pytest
from kubernetes import client

from retirement.budgets import Budgets
from retirement.models import AbortRequest, IntentKind, RetirementState, workflow_id_for
from retirement.names import ANNOTATION_RETRY, GROUP, LABEL_ELIGIBLE, PLURAL, VERSION
from retirement.phases import Outcome, Phase
from testbed.load import Load
from testbed.procs import Child
from testbed.standin_operator import router_pod_name
from tests.bed.conftest import Ctx, create_md
from tests.bed.support import (
    WatchCtx,
    pods_of,
    retire_routerless,
    runs,
    scale,
    serving,
    state,
    wctx,
)
from tests.helpers import eventually_async, eventually_in_thread, model_deployment, role
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]
__all__ = ["wctx"]  # the fixture, shared

T = TypeVar("T")

#: The loaded scale-down's budgets: a drain that outlasts requests of up to 5 s.
LOADED_BUDGETS = (
    '{"overall_s": 120, "withdrawal_s": 15, "drain_s": 45, "settle_s": 15, "poll_interval_s": 0.5}'
)


async def bed_read(check: Callable[[], T | None], *, what: str, timeout: float = 60) -> T:
    """Poll a blocking read of the bed until it answers (a read may fail while objects
    appear), off the event loop that the worker shares."""
    return await eventually_in_thread(
        check, what=what, timeout=timeout, interval=0.3, ignore=(Exception,)
    )


async def held_victim(ctx: WatchCtx, name: str, *, running: int) -> tuple[client.V1Pod, str]:
    """A 2-replica deployment whose ordinal-1 engine reads ``running`` stale requests
    (its drain holds); returns that Pod and its emulator's name."""
    create_md(ctx.bed.api_client(), ctx.ns, model_deployment(name, replicas=2))
    op = ctx.bed.operator(ctx.ns)
    await asyncio.to_thread(serving, ctx, name, 2)
    victim = pods_of(ctx, name, 1)[0]
    hub = op.hub_pod(victim.metadata.uid)
    assert hub is not None
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [running, 0]})
    return victim, hub


async def until_state(
    ctx: WatchCtx, name: str, check: Callable[[RetirementState], bool], timeout: float = 30
) -> RetirementState:
    """Query the deployment's retirement until ``check`` holds (it may not exist yet)."""
    return await eventually_async(
        lambda: state(ctx, name),
        accept=check,
        timeout=timeout,
        what=f"retirement of {name} reaching the wanted state",
        ignore=(Exception,),
    )


async def test_scale_3_to_1_retires_two_replicas_one_after_the_other(wctx: WatchCtx) -> None:
    name = "three"
    create_md(wctx.bed.api_client(), wctx.ns, model_deployment(name, replicas=3))
    wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 3)
    wctx.watcher()
    scale(wctx, name, 1)
    await bed_read(
        lambda: (
            [
                p.metadata.labels["modeldeployment.gpustack.ai/pod-ordinal"]
                for p in pods_of(wctx, name)
            ]
            == ["0"]
        ),
        what="only ordinal 0 left",
        timeout=90,
    )
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)

    async def two_closed() -> list[Any]:
        rs = await runs(wctx.client, wid)
        return rs if len(rs) == 2 and all(r.close_time for r in rs) else []

    rs = await eventually_async(two_closed, what="two closed runs", timeout=20, interval=0.5)
    assert len(rs) == 2
    first, second = sorted(rs, key=lambda r: r.start_time)
    assert second.start_time >= first.close_time  # strictly one after the other
    ordinals = []
    for r in (first, second):
        st: RetirementState = await wctx.client.get_workflow_handle(
            wid, run_id=r.run_id, result_type=RetirementState
        ).result()
        assert st.outcome is Outcome.COMPLETED, st.reasons
        ordinals.append(st.request.ordinal)
    assert ordinals == [2, 1]  # the highest first
    assert pods_of(wctx, name)[0].metadata.labels.get(LABEL_ELIGIBLE) == "true"


async def test_scale_back_up_mid_drain_retains_capacity(wctx: WatchCtx) -> None:
    name = "bounce"
    victim, _hub = await held_victim(wctx, name, running=1)
    wctx.watcher()
    scale(wctx, name, 1)
    await until_state(wctx, name, lambda st: st.phase is Phase.DRAINING)
    scale(wctx, name, 2)
    h = wctx.client.get_workflow_handle(
        workflow_id_for(namespace=wctx.ns, deployment=name), result_type=RetirementState
    )
    st: RetirementState = await asyncio.wait_for(h.result(), 60)
    assert st.outcome is Outcome.CAPACITY_RETAINED, st.reasons
    pod = wctx.core.read_namespaced_pod(victim.metadata.name, wctx.ns)
    assert pod.metadata.uid == victim.metadata.uid
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"  # restored


def annotate(ctx: Ctx, name: str, value: str | None) -> None:
    client.CustomObjectsApi(ctx.bed.api_client()).patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ctx.ns,
        PLURAL,
        name,
        {"metadata": {"annotations": {ANNOTATION_RETRY: value}}},
    )


def annotation(ctx: Ctx, name: str) -> str | None:
    md = client.CustomObjectsApi(ctx.bed.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ctx.ns, PLURAL, name
    )
    value: str | None = (md["metadata"].get("annotations") or {}).get(ANNOTATION_RETRY)
    return value


def events(ctx: Ctx, name: str) -> dict[str, str]:
    return {
        e.reason: e.message
        for e in ctx.core.list_namespaced_event(ctx.ns).items
        if e.involved_object.name == name
    }


def md_status(ctx: Ctx, name: str) -> dict[str, Any]:
    md = client.CustomObjectsApi(ctx.bed.api_client()).get_namespaced_custom_object(
        GROUP, VERSION, ctx.ns, PLURAL, name
    )
    return dict(md.get("status") or {})


def eligible(ctx: Ctx, pod: str) -> str | None:
    labels = ctx.core.read_namespaced_pod(pod, ctx.ns).metadata.labels or {}
    value: str | None = labels.get(LABEL_ELIGIBLE)
    return value


async def health_get(child: Child, path: str) -> tuple[int, str]:
    """GET ``path`` from a watcher's health address (printed first in its log)."""

    def address() -> str | None:
        found = re.search(r"health (http://\S+)", child.log_path.read_text(errors="replace"))
        return found.group(1) if found else None

    base = await bed_read(address, what=f"{child.name}'s health address")

    def get() -> tuple[int, str]:
        with httpx.Client(trust_env=False, timeout=5) as http:
            r = http.get(base + path)
            return r.status_code, r.text

    return await asyncio.to_thread(get)


def sample(metrics: str, series: str) -> float | None:
    """The value of one exposition line ``series value`` (None: not exported)."""
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name == series:
            return float(value)
    return None


async def test_retry_annotation_fresh_attempt_replay_and_malformed(wctx: WatchCtx) -> None:
    name = "retry"
    _victim, hub = await held_victim(wctx, name, running=2)
    wctx.watcher()
    scale(wctx, name, 1)
    await until_state(wctx, name, lambda st: st.outcome is Outcome.ABORTED)
    assert (await state(wctx, name)).outcome is Outcome.ABORTED
    # A malformed annotation: an Event with the reason, nothing else.
    annotate(wctx, name, "server:one:t1")
    await bed_read(
        lambda: "RetryAnnotationInvalid" in events(wctx, name), what="invalid annotation event"
    )
    assert "not a non-negative integer" in events(wctx, name)["RetryAnnotationInvalid"]
    assert (await state(wctx, name)).attempt == 1
    # A valid token: delivered, cleared, a fresh attempt that completes once the engine idles.
    wctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
    annotate(wctx, name, "server:1:t1")
    await bed_read(lambda: annotation(wctx, name) is None, what="annotation cleared")
    await bed_read(lambda: not pods_of(wctx, name, 1), what="victim deleted")
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)
    final: RetirementState = await wctx.client.get_workflow_handle(
        wid, result_type=RetirementState
    ).result()
    assert final.outcome is Outcome.COMPLETED and final.attempt == 2
    assert final.last_consumed_retry_token == "t1"
    # The same token again: a replay, ignored (nothing runs; the annotation is cleared).
    annotate(wctx, name, "server:1:t1")
    await bed_read(lambda: annotation(wctx, name) is None, what="replay cleared")
    assert len(await runs(wctx.client, wid)) == 2  # the original run and its continuation


async def test_a_retry_annotation_set_while_no_watcher_runs_is_delivered_at_its_start(
    wctx: WatchCtx,
) -> None:
    """A retirement holds after an abort; the annotation is set while the watcher is down;
    the watcher that starts takes it to the held retirement.  Before, its first reconciles
    ran before its first visibility query, read "no retirement runs" and posted
    RetryAnnotationIgnored, clearing the annotation: the token was lost."""
    name = "retrystart"
    _victim, hub = await held_victim(wctx, name, running=2)
    first = wctx.watcher(name="watcher-first")
    scale(wctx, name, 1)
    await until_state(wctx, name, lambda st: st.phase is Phase.DRAINING)
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)
    h = wctx.client.get_workflow_handle(wid, result_type=RetirementState)
    await h.execute_update(RetirementWorkflow.abort, AbortRequest(reason="on-call"))
    await until_state(wctx, name, lambda st: st.outcome is Outcome.ABORTED and not st.restoring)
    first.stop(timeout=10)
    wctx.watchers.remove(first)
    annotate(wctx, name, "server:1:t1")
    wctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})  # the retry can finish
    wctx.watcher(name="watcher-second")
    st = await until_state(
        wctx,
        name,
        lambda st: st.attempt == 2 or st.last_consumed_retry_token == "t1",
        timeout=60,
    )
    assert st.attempt == 2 and st.last_consumed_retry_token == "t1", (st.attempt, st.reasons)
    await bed_read(lambda: annotation(wctx, name) is None, what="annotation cleared")
    seen = events(wctx, name)
    assert "RetryAnnotationIgnored" not in seen, seen["RetryAnnotationIgnored"]
    assert seen.get("RetryDelivered", "").startswith("token t1: Accept"), seen
    final: RetirementState = await asyncio.wait_for(h.result(), 60)
    assert final.outcome is Outcome.COMPLETED and final.attempt == 2, final.reasons


async def test_watcher_killed_mid_retirement_no_duplicate(wctx: WatchCtx) -> None:
    """Watcher A is SIGKILLed while its retirement drains; watcher B, started after it, takes
    over.  B must be shown to run and act, not merely to exist: it reports leading and
    ready, reads the draining retirement instead of starting it again (no duplicate run, no
    start refused), and once that retirement completes it starts the next intent itself
    (only B runs by then).  Scale 3 -> 1: ordinal 2 first (A), then ordinal 1 (B)."""
    name = "killed"
    create_md(wctx.bed.api_client(), wctx.ns, model_deployment(name, replicas=3))
    op = wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 3)
    first = pods_of(wctx, name, 2)[0]
    hub = op.hub_pod(first.metadata.uid)
    assert hub is not None
    wctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # drain holds
    budgets = (  # room for the kill and B's start inside the drain budget
        '{"overall_s": 120, "withdrawal_s": 15, "drain_s": 60, "settle_s": 15, '
        '"poll_interval_s": 0.5}'
    )
    a = wctx.watcher("--budgets", budgets, name="watcher-a")
    scale(wctx, name, 1)
    await until_state(wctx, name, lambda st: st.phase is Phase.DRAINING)
    assert (await state(wctx, name)).request.ordinal == 2
    a.kill()  # SIGKILL mid-retirement
    wctx.watchers.remove(a)
    b = wctx.watcher("--budgets", budgets, "--health-address", "127.0.0.1:0", name="watcher-b")

    async def ready() -> bool:
        return (await health_get(b, "/readyz"))[0] == 200

    await eventually_async(ready, what="watcher B ready", timeout=30, interval=0.3)
    _, metrics = await health_get(b, "/metrics")
    assert sample(metrics, "retire_watcher_is_leader") == 1.0
    assert ": leading" in b.log_path.read_text(errors="replace")

    async def read_the_running_one() -> bool:  # B described and queried it
        _, m = await health_get(b, "/metrics")
        return (sample(m, 'retire_watcher_temporal_calls_total{call="query"}') or 0) >= 1

    await eventually_async(read_the_running_one, what="B reads the retirement", timeout=15)
    wctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
    await bed_read(lambda: not pods_of(wctx, name, 2), what="ordinal 2 deleted", timeout=60)
    await bed_read(lambda: not pods_of(wctx, name, 1), what="ordinal 1 retired by B", timeout=90)
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)

    async def two_closed() -> list[Any]:
        rs = await runs(wctx.client, wid)
        return rs if len(rs) == 2 and all(r.close_time for r in rs) else []

    rs = await eventually_async(two_closed, what="two closed runs", timeout=30, interval=0.5)
    done = []
    for r in sorted(rs, key=lambda r: r.start_time):
        st: RetirementState = await wctx.client.get_workflow_handle(
            wid, run_id=r.run_id, result_type=RetirementState
        ).result()
        done.append((st.request.ordinal, st.outcome, st.attempt))
    # One run per ordinal: the draining one was not started again.
    assert done == [(2, Outcome.COMPLETED, 1), (1, Outcome.COMPLETED, 1)], done
    log_b = b.log_path.read_text(errors="replace")
    assert "started retirement of CountTrim server:1" in log_b  # B acted
    assert "started retirement of CountTrim server:2" not in log_b
    assert "already running" not in log_b  # it never tried to start ordinal 2 again
    _, metrics = await health_get(b, "/metrics")
    assert sample(metrics, "retire_watcher_retirements_started_total") == 1.0
    assert sample(metrics, 'retire_watcher_starts_refused_total{reason="already-running"}') in (
        None,
        0.0,
    )


async def test_two_watchers_one_acts_and_failover(wctx: WatchCtx) -> None:
    name = "ha"
    create_md(wctx.bed.api_client(), wctx.ns, model_deployment(name, replicas=3))
    wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 3)
    lease = ["--leader-elect", "--lease-namespace", wctx.ns, "--lease-seconds", "4"]
    a = wctx.watcher(*lease, "--identity", "a", name="watcher-a")
    await asyncio.sleep(3)
    b = wctx.watcher(*lease, "--identity", "b", name="watcher-b")
    coord = client.CoordinationV1Api(wctx.bed.api_client())

    def holder() -> str:
        return str(coord.read_namespaced_lease("retire-watcher", wctx.ns).spec.holder_identity)

    assert await bed_read(lambda: holder() == "a", what="a leads")
    scale(wctx, name, 2)
    await bed_read(lambda: not pods_of(wctx, name, 2), what="ordinal 2 retired")
    assert "leading" in a.log_tail(200) and "leading" not in b.log_tail(200)
    assert "started retirement" not in b.log_tail(200)  # exactly one acts
    a.kill()
    wctx.watchers.remove(a)
    assert await bed_read(lambda: holder() == "b", what="b takes over", timeout=30)
    scale(wctx, name, 1)
    await bed_read(lambda: not pods_of(wctx, name, 1), what="ordinal 1 retired by b")
    assert "started retirement" in b.log_tail(200)


async def test_scale_down_under_load_fails_no_request(wctx: WatchCtx) -> None:
    """The headline: 20 streams of 1-5 s requests through the real SGLang gateway while
    the watcher retires a replica; not one request fails."""
    name = "loaded"
    create_md(
        wctx.bed.api_client(), wctx.ns, model_deployment(name, replicas=2, router="sglang-gateway")
    )
    wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 2)
    url = await asyncio.to_thread(wctx.bed.start_sglang_router, wctx.ns, name)
    # Requests of up to 5 s are in flight when the withdrawal ends, and each drain read is a
    # pods/exec that takes seconds on a loaded machine: the module's 8 s drain budget left
    # no room for the confirming read (CI: "drain budget exhausted: first idle read").
    wctx.watcher("--budgets", LOADED_BUDGETS)
    load = Load(url, streams=20, min_s=1, max_s=5, max_duration_s=120).start()
    await asyncio.sleep(4)
    scaled_at = time.time()
    scale(wctx, name, 1)
    try:
        await bed_read(lambda: not pods_of(wctx, name, 1), what="replica retired", timeout=90)
    except AssertionError:
        # Say where it stopped: the retirement's phase and reasons, and the watcher's log.
        with contextlib.suppress(Exception):
            st = await state(wctx, name)
            print(f"\nretirement: {st.phase} {st.outcome} {st.reasons}")
        print(wctx.watchers[-1].log_tail(60))
        raise
    await asyncio.sleep(3)
    ok, failed = await asyncio.to_thread(load.stop)
    print(f"\nwatcher-driven scale-down under load: {ok} ok, {failed} failed {dict(load.failures)}")
    # On a failure: what answered (the router or an engine) and when, beside the timeline.
    st = await until_state(wctx, name, lambda st: st.outcome is not Outcome.RUNNING)
    if failed:
        print(f"failures, seconds after the scale-down: {failure_times(load, scaled_at)}")
        print(f"retirement: {st.reasons}")
        print(router_events(wctx.bed.routers[router_pod_name(name)]))
    assert ok > 20 and failed == 0, (load.samples, st.reasons)


def failure_times(load: Load, since: float) -> list[str]:
    """Each sampled failure of ``load``: seconds after ``since``, its kind and answer."""
    return [f"+{at - since:.3f}s {kind} {detail[:80]}" for at, kind, detail in load.samples]


def router_events(router: Child) -> str:
    """What a router logged about its workers (not its request lines): adds, removals,
    health and circuit changes, with their times, to set beside a failure's."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", router.log_tail(100_000))
    keep = [
        line[:240]
        for line in plain.splitlines()
        if "http_request{" not in line
        and ("workflow::event" not in line or "Workflow started" in line)
        and "tokenizer" not in line
    ]
    return "\n".join(keep[-80:])


async def test_departed_role_is_retired_replica_by_replica(wctx: WatchCtx) -> None:
    name = "departed"
    manifest = model_deployment(name, replicas=1)
    manifest["spec"]["roles"].append(role("old", replicas=2))
    create_md(wctx.bed.api_client(), wctx.ns, manifest)
    wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 3)
    wctx.watcher()
    co = client.CustomObjectsApi(wctx.bed.api_client())
    co.patch_namespaced_custom_object(
        GROUP, VERSION, wctx.ns, PLURAL, name, {"spec": {"roles": [role("server", replicas=1)]}}
    )
    await bed_read(
        lambda: [p.metadata.name for p in pods_of(wctx, name)] == [f"{name}-server-0"],
        what="old role gone",
        timeout=90,
    )
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)

    async def closed() -> list[Any]:
        return [r for r in await runs(wctx.client, wid) if r.close_time]

    rs = await eventually_async(
        closed, accept=lambda rs: len(rs) == 2, what="two closed runs", timeout=20, interval=0.5
    )
    done = []
    for r in sorted(rs, key=lambda r: r.start_time):
        st: RetirementState = await wctx.client.get_workflow_handle(
            wid, run_id=r.run_id, result_type=RetirementState
        ).result()
        done.append((st.request.intent, st.request.role, st.request.ordinal, st.outcome))
    assert done == [
        (IntentKind.DEPARTED_ROLE, "old", 1, Outcome.COMPLETED),
        (IntentKind.DEPARTED_ROLE, "old", 0, Outcome.COMPLETED),
    ]


async def test_orphan_left_by_a_terminated_workflow_is_repaired(wctx: WatchCtx) -> None:
    name = "orphan"
    victim, _hub = await held_victim(wctx, name, running=1)
    # A retirement started by hand (the spec is scaled to 1 for it) ...
    handle = await retire_routerless(
        wctx,
        name,
        quiet_s=0.5,
        budgets=Budgets(
            overall_s=120, withdrawal_s=20, drain_s=60, settle_s=10, poll_interval_s=0.5
        ),
    )
    await eventually_async(
        lambda: handle.query(RetirementWorkflow.state),
        accept=lambda st: st.phase is Phase.DRAINING,
        what="draining",
        timeout=20,
    )
    # ... terminated mid-drain: no restore runs, the member is left disqualified.
    await handle.terminate("on-call terminated it")
    scale(wctx, name, 2)  # ... and the spec declares ordinal 1 again: no intent left
    pod = wctx.core.read_namespaced_pod(victim.metadata.name, wctx.ns)
    assert LABEL_ELIGIBLE not in (pod.metadata.labels or {})
    health = wctx.watcher("--health-address", "127.0.0.1:0")
    await bed_read(
        lambda: (
            wctx.core.read_namespaced_pod(victim.metadata.name, wctx.ns).metadata.labels.get(
                LABEL_ELIGIBLE
            )
            == "true"
        ),
        what="orphan relabelled",
    )
    # The watcher's health and metrics endpoint.
    import re

    import httpx

    line = await bed_read(
        lambda: re.search(r"health (http://\S+)", health.log_tail(50)), what="health address"
    )
    with httpx.Client(trust_env=False, timeout=5) as http:
        base = line.group(1)
        assert http.get(base + "/healthz").status_code == 200
        assert http.get(base + "/readyz").status_code == 200
        metrics = http.get(base + "/metrics").text
    assert 'retire_watcher_eligibility_changes_total{value="true"}' in metrics
    assert "retire_watcher_reconcile_seconds_count" in metrics


async def test_a_terminated_retirement_s_status_is_cleared_and_its_member_relabelled(
    wctx: WatchCtx,
) -> None:
    """A retirement is terminated mid-withdrawal (its member disqualified, status.retirement
    saying Withdrawing) while the watcher runs: the restore and the last status write are
    skipped.  The watcher clears status.retirement within its reaction time, posts the
    RetirementTerminated Warning Event naming the member, counts it, and puts the label back
    on the member (a single one).  The watcher is paused (SIGSTOP) across the terminate and
    the scale back up so that it sees both at once: otherwise it could read the terminated
    run while the spec still trims the ordinal and rightly start the next retirement of it."""
    name = "terminated"
    create_md(wctx.bed.api_client(), wctx.ns, model_deployment(name, replicas=2))
    wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 2)
    victim = pods_of(wctx, name, 1)[0].metadata.name
    # A quiet window longer than the withdrawal budget: the retirement stays Withdrawing.
    watcher = wctx.watcher("--quiet-window", "60", "--health-address", "127.0.0.1:0")
    scale(wctx, name, 1)
    await until_state(wctx, name, lambda st: st.phase is Phase.WITHDRAWING)
    await bed_read(
        lambda: md_status(wctx, name).get("retirement", {}).get("state") == "Withdrawing",
        what="status.retirement says Withdrawing",
    )
    assert eligible(wctx, victim) is None
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)
    (run,) = await runs(wctx.client, wid)
    os.kill(watcher.proc.pid, signal.SIGSTOP)
    try:
        await wctx.client.get_workflow_handle(wid).terminate("on-call terminated it")
        scale(wctx, name, 2)  # the replica is wanted after all: no intent left
    finally:
        os.kill(watcher.proc.pid, signal.SIGCONT)
    resumed = time.monotonic()
    await bed_read(
        lambda: "retirement" not in md_status(wctx, name),
        what="status.retirement cleared",
        timeout=10,  # the watcher's reaction: a visibility refresh (2 s) and a reconcile
    )
    print(f"\nstatus.retirement cleared {time.monotonic() - resumed:.1f} s after the resume")
    await bed_read(lambda: eligible(wctx, victim) == "true", what="member relabelled", timeout=10)
    message = events(wctx, name).get("RetirementTerminated", "")
    assert message.startswith(f"{wid} (run {run.run_id}, replica server:1) was terminated"), message
    assert f"{victim}: the watcher puts the label back" in message, message
    _, metrics = await health_get(watcher, "/metrics")
    assert 'retire_watcher_retirements_terminated_total{left_unlabelled="single"} 1.0' in metrics
    assert 'retire_watcher_eligibility_changes_total{value="true"} 1.0' in metrics
    assert len(await runs(wctx.client, wid)) == 1  # nothing started behind it


async def test_a_held_retirement_ends_when_its_deployment_is_deleted(wctx: WatchCtx) -> None:
    """The deployment is deleted while its retirement holds: the watcher finds the
    retirement in Temporal's visibility (not among the listed deployments) and sends
    cancel-intent, so it ends instead of holding for ever."""
    name = "gone"
    _victim, _hub = await held_victim(wctx, name, running=1)
    wctx.watcher()
    scale(wctx, name, 1)
    await until_state(wctx, name, lambda st: st.phase is Phase.DRAINING)
    h = wctx.client.get_workflow_handle(
        workflow_id_for(namespace=wctx.ns, deployment=name), result_type=RetirementState
    )
    await h.execute_update(RetirementWorkflow.abort, AbortRequest(reason="oncall"))
    await until_state(wctx, name, lambda st: st.outcome is Outcome.ABORTED)
    # Orphan the Pods: only the deployment's absence can end the retirement (with the Pods
    # garbage-collected, the vanished intent would end it too, by another rule).
    client.CustomObjectsApi(wctx.bed.api_client()).delete_namespaced_custom_object(
        GROUP, VERSION, wctx.ns, PLURAL, name, propagation_policy="Orphan"
    )
    st: RetirementState = await asyncio.wait_for(h.result(), 60)
    assert st.outcome is Outcome.CAPACITY_RETAINED, st.reasons
    assert any("was deleted" in r for r in st.reasons), st.reasons


async def test_a_group_member_the_restore_held_is_not_labelled_by_the_watcher(
    wctx: WatchCtx,
) -> None:
    """Wedge 5 of the fleet issue, on the bed: one rule puts the label on.  A group whose
    engine version has no identity probe: the aborted retirement's restore holds the
    leader (the probe cannot vouch for it); when the retirement ends, the watcher does not
    label the leader on PodReady alone a second later, as it did with its own rule.

    Asked to end (the spec declares the replica again: cancel-intent), a hold now ends only
    once every member is back, or after 15 minutes (Abandoned); on the bed it is ended by
    terminating it, which also shows the watcher's reading of a terminated run: its
    status.retirement cleared, and the RetirementTerminated Event naming the leader as a
    group member a person must label."""
    name = "heldgroup"
    create_md(
        wctx.bed.api_client(),
        wctx.ns,
        model_deployment(
            name, version="0.1.0", replicas=2, size=2, extra_args=["--data-parallel-size", "2"]
        ),
    )
    op = wctx.bed.operator(wctx.ns)
    await asyncio.to_thread(serving, wctx, name, 2)  # the two leaders
    leader = next(
        p
        for p in pods_of(wctx, name, 1)
        if p.metadata.labels["modeldeployment.gpustack.ai/member-index"] == "0"
    )
    hub = op.hub_pod(leader.metadata.uid)
    wctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # never idle
    wctx.watcher()
    scale(wctx, name, 1)
    st = await until_state(wctx, name, lambda s: s.outcome is Outcome.ABORTED, timeout=90)
    await until_state(
        wctx,
        name,
        lambda s: s.restored is not None and leader.metadata.name in s.restored.held,
        timeout=60,
    )
    scale(wctx, name, 2)  # the replica is declared again: the watcher sends cancel-intent
    st = await until_state(wctx, name, lambda s: s.cancel_intent is not None)
    assert st.outcome is Outcome.ABORTED  # still holding: the leader is not back
    h = wctx.client.get_workflow_handle(workflow_id_for(namespace=wctx.ns, deployment=name))
    await h.terminate("on-call ended the hold")
    await bed_read(
        lambda: "retirement" not in md_status(wctx, name),
        what="status.retirement cleared",
        timeout=15,
    )
    message = events(wctx, name).get("RetirementTerminated", "")
    assert f"group members without {LABEL_ELIGIBLE}: {leader.metadata.name}:" in message, message
    await asyncio.sleep(5)  # the watcher has reconciled the deployment many times by now
    labels = (wctx.core.read_namespaced_pod(leader.metadata.name, wctx.ns).metadata.labels) or {}
    assert LABEL_ELIGIBLE not in labels, "the watcher labelled a member the restore held"


async def test_a_pending_surplus_member_is_retired_without_a_drain(wctx: WatchCtx) -> None:
    """Wedge 3 of the fleet issue, on the bed: a surplus member that never started (no
    node will take it: it stays Pending, unlabelled) is shed by the watcher: deleted with
    "never started: nothing to drain", and the serving member keeps serving.  Before, the
    shed found no member to measure, aborted at its drain budget and held."""
    name = "surplus"
    create_md(wctx.bed.api_client(), wctx.ns, model_deployment(name, replicas=1))
    wctx.bed.operator(wctx.ns)
    (kept,) = await asyncio.to_thread(serving, wctx, name, 1)
    labels = {k: v for k, v in (kept.metadata.labels or {}).items() if k != LABEL_ELIGIBLE}
    dup = client.V1Pod(
        metadata=client.V1ObjectMeta(name=f"{name}-dup", labels=labels),
        spec=client.V1PodSpec(  # no nodeName and no scheduler: Pending for ever
            containers=[client.V1Container(name="main", image="emulated/vllm:latest")]
        ),
    )
    wctx.core.create_namespaced_pod(wctx.ns, dup)
    wctx.watcher()
    wid = workflow_id_for(namespace=wctx.ns, deployment=name)

    async def ended() -> RetirementState | None:
        rs = await runs(wctx.client, wid)
        if not rs or not rs[0].close_time:
            return None
        st: RetirementState = await wctx.client.get_workflow_handle(
            wid, run_id=rs[0].run_id, result_type=RetirementState
        ).result()
        return st

    st = await eventually_async(ended, what="the shed ended", timeout=90, interval=0.5)
    assert st.request.intent is IntentKind.SURPLUS_SHED and st.request.members == [f"{name}-dup"]
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert st.deleted is not None and st.deleted.deleted == [f"{name}-dup"]
    assert st.target is not None  # admitted as never started: no exec read, only disqualified
    assert [(m.pod, m.container_id) for m in st.target.members] == [(f"{name}-dup", "")]
    left = pods_of(wctx, name)
    assert [p.metadata.name for p in left] == [kept.metadata.name]
    assert (left[0].metadata.labels or {}).get(LABEL_ELIGIBLE) == "true"
