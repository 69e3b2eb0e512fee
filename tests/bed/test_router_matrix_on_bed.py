"""The router matrix: every real router the bed runs, by every scenario a retirement meets.

Routers: ``sglang-router`` 0.3.2 and its successor ``smg`` 1.13.0 (both declared as the
kind ``sglang-gateway``: the CRD has no other name for the SGLang model gateway) and
``vllm-router`` 0.1.17 and 0.1.15 (the release gpustack pins, whose discovery keeps a
de-labelled Pod), each a real process with Kubernetes service discovery on the bed,
selecting the deployment's members that carry the eligibility label.  Scenarios: a full
retirement, an abort after withdrawal (the router selects the worker again), the router
down for the whole withdrawal (UNKNOWN, abort at the budget, nothing deleted) and a router
restarted mid-withdrawal.

What each router selects is read here independently of the product's observers (each
router's own list call), so a wrong observer cannot prove itself right.  The table printed
at the end (``MATRIX``) is what the README's router matrix reports.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from retirement.budgets import Budgets
from retirement.models import AbortRequest
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome, Phase
from testbed.bed import ROUTERS
from testbed.standin_operator import router_pod_name
from tests.bed.conftest import Ctx
from tests.bed.support import (
    Witness,
    deploy,
    finish,
    phase_durations,
    pods_of,
    retire,
    until,
    wait_for_outcome,
    wait_state,
)
from tests.helpers import eventually_in_thread
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

PROGRAMS = sorted(ROUTERS)
MATRIX: dict[str, dict[str, str]] = {}

#: How each router is taken out of and put back into selection, where its own behaviour
#: decides it (None: either, by timing).
#: - sglang-router 0.3.2 acts only on a deletion timestamp: label removal and relabelling
#:   are ignored for ever, so both must be asked for;
#: - vllm-router 0.1.15 keeps a de-labelled Pod (vllm-project/router#279) and does not
#:   re-add one it was told to remove: both must be asked for;
#: - vllm-router 0.1.17 drops a de-labelled Pod within ~0.2 s and re-selects a relabelled
#:   one: passive unless a read comes first;
#: - smg marks a de-labelled worker draining within ~1 s and its drain job removes it:
#:   active only if the first read still shows it ready; re-adds depend on that job.
REMOVAL: dict[str, str | None] = {
    "sglang-router": "active",
    "vllm-router-0.1.15": "active",
    "vllm-router": None,
    "smg": None,
}
READD: dict[str, str | None] = {
    "sglang-router": "active",
    "vllm-router-0.1.15": "active",
    "vllm-router": None,
    "smg": None,
}


@pytest.fixture(scope="module", autouse=True)
def _print_the_matrix() -> Iterator[None]:
    """Print what the scenarios recorded, once the file's tests ran (``pytest -s``)."""
    yield
    for program, cells in sorted(MATRIX.items()):
        for scenario, what in cells.items():
            print(f"{program:19} {scenario:17} {what}")


def selected(program: str, router: str) -> set[str]:
    """The worker URLs the router would send a new request to, read from the router."""
    with httpx.Client(trust_env=False, timeout=5) as http:
        if ROUTERS[program] == "vllm-router":
            urls: list[str] = http.get(router + "/list_workers").json()["urls"]
            return set(urls)
        workers: list[dict[str, Any]] = http.get(router + "/workers").json()["workers"]
        # smg reports a status (only "ready" is routed to); 0.3.x reports none.
        return {w["url"] for w in workers if w.get("status", "ready") == "ready"}


def worker_url(pod: Any) -> str:
    return f"http://{pod.status.pod_ip}:8000"


async def until_selected(kind: str, router: str, url: str, *, timeout: float = 40) -> None:
    await eventually_in_thread(
        lambda: url in selected(kind, router),
        what=f"{kind} selects {url}",
        timeout=timeout,
        ignore=(Exception,),
    )


def record(kind: str, scenario: str, what: str) -> None:
    MATRIX.setdefault(kind, {})[scenario] = what
    print(f"\n{kind} / {scenario}: {what}")


def removal_mode(router_removals: list[str]) -> str:
    return "active (removal asked, read back)" if router_removals else "passive (read back)"


def check_mode(table: dict[str, str | None], kind: str, active: bool) -> None:
    """The mode measured is the one the router's behaviour requires (``REMOVAL``, ``READD``)."""
    wanted = table[kind]
    if wanted is not None:
        assert ("active" if active else "passive") == wanted, (kind, active)


