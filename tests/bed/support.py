"""Helpers the bed tests share (``tests/bed/test_*.py``), beside the fixtures of
``conftest.py``: a ModelDeployment deployed on the bed with its Pods, emulators and router
(``deploy``, ``deploy_engine``), its Pods read back (``pods_of``, ``serving``), a
retirement started as the watcher would (``retire``, ``retire_routerless``), waited for
(``until``, ``wait_state``, ``wait_for_outcome``) and ended (``finish``); an observer
independent of the product (``Witness``) and clients of the engines (``Straggler``,
``one_request``); and the watcher run as a process (``WatchCtx``, the ``wctx`` fixture)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from kubernetes import client
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities import Kube
from retirement.budgets import Budgets
from retirement.models import RetirementRequest, RetirementState, workflow_id_for
from retirement.names import (
    GROUP,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_ORDINAL,
    PLURAL,
    VERSION,
)
from retirement.phases import Outcome, Phase
from testbed.bed import ROUTERS, Bed
from testbed.procs import Child
from tests.bed.conftest import Ctx, create_md
from tests.helpers import eventually, eventually_async, model_deployment
from tests.helpers.retirements import end_retirement
from worker.__main__ import build_worker
from workflows.retirement import RetirementWorkflow, initial_search_attributes

# ---------------------------------------------------------------- deployments and retirements


SHORT = Budgets(overall_s=90, withdrawal_s=20, drain_s=30, settle_s=20, poll_interval_s=0.5)


def pods_of(ctx: Ctx, md: str, ordinal: int | None = None) -> list[client.V1Pod]:
    sel = f"{LABEL_INSTANCE}={md},app.kubernetes.io/name=model-deployment"
    if ordinal is not None:
        sel += f",{LABEL_ORDINAL}={ordinal}"
    return list(ctx.core.list_namespaced_pod(ctx.ns, label_selector=sel).items)


def serving(ctx: Ctx, md: str, n: int) -> list[client.V1Pod]:
    def check() -> list[client.V1Pod] | None:
        ps = [
            p
            for p in pods_of(ctx, md)
            if (p.metadata.labels or {}).get(LABEL_ELIGIBLE) and p.status.pod_ip
        ]
        return ps if len(ps) == n else None

    result: list[client.V1Pod] = eventually(
        check, what=f"{n} serving pods of {md}", timeout=60, ignore=(Exception,)
    )
    return result


async def deploy(
    ctx: Ctx,
    name: str,
    *,
    engine: str = "vLLM",
    router: bool = True,
    router_program: str = "sglang-router",
    request_seconds: float = 1.0,
    **kw: Any,
) -> str | None:
    """Create a ModelDeployment, its Pods and emulators, and (``router``) its real router
    ``router_program`` (``testbed.bed.ROUTERS``); returns the router's URL."""
    api = ctx.bed.api_client()
    create_md(
        api,
        ctx.ns,
        model_deployment(
            name, engine=engine, router=ROUTERS[router_program] if router else None, **kw
        ),
    )
    ctx.bed.operator(ctx.ns, request_seconds=request_seconds)
    await asyncio.to_thread(serving, ctx, name, kw.get("replicas", 2))
    if not router:
        return None
    url = await asyncio.to_thread(ctx.bed.start_router, ctx.ns, name, program=router_program)
    return url


def scale(ctx: Ctx, name: str, replicas: int) -> None:
    co = client.CustomObjectsApi(ctx.bed.api_client())
    md = co.get_namespaced_custom_object(GROUP, VERSION, ctx.ns, PLURAL, name)
    roles = md["spec"]["roles"]
    roles[0]["replicas"] = replicas
    co.patch_namespaced_custom_object(
        GROUP, VERSION, ctx.ns, PLURAL, name, {"spec": {"roles": roles}}
    )


async def retire(
    ctx: Ctx,
    name: str,
    ordinal: int,
    budgets: Budgets = SHORT,
    *,
    queue: str | None = None,
) -> WorkflowHandle[Any, RetirementState]:
    """Scale the spec below ``ordinal`` (admission refuses a replica the spec declares),
    then start its retirement directly, as the watcher would (on ``queue``, by default the
    test's worker's)."""
    scale(ctx, name, ordinal)
    req = RetirementRequest(
        namespace=ctx.ns, deployment=name, role="server", ordinal=ordinal, budgets=budgets
    )
    return await ctx.client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=workflow_id_for(namespace=ctx.ns, deployment=name),
        task_queue=queue or ctx.queue,
        result_type=RetirementState,
        search_attributes=initial_search_attributes(req),
    )


async def retire_routerless(
    ctx: Ctx,
    name: str,
    *,
    budgets: Budgets,
    quiet_s: float,
) -> WorkflowHandle[Any, RetirementState]:
    """Scale the spec to one replica and retire ordinal 1 of a router-less deployment
    under the quiet-window policy."""
    scale(ctx, name, 1)
    req = RetirementRequest(
        namespace=ctx.ns,
        deployment=name,
        role="server",
        ordinal=1,
        budgets=budgets,
        routerless_policy="quiet-window",
        quiet_window_s=quiet_s,
    )
    return await ctx.client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=workflow_id_for(namespace=ctx.ns, deployment=name),
        task_queue=ctx.queue,
        result_type=RetirementState,
    )


def phase_durations(st: RetirementState) -> dict[str, float]:
    tl = st.phase_timeline
    return {
        str(p): round((tl[i + 1][1] - t).total_seconds(), 2) for i, (p, t) in enumerate(tl[:-1])
    }


async def until(
    handle: WorkflowHandle[Any, RetirementState],
    check: Callable[[RetirementState], bool],
    timeout: float = 60,
) -> RetirementState:
    """Query the retirement until ``check`` holds."""
    return await eventually_async(
        lambda: handle.query(RetirementWorkflow.state),
        accept=check,
        what="retirement state",
        timeout=timeout,
    )


async def wait_state(
    handle: WorkflowHandle[Any, RetirementState],
    phase: Phase,
) -> RetirementState:
    """Until the retirement is in ``phase``."""
    return await until(handle, lambda st: st.phase is phase)


async def wait_for_outcome(
    handle: WorkflowHandle[Any, RetirementState],
    outcome: Outcome,
) -> RetirementState:
    """Until the retirement's outcome is ``outcome``."""
    return await until(handle, lambda st: st.outcome is outcome)


async def finish(handle: WorkflowHandle[Any, RetirementState], *, natural: bool = False) -> None:
    """End a retirement once the test has seen what it checks.  ``natural``: by
    cancel-intent, as the watcher would (a held one ends once every member is back and,
    after a router confirmed one by time (smg), after its re-reads, up to 120 s later);
    otherwise it is terminated at once (the test's namespace goes with the test)."""
    if natural:
        await end_retirement(handle, timeout=240)
        return
    with contextlib.suppress(RPCError):  # it may have ended already
        await handle.terminate("test over")


class Witness(threading.Thread):
    """An observer independent of the product: every 50 ms it reads what the real router
    selects (``selected``) and the victim Pod from the API server, and stamps when the
    router stopped selecting the victim, whether it selected it again afterwards, and when
    the Pod began terminating (or was gone)."""

    def __init__(self, ctx: Ctx, pod: client.V1Pod, selected: Callable[[], set[str]]) -> None:
        super().__init__(daemon=True)
        self._ctx, self._pod, self._selected = ctx, pod, selected
        self._url = f"http://{pod.status.pod_ip}:8000"
        self.dropped: float | None = None
        self.reselected = False
        self.deleting: float | None = None
        self._stop_at = time.monotonic() + 120

    def run(self) -> None:
        while self.deleting is None and time.monotonic() < self._stop_at:
            t = time.monotonic()
            try:
                chosen = self._url in self._selected()
            except Exception:
                chosen = None  # no answer: no evidence either way
            if chosen is False and self.dropped is None:
                self.dropped = t
            elif chosen and self.dropped is not None:
                self.reselected = True
            try:
                live = self._ctx.core.read_namespaced_pod(self._pod.metadata.name, self._ctx.ns)
                if live.metadata.uid != self._pod.metadata.uid or live.metadata.deletion_timestamp:
                    self.deleting = time.monotonic()
            except client.ApiException as e:
                if e.status == 404:
                    self.deleting = time.monotonic()
            time.sleep(0.05)

    def verdict(self) -> str:
        """Empty when the router dropped the victim for good before its delete began."""
        self.join(10)
        if self.deleting is None:
            return "the Pod was never seen terminating"
        if self.dropped is None or self.dropped >= self.deleting:
            return "the router still selected the victim when its delete began"
        if self.reselected:
            return "the router selected the victim again after dropping it"
        return ""