async def setup(ctx: Ctx, name: str, kind: str) -> tuple[str, Any, Any]:
    """A two-replica deployment behind a real router of ``kind`` that selects both."""
    router = await deploy(ctx, name, router_program=kind)
    assert router is not None
    keep, victim = pods_of(ctx, name, 0)[0], pods_of(ctx, name, 1)[0]
    await until_selected(kind, router, worker_url(keep))
    await until_selected(kind, router, worker_url(victim))
    return router, keep, victim


@pytest.mark.parametrize("kind", PROGRAMS)
async def test_full_retirement_behind_each_router(ctx: Ctx, kind: str) -> None:
    name = f"full-{kind}"
    router, keep, victim = await setup(ctx, name, kind)
    witness = Witness(ctx, victim, lambda: selected(kind, router))
    witness.start()
    handle = await retire(ctx, name, 1)
    st = await handle.result()
    assert st.outcome is Outcome.COMPLETED, st.reasons
    # Read from the router itself: it stopped selecting the victim before the delete.
    assert await asyncio.to_thread(witness.verdict) == "", kind
    check_mode(REMOVAL, kind, bool(st.router_removals))
    assert st.deleted is not None and st.deleted.deleted == [victim.metadata.name]
    now = await asyncio.to_thread(selected, kind, router)
    assert worker_url(victim) not in now
    assert worker_url(keep) in now  # the other replica still serves
    assert [p.metadata.uid for p in pods_of(ctx, name, 0)] == [keep.metadata.uid]
    took = phase_durations(st)
    record(kind, "withdrawal", removal_mode(st.router_removals))
    record(kind, "full retirement", f"completed; phases {took}")


@pytest.mark.parametrize("kind", PROGRAMS)
async def test_abort_after_withdrawal_leaves_the_router_selecting_it(ctx: Ctx, kind: str) -> None:
    name = f"abort-{kind}"
    router, _keep, victim = await setup(ctx, name, kind)
    url = worker_url(victim)
    hub = ctx.bed.operators[-1].hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # drain holds
    budgets = Budgets(overall_s=120, withdrawal_s=30, drain_s=60, settle_s=20, poll_interval_s=0.5)
    handle = await retire(ctx, name, 1, budgets=budgets)
    await wait_state(handle, Phase.DRAINING)
    assert url not in await asyncio.to_thread(selected, kind, router)  # withdrawn, read back
    await handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="oncall"))
    st = await wait_for_outcome(handle, Outcome.ABORTED)
    assert st.restored is not None, st.reasons
    assert st.restored.restored == [victim.metadata.name], st.restored
    assert not st.restored.held and not st.unrestored
    # The router itself selects the worker again, and keeps doing so.
    assert url in await asyncio.to_thread(selected, kind, router)
    await asyncio.sleep(3)
    assert url in await asyncio.to_thread(selected, kind, router)
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.uid == victim.metadata.uid
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"
    check_mode(REMOVAL, kind, bool(st.router_removals))
    check_mode(READD, kind, bool(st.restored.router_adds))
    readd = (
        f"active ({len(st.restored.router_adds)} add call(s), read back)"
        if st.restored.router_adds
        else "passive (discovery re-selected it, read back)"
    )
    record(kind, "re-add on abort", readd)
    if kind == "smg":
        # smg's selection was counted by time (a removal it started may still fire): the
        # hold reads the routers again 30 s and 120 s later before it stops looking.
        assert len(st.confirm_at) == 2, st.confirm_at
        st = await until(handle, lambda s: not s.confirm_at and not s.restoring, timeout=180)
        assert st.restore_rounds >= 3 and not st.unrestored, st.reasons
        assert url in await asyncio.to_thread(selected, kind, router)
        record(kind, "confirmed by time", f"re-read {st.restore_rounds - 1} times; still selected")
    await finish(handle, natural=True)  # a held retirement ends by cancel-intent once settled


@pytest.mark.parametrize("kind", PROGRAMS)
async def test_router_down_through_withdrawal_aborts_and_deletes_nothing(
    ctx: Ctx, kind: str
) -> None:
    """The router is killed before withdrawal can read it and stays down for the whole
    withdrawal budget: its answer is UNKNOWN (never "withdrawn"), the retirement aborts at
    the budget with nothing deleted and the label back; once the router is back it selects
    the member again."""
    name = f"down-{kind}"
    router, _keep, victim = await setup(ctx, name, kind)
    ctx.bed.routers[router_pod_name(name)].stop(timeout=5)
    budgets = Budgets(overall_s=90, withdrawal_s=8, drain_s=20, settle_s=20, poll_interval_s=0.5)
    handle = await retire(ctx, name, 1, budgets=budgets)
    st = await until(handle, lambda s: s.outcome is not Outcome.RUNNING, timeout=60)
    assert st.outcome is Outcome.ABORTED, st.reasons
    assert st.history[-1].furthest_phase is Phase.WITHDRAWING
    assert st.deleted is None
    pod = ctx.core.read_namespaced_pod(victim.metadata.name, ctx.ns)
    assert pod.metadata.uid == victim.metadata.uid  # nothing deleted
    assert pod.metadata.labels.get(LABEL_ELIGIBLE) == "true"  # label back
    why = next(r for r in st.reasons if "router" in r)
    await asyncio.to_thread(ctx.bed.start_router, ctx.ns, name, program=kind)
    await until_selected(kind, router, worker_url(victim))
    record(kind, "router down", f"aborted at withdrawal budget, nothing deleted: {why[:90]}")
    await finish(handle)


@pytest.mark.parametrize("kind", PROGRAMS)
async def test_router_restarted_mid_withdrawal_then_completes(ctx: Ctx, kind: str) -> None:
    """The router is down when withdrawal starts (its reads are UNKNOWN) and comes back
    mid-withdrawal: the restarted router's own fresh view, which no longer selects the
    de-labelled member, is what proves withdrawal; the retirement then completes."""
    name = f"restart-{kind}"
    router, keep, victim = await setup(ctx, name, kind)
    ctx.bed.routers[router_pod_name(name)].stop(timeout=5)
    budgets = Budgets(overall_s=120, withdrawal_s=60, drain_s=30, settle_s=20, poll_interval_s=0.5)
    handle = await retire(ctx, name, 1, budgets=budgets)
    await wait_state(handle, Phase.WITHDRAWING)
    await asyncio.sleep(3)  # withdrawal polls a router that does not answer
    await asyncio.to_thread(ctx.bed.start_router, ctx.ns, name, program=kind)
    st = await handle.result()
    assert st.outcome is Outcome.COMPLETED, st.reasons
    withdrawing = phase_durations(st)["Withdrawing"]
    assert withdrawing >= 3  # it could not be proven while the router was down
    # The restarted router finds the kept replica again by itself (smg registers each worker
    # by a workflow of its own: in CI the first read after completion came before it had).
    await until_selected(kind, router, worker_url(keep))
    assert worker_url(victim) not in await asyncio.to_thread(selected, kind, router)
    record(kind, "router restarted", f"withdrawal {withdrawing} s (router down 3 s), completed")


def second_router_pod(ctx: Ctx, name: str) -> str:
    """Another router Pod of the deployment (a copy of the first, as a router Deployment of
    two replicas has); returns its name."""
    first = ctx.core.read_namespaced_pod(router_pod_name(name), ctx.ns)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name=f"{first.metadata.name}-b",
            labels=dict(first.metadata.labels),
            owner_references=first.metadata.owner_references,
        ),
        spec=first.spec,
    )
    ctx.core.create_namespaced_pod(ctx.ns, pod)
    return str(pod.metadata.name)


async def test_every_router_pod_must_stop_selecting_it_mixed_gateway_releases(ctx: Ctx) -> None:
    """Two router Pods of one ``sglang-gateway`` deployment, mid-upgrade: one runs
    sglang-router 0.3.2, the other smg 1.13.0.  Withdrawal is read from each (and asked of
    each that still selects the member); the retirement completes only when neither
    selects it, and the other replica stays selected by both."""
    name = "mixed"
    first, keep, victim = await setup(ctx, name, "sglang-router")
    other = second_router_pod(ctx, name)
    second = await asyncio.to_thread(ctx.bed.start_router, ctx.ns, name, program="smg", pod=other)
    # Both replicas selected by the second router before the retirement: smg registers
    # each worker by a workflow of its own, and under load the kept one came seconds later
    # (a CI run read smg's selection empty after the retirement: it had not added it yet).
    await until_selected("smg", second, worker_url(victim))
    await until_selected("smg", second, worker_url(keep))
    handle = await retire(ctx, name, 1)
    st = await handle.result()
    assert st.outcome is Outcome.COMPLETED, st.reasons
    for program, router in (("sglang-router", first), ("smg", second)):
        now = await asyncio.to_thread(selected, program, router)
        assert worker_url(victim) not in now and worker_url(keep) in now, (program, now)
    asked = {r.split("|")[0] for r in st.router_removals}  # router Pod UIDs
    record("sglang-router + smg", "two router Pods", f"completed; removal asked of {len(asked)}")