def one_request(ip: str) -> tuple[int, float]:
    with httpx.Client(trust_env=False, timeout=30) as http:
        try:
            r = http.post(
                f"http://{ip}:8000/v1/completions",
                json={"prompt": "p", "max_tokens": 16},
            )
        except httpx.HTTPError:
            return 0, time.time()
        return r.status_code, time.time()


# ---------------------------------------------------------------- engines lagging their work


async def deploy_engine(ctx: Ctx, name: str, *, engine: str, args: list[str], **op: Any) -> Any:
    """Two replicas of ``engine`` at the release the emulator's lag is cited for (SGLang
    0.5.21, vLLM 0.29.0) with ``args``, their stand-in operator started with ``op``; returns
    the ordinal-1 Pod."""
    version = "0.5.21" if engine == "SGLang" else "0.29.0"
    create_md(
        ctx.bed.api_client(),
        ctx.ns,
        model_deployment(name, engine=engine, version=version, replicas=2, extra_args=args),
    )
    ctx.bed.operator(ctx.ns, **op)
    await asyncio.to_thread(serving, ctx, name, 2)
    return pods_of(ctx, name, 1)[0]


class Straggler(threading.Thread):
    """One request sent straight to the victim's address (a client that kept a connection
    open past the withdrawal), stamping when it ended and how."""

    def __init__(self, url: str, body: dict[str, Any]) -> None:
        super().__init__(daemon=True)
        self._url, self._body = url, body
        self.status: int | None = None
        self.ended_at: float | None = None
        #: The same moment on the wall clock (to compare with a retirement's timeline).
        self.ended_wall: float | None = None
        self.error = ""

    def run(self) -> None:
        try:
            with httpx.Client(trust_env=False, timeout=60) as http:
                self.status = http.post(self._url, json=self._body).status_code
        except httpx.HTTPError as e:
            self.error = type(e).__name__
        self.ended_at, self.ended_wall = time.monotonic(), time.time()


# ---------------------------------------------------------------- the watcher as a process


#: The budgets the watchers of ``WatchCtx.watcher`` give their retirements.
BUDGETS = (
    '{"overall_s": 60, "withdrawal_s": 15, "drain_s": 8, "settle_s": 15, "poll_interval_s": 0.5}'
)


@dataclass
class WatchCtx(Ctx):
    target: str = ""
    watchers: list[Child] = field(default_factory=list)

    def watcher(self, *extra: str, name: str = "watcher") -> Child:
        child = self.bed.watcher(
            address=self.target,
            task_queue=self.queue,
            watch_namespace=self.ns,
            extra=(
                "--budgets",
                BUDGETS,
                "--routerless-policy",
                "quiet-window",
                "--quiet-window",
                "0.5",
                *extra,
            ),
            name=name,
            log_path=self.bed.state_dir / "logs" / f"{name}-{self.ns}.log",
        )
        self.watchers.append(child)
        return child


@pytest.fixture
async def wctx(
    bed: Bed,
    dev_env: WorkflowEnvironment,
    namespace: str,
) -> AsyncIterator[WatchCtx]:
    queue = f"retire-{uuid.uuid4().hex[:8]}"
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
    with ThreadPoolExecutor(max_workers=8) as pool:
        async with build_worker(dev_env.client, task_queue=queue, kube=kube, executor=pool):
            ctx = WatchCtx(
                bed=bed,
                client=dev_env.client,
                queue=queue,
                core=client.CoreV1Api(bed.api_client()),
                ns=namespace,
                target=dev_env.client.service_client.config.target_host,
            )
            try:
                yield ctx
            finally:
                for w in ctx.watchers:
                    w.stop(timeout=5)


async def runs(client_: Client, wid: str) -> list[Any]:
    return [w async for w in client_.list_workflows(f"WorkflowId = '{wid}'")]


async def state(ctx: Ctx, name: str) -> RetirementState:
    h = ctx.client.get_workflow_handle(workflow_id_for(namespace=ctx.ns, deployment=name))
    st: RetirementState = await h.query(RetirementWorkflow.state)
    return st
