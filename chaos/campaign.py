"""One fault campaign on the bed: the product as deployed (worker and watcher processes,
the Temporal dev server, real routers, the engine emulator under streaming load), a seeded
plan of scale changes and faults, a settle period, then the oracle's verdict on evidence
the product does not write.

The settle period plays the operator once: a retirement still held after the faults ended
is sent a retry token through the project's CLI (``retire retry``), as a person would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from chaos import audit as audit_log
from chaos.audit import WORKER_AGENT
from chaos.oracle import ClientFailure, Fault, Journal, Rest, Settled, converged, judge
from chaos.schedule import METRICS_FAULTS, Action, Deployment, Plan
from retirement.models import RetirementState
from retirement.names import (
    ANNOTATION_RETRY,
    GROUP,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_ORDINAL,
    PLURAL,
    VERSION,
)
from retirement.phases import Outcome
from testbed import jsonhttp
from testbed.bed import ROUTERS, Bed
from testbed.load import Load, warm_up
from testbed.procs import Child, free_port, wait_until
from testbed.standin_operator import router_pod_name
from testbed.standin_termination import PodTermination
from testbed.temporal_dev import TemporalDevConfig, load_config, start_dev_server
from testbed.worker_process import start_worker_process

QUEUE = "chaos"
QUERY = "WorkflowType = 'Retirement'"
#: The baselines' User-Agents: a scale-down that deletes the Pods at once (``plain``), or
#: gives them their grace period with a preStop sleep (``prestop``).
PLAIN_AGENT = "plain-scaledown/1"
PRESTOP_AGENT = "prestop-scaledown/1"
AGENTS = {"product": WORKER_AGENT, "plain": PLAIN_AGENT, "prestop": PRESTOP_AGENT}
MODES = tuple(AGENTS)

#: Action kinds that must not overlap one another (one key for both).
EXCLUSIVE = {
    "kill-apiserver": "apiserver",
    "stall-apiserver": "apiserver",
    "kill-router": "router",
    "stall-router": "router",
    "kill-worker": "worker",
    "pause-worker": "worker",
    "recreate": "router",  # a routed deployment's re-create restarts its router
}

#: The API server's answers that say "come back later" (a person tries again).
AWAY = frozenset({429, 500, 502, 503, 504})

#: The longest a label taken off by hand counts as a fault on its deployment's path: the
#: watcher puts it back within a reconcile, unless the watcher or the API server is down.
LABEL_BACK_S = 120.0

#: What the preStop baseline's Pods carry: the gpustack operator's own preStop settle
#: (5 s) and grace period (30 s), as the scale-down benchmark's baseline does.
PRESTOP = PodTermination(prestop_seconds=5, grace_seconds=30)


def stopped_for(pid: int, seconds: float) -> None:
    """Stop the process group ``pid`` for ``seconds`` (SIGSTOP, then SIGCONT, always)."""
    os.killpg(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)


def say(msg: str) -> None:
    """Progress, on one line."""
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def role(d: Deployment, replicas: int) -> dict[str, Any]:
    """The deployment's one Server role with ``replicas`` replicas."""
    out: dict[str, Any] = {"name": "server", "kind": "Server", "replicas": replicas, "size": d.size}
    if d.args:
        out["extraArgs"] = list(d.args)
    return out


def manifest(d: Deployment, replicas: int) -> dict[str, Any]:
    """A one-role ModelDeployment (behind the real router program of the plan, if any)."""
    engine, name = d.engine, d.name
    spec: dict[str, Any] = {
        "engine": {"name": engine, "version": "0.29.0" if engine == "vLLM" else "0.5.21"},
        "roles": [role(d, replicas)],
    }
    if d.router:
        spec["router"] = {"kind": ROUTERS[d.router]}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def start_worker(bed: Bed, target: str, n: int) -> Child:
    """The product's worker process (``python -m worker``), its log numbered ``n``."""
    return start_worker_process(bed, target=target, queue=QUEUE, tag=f"chaos-{n}")


def start_watcher(bed: Bed, target: str, n: int, namespace: str, routerless: str) -> Child:
    """The product's watcher process over the campaign's namespace, once its caches synced
    (``routerless``: its ``--routerless-policy``)."""
    child = bed.watcher(
        address=target,
        task_queue=QUEUE,
        watch_namespace=namespace,
        log_path=bed.state_dir / "logs" / f"watcher-chaos-{n}.log",
        resync_s=10.0,
        extra=("--routerless-policy", routerless),
    )
    try:
        wait_until("watcher ready", lambda: "caches synced" in child.log_tail(), timeout=60)
    except BaseException:
        child.stop(timeout=5)  # never leave a process that nothing refers to
        raise
    return child


async def restarted(start: Callable[[], Child], what: str, *, within_s: float = 180) -> Child:
    """Start a process again until it comes up (as a kubelet restarts a container that
    fails: a worker cannot start while Temporal is down, for example)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await asyncio.to_thread(start)
        except Exception as e:
            if time.monotonic() >= deadline:
                raise
            say(f"{what} did not come up ({type(e).__name__}); starting it again")
            await asyncio.sleep(3)


#: How long a restarted router's fault may last while it has no worker to route to.
ROUTER_BACK_S = 120.0


#: How long a Pod deleted by hand may stay in its router's worker list as a fault.
STALE_ROUTE_S = 300.0


def listed(url: str, program: str) -> list[Any] | None:
    """The worker items the router at ``url`` lists (vllm-router: URLs; the others:
    objects with a ``url``).  None: unreachable or unreadable."""
    vllm = ROUTERS[program] == "vllm-router"
    try:
        body = jsonhttp.call(url + ("/list_workers" if vllm else "/workers"), timeout=2)
    except (OSError, ValueError):
        return None
    items = (body or {}).get("urls" if vllm else "workers") if isinstance(body, dict) else None
    return list(items) if isinstance(items, list) else []


def addresses(url: str, program: str) -> set[str] | None:
    """The hosts of the workers the router at ``url`` lists (None: unreadable)."""
    items = listed(url, program)
    if items is None:
        return None
    out = set()
    for i in items:
        where = i.get("url", "") if isinstance(i, dict) else str(i)
        out.add(urllib.parse.urlsplit(where if "//" in where else f"//{where}").hostname or "")
    return out


def routes(url: str, program: str) -> bool:
    """Whether the router at ``url`` lists a worker it may route to (smg: ``ready``; the
    others list only what they route to).  Unreachable or unreadable: no."""
    return any(
        not isinstance(i, dict) or i.get("status", "ready") == "ready"
        for i in listed(url, program) or []
    )


def deployment_of(workflow_id: str) -> str:
    """The deployment of a retirement's workflow ID (``retirement/<ns>/<deployment>``)."""
    return workflow_id.rsplit("/", 1)[-1]


@dataclass
class Run:
    """The live campaign: the bed's processes and what was recorded along the way."""

    bed: Bed
    plan: Plan
    target: str
    temporal: Client
    worker: Child | None  #: None in a baseline mode: the product does not run
    watcher: Child | None
    ns: str
    mode: str = "product"
    #: Pods a baseline deleted (its own admission, for the oracle).
    baseline_deleted: set[str] = field(default_factory=set)
    urls: dict[str, str] = field(default_factory=dict)
    loads: dict[str, Load] = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    actions: list[tuple[float, Action]] = field(default_factory=list)
    restarts: int = 0
    replicas: dict[str, int] = field(default_factory=dict)  #: as last declared
    routerless: str = "quiet-window"  #: the watcher's --routerless-policy
    state_dir: Path = Path(".")  #: the campaign's own files (the dev server's logs, db)
    dev: Child | None = None  #: the Temporal dev server (killed and restarted by a fault)
    dev_cfg: TemporalDevConfig | None = None
    rng: random.Random = field(default_factory=random.Random)
    _busy: set[str] = field(default_factory=set)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.bed.api_client())

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.bed.api_client())

    # ------------------------------------------------------------------ the processes

    def start_worker(self) -> Child:
        self.restarts += 1
        return start_worker(self.bed, self.target, self.restarts)

    def start_watcher(self) -> Child:
        self.restarts += 1
        return start_watcher(self.bed, self.target, self.restarts, self.ns, self.routerless)

    # ------------------------------------------------------------------ actions

    async def act(self, a: Action) -> None:
        """Carry out one action (a fault runs for its duration; one of a kind at a time)."""
        kind = EXCLUSIVE.get(a.kind, a.kind)
        key = kind if a.target == "*" else f"{kind}:{a.target}"
        if key in self._busy:
            return
        self._busy.add(key)
        self.actions.append((time.time(), a))
        try:
            await getattr(self, "_" + a.kind.replace("-", "_"))(a)
        except Exception as e:  # a fault that could not be applied is reported, not fatal
            say(f"{a.kind} {a.target}: {type(e).__name__}: {e}")
        finally:
            self._busy.discard(key)

    async def _again(self, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in a thread, tried again (for up to 30 s) while the API server
        is away or not ready, as a person would: no answer, or one that says to come back
        (``AWAY``: a restarted API server answers 503 until its paths are installed)."""
        for attempt in range(30):
            try:
                return await asyncio.to_thread(call, *args)
            except client.ApiException as e:
                if e.status not in AWAY or attempt == 29:
                    raise
            except (urllib3.exceptions.HTTPError, OSError):
                if attempt == 29:
                    raise
            await asyncio.sleep(1)

    async def _md(self, call: Callable[..., Any], *args: Any) -> Any:
        """A call of the custom-objects API on the campaign's ModelDeployments
        (``call(GROUP, VERSION, namespace, PLURAL, *args)``, ``_again``)."""
        return await self._again(call, GROUP, VERSION, self.ns, PLURAL, *args)

    async def _patch_deployment(self, name: str, body: dict[str, Any]) -> None:
        """A merge patch of one of the campaign's ModelDeployments (``_again``)."""
        await self._md(self.custom.patch_namespaced_custom_object, name, body)

    async def _scale(self, a: Action) -> None:
        dep = next(d for d in self.plan.deployments if d.name == a.target)
        body = {"spec": {"roles": [role(dep, int(a.value))]}}
        await self._patch_deployment(a.target, body)
        if self.mode != "product" and a.value < self.replicas.get(a.target, 0):
            await asyncio.to_thread(self._baseline_delete, a.target, int(a.value))
        self.replicas[a.target] = int(a.value)

    def _baseline_delete(self, deployment: str, replicas: int) -> None:
        """A baseline: delete the Pods of every ordinal no longer declared (UID
        preconditioned, as a careful controller would).  ``plain``: grace 0, nothing waits
        for anything; ``prestop``: the Pod's own grace period, the emulated kubelet running
        its preStop sleep, SIGTERM (handled the engine's way) and SIGKILL."""
        api = self.bed.api_client()
        api.user_agent = AGENTS[self.mode]
        core = client.CoreV1Api(api)
        selector = f"{LABEL_INSTANCE}={deployment},{LABEL_ORDINAL}"
        for p in core.list_namespaced_pod(self.ns, label_selector=selector).items:
            if p.metadata.deletion_timestamp is not None:
                continue  # already terminating
            if int(p.metadata.labels[LABEL_ORDINAL]) >= replicas:
                self.baseline_deleted.add(p.metadata.uid)
                with contextlib.suppress(client.ApiException):
                    core.delete_namespaced_pod(
                        p.metadata.name,
                        self.ns,
                        body=client.V1DeleteOptions(
                            grace_period_seconds=0 if self.mode == "plain" else None,
                            preconditions=client.V1Preconditions(uid=p.metadata.uid),
                        ),
                    )

    async def _kill_worker(self, a: Action) -> None:
        if self.worker is None:
            return  # a baseline: no product process to kill
        t0 = time.time()
        self.worker.kill()
        try:
            await asyncio.sleep(a.value)
            self.worker = await restarted(self.start_worker, "the worker")
        finally:
            self.faults.append(Fault("kill-worker", t0, time.time(), "*"))

    async def _pause_worker(self, a: Action) -> None:
        """The worker stops for ``a.value`` s (SIGSTOP, then SIGCONT): its task queue lags,
        its activities' heartbeats time out, and their threads go on when it resumes."""
        if self.worker is None:
            return
        t0 = time.time()
        await asyncio.to_thread(stopped_for, self.worker.pid, a.value)
        self.faults.append(Fault("pause-worker", t0, time.time(), "*"))

    async def _kill_watcher(self, a: Action) -> None:
        if self.watcher is None:
            return
        t0 = time.time()
        self.watcher.kill()
        try:
            await asyncio.sleep(a.value)
            self.watcher = await restarted(self.start_watcher, "the watcher")
        finally:
            self.faults.append(Fault("kill-watcher", t0, time.time(), "*"))

    async def _kill_router(self, a: Action) -> None:
        """kill -9 a deployment's router and start it again after ``a.value`` s.  The fault
        lasts until the new router routes again: until it lists a worker it may route to
        (its Kubernetes discovery re-learned the eligible members; bounded by
        ``ROUTER_BACK_S``), not merely until its process answers."""
        dep = next(d for d in self.plan.deployments if d.name == a.target)
        assert dep.router is not None
        t0 = time.time()
        child = self.bed.routers.pop(router_pod_name(dep.name))
        child.kill()
        await asyncio.sleep(a.value)
        try:
            await self._router_back(dep.name, dep.router, "kill-router")
        finally:
            self.faults.append(Fault("kill-router", t0, time.time(), dep.name))

    async def _stall_router(self, a: Action) -> None:
        """A deployment's router stops answering for ``a.value`` s (SIGSTOP, then SIGCONT):
        its streams stall, its worker list cannot be read."""
        router = self.bed.routers.get(router_pod_name(a.target))
        if router is None:
            return  # being restarted by a kill
        t0 = time.time()
        await asyncio.to_thread(stopped_for, router.pid, a.value)
        self.faults.append(Fault("stall-router", t0, time.time(), a.target))

    async def _kill_temporal(self, a: Action) -> None:
        assert self.dev is not None and self.dev_cfg is not None
        t0 = time.time()
        self.dev.kill()
        await asyncio.sleep(a.value)
        cfg = self.dev_cfg
        self.restarts += 1
        logs = self.state_dir / "logs" / f"temporal-{self.restarts}"
        try:
            self.dev = await restarted(lambda: start_dev_server(cfg, log_dir=logs), "Temporal")
        finally:
            self.faults.append(Fault("kill-temporal", t0, time.time(), "*"))

    def _engines_of(self, deployment: str) -> list[str]:
        """The hub names of the deployment's running engines."""
        pods = self.bed.hub_call("GET", "/pods")["pods"]
        prefix = f"{deployment}-server-"
        return sorted(p["name"] for p in pods if p["name"].startswith(prefix))

    async def _engine_fault(self, a: Action, traps: dict[str, Any]) -> None:
        names = await asyncio.to_thread(self._engines_of, a.target)
        if not names:
            return
        hub = self.rng.choice(names)
        t0 = time.time()
        await asyncio.to_thread(self.bed.hub_call, "POST", f"/pods/{hub}/traps", traps)
        try:
            await asyncio.sleep(a.value)
        finally:
            with contextlib.suppress(OSError):  # the Pod may be gone meanwhile
                await asyncio.to_thread(
                    self.bed.hub_call, "POST", f"/pods/{hub}/traps", {"clear": True}
                )
            self.faults.append(Fault(a.kind, t0, time.time(), a.target))

    async def _engine_busy(self, a: Action) -> None:
        """An engine whose gauges stay up (stale after a mass abort): it never reads idle."""
        await self._engine_fault(a, {"stale_gauges": [2, 0]})

    async def _engine_metrics(self, a: Action) -> None:
        """An engine whose /metrics answers garbage (or nothing) for a while."""
        await self._engine_fault(a, {"metrics_mode": self.rng.choice(METRICS_FAULTS)})

    async def _engine_silent(self, a: Action) -> None:
        """An engine that stops producing tokens (hung): its streams go quiet, its requests
        stay in flight, its HTTP server still answers."""
        await self._engine_fault(a, {"silent": True})

    async def _restart_engine(self, a: Action) -> None:
        """An engine's container restarts: its requests are cut, its gauges start at 0."""
        names = await asyncio.to_thread(self._engines_of, a.target)
        if names:
            t0 = time.time()
            await asyncio.to_thread(
                self.bed.hub_call, "POST", f"/pods/{self.rng.choice(names)}/restart"
            )
            self.faults.append(Fault("restart-engine", t0, time.time(), a.target))

    async def _delete_pod(self, a: Action) -> None:
        """A person deletes one of the deployment's Pods (grace 0); the operator makes a
        new one if its ordinal is still declared."""
        selector = f"{LABEL_INSTANCE}={a.target},{LABEL_ORDINAL}"
        pods = await asyncio.to_thread(
            self.core.list_namespaced_pod, self.ns, label_selector=selector
        )
        live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
        if live:
            victim = self.rng.choice(sorted(live, key=lambda p: p.metadata.name))
            t0 = time.time()
            try:
                with contextlib.suppress(client.ApiException):
                    await asyncio.to_thread(
                        self.core.delete_namespaced_pod,
                        victim.metadata.name,
                        self.ns,
                        grace_period_seconds=0,
                    )
                await self._router_forgets(a.target, victim.status.pod_ip)
            finally:
                self.faults.append(Fault("delete-pod", t0, time.time(), a.target))

    async def _router_forgets(self, deployment: str, ip: str | None) -> None:
        """Wait (bounded by ``STALE_ROUTE_S``) until the deployment's router no longer
        lists the deleted Pod's address: until then it still sends requests to a Pod that
        is gone, and their failures are the deletion's (a router's discovery can lag by
        minutes after API server faults: vllm-router 0.1.17 backs off its watch up to
        128 s, then restarts it 60 s later, measured in the campaign's router logs)."""
        url = self.urls.get(deployment)
        dep = next(d for d in self.plan.deployments if d.name == deployment)
        if not url or not ip or dep.router is None:
            return
        deadline = time.monotonic() + STALE_ROUTE_S
        while time.monotonic() < deadline:
            listed = await asyncio.to_thread(addresses, self.urls[deployment], dep.router)
            if listed is not None and ip not in listed:
                return
            await asyncio.sleep(1)
        say(f"delete-pod {deployment}: its router still lists {ip} {STALE_ROUTE_S:g} s after")

    async def _stall_apiserver(self, a: Action) -> None:
        api = next(c for c in self.bed.cp.children if c.name == "kube-apiserver")
        t0 = time.time()
        os.kill(api.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(a.value)
        finally:
            os.kill(api.pid, signal.SIGCONT)
            self.faults.append(Fault("stall-apiserver", t0, time.time(), "*"))

    async def _kill_apiserver(self, a: Action) -> None:
        """kill -9 the kube-apiserver; start it again after ``a.value`` s (every client,
        the product's included, must ride it out)."""
        t0 = time.time()
        await asyncio.to_thread(self.bed.cp.kill_apiserver)
        try:
            await asyncio.sleep(a.value)
            await asyncio.to_thread(self.bed.cp.restart_apiserver)
        finally:
            self.faults.append(Fault("kill-apiserver", t0, time.time(), "*"))

    async def _second_watcher(self, a: Action) -> None:
        """A second watcher process contends for the Lease for ``a.value`` s, then dies
        (kill -9: it does not give the Lease back)."""
        if self.watcher is None:
            return  # a baseline: no product
        t0 = time.time()
        other = await asyncio.to_thread(self.start_watcher)
        try:
            await asyncio.sleep(a.value)
        finally:
            other.kill()
            self.faults.append(Fault("second-watcher", t0, time.time(), "*"))

    async def _cancel(self, a: Action) -> None:
        """A person cancels the deployment's running retirement (the Temporal UI's cancel)."""
        for wf, _st in await self.retirements(running_only=True):
            if deployment_of(wf.id) == a.target:
                t0 = time.time()
                await self.temporal.get_workflow_handle(wf.id, run_id=wf.run_id).cancel()
                self.faults.append(Fault("cancel", t0, time.time(), a.target))
                return

    async def _retry_annotation(self, a: Action) -> None:
        """A person asks for a retry of the deployment's held retirement by annotating its
        ModelDeployment (``role:ordinal:token``)."""
        for wf, st in await self.retirements(running_only=True):
            if deployment_of(wf.id) != a.target or st is None:
                continue
            if st.outcome is not Outcome.ABORTED:
                continue
            token = f"chaos-{self.rng.randrange(1 << 30):x}"
            value = f"{st.request.role}:{st.request.ordinal}:{token}"
            body = {"metadata": {"annotations": {ANNOTATION_RETRY: value}}}
            t0 = time.time()
            await self._patch_deployment(a.target, body)
            self.faults.append(Fault("retry-annotation", t0, time.time(), a.target))
            return

    async def _recreate(self, a: Action) -> None:
        """A person deletes the ModelDeployment (its Pods go by garbage collection) and
        creates it again under the same name ``a.value`` s later, as last declared.  A
        routed one's router goes with its Pod and comes back on the new router Pod's
        address: the bed's router process follows it, and so does the load.  The fault
        lasts until the new router routes again (as ``_kill_router``'s does)."""
        dep = next(d for d in self.plan.deployments if d.name == a.target)
        t0 = time.time()
        old_uid = ""
        try:
            with contextlib.suppress(client.ApiException):
                old = await self._md(self.custom.get_namespaced_custom_object, dep.name)
                old_uid = str(old["metadata"]["uid"])
            try:
                await self._md(self.custom.delete_namespaced_custom_object, dep.name)
            except client.ApiException as e:
                if e.status != 404:  # 404: an earlier try deleted it, its answer lost
                    raise
            if dep.router:
                await self._router_pod_gone(dep.name)
                child = self.bed.routers.pop(router_pod_name(dep.name), None)
                if child is not None:
                    child.kill()
            await asyncio.sleep(a.value)
            for _ in range(120):  # until the API server has removed it (finalizers)
                try:
                    await self._md(self.custom.get_namespaced_custom_object, dep.name)
                except client.ApiException as e:
                    if e.status == 404:
                        break
                    raise
                await asyncio.sleep(0.5)
            body = manifest(dep, self.replicas.get(dep.name, 2))
            try:
                await self._md(self.custom.create_namespaced_custom_object, body)
            except client.ApiException as e:
                if e.status != 409:  # 409: an earlier try was created, its answer lost
                    raise
            if dep.router:
                await self._router_back(dep.name, dep.router, "recreate")
            await self._owned_pods_gone(old_uid)
        finally:
            self.faults.append(Fault("recreate", t0, time.time(), dep.name))

    async def _owned_pods_gone(self, owner_uid: str, *, timeout: float = 120.0) -> None:
        """Wait (bounded) until the garbage collector has deleted every Pod of the deleted
        deployment ``owner_uid``: until then one may serve through the new router and be
        cut when it goes (the 24-minute run of 5192d62: c01-server-1 of the old deployment
        went 24 s after the others and cut a request the new router had sent it)."""
        deadline = time.monotonic() + timeout
        while owner_uid and time.monotonic() < deadline:
            try:
                pods = await asyncio.to_thread(self.core.list_namespaced_pod, self.ns)
            except (client.ApiException, urllib3.exceptions.HTTPError, OSError):
                pods = None  # the API server is away: not known yet
            if pods is not None and not any(
                ref.uid == owner_uid
                for p in pods.items
                for ref in (p.metadata.owner_references or [])
            ):
                return
            await asyncio.sleep(1)

    async def _router_pod_gone(self, deployment: str, *, timeout: float = 30.0) -> None:
        """Wait (bounded) until the deployment's router Pod is gone or going: its process
        dies with it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pod = await asyncio.to_thread(
                    self.core.read_namespaced_pod, router_pod_name(deployment), self.ns
                )
                if pod.metadata.deletion_timestamp is not None:
                    return
            except client.ApiException as e:
                if e.status == 404:
                    return
            except (urllib3.exceptions.HTTPError, OSError):
                pass  # the API server is away: not known yet
            await asyncio.sleep(0.5)

    async def _router_back(self, deployment: str, program: str, why: str) -> str:
        """Start the deployment's router again on its router Pod's (current) address, point
        the deployment's load at it, and wait until it routes (bounded by
        ``ROUTER_BACK_S``).  Returns its URL."""
        url = await asyncio.to_thread(
            self.bed.start_router, self.ns, deployment, program=program, timeout=60
        )
        self.urls[deployment] = url
        load = self.loads.get(deployment)
        if load is not None:
            load.url = url  # its streams read it for each request
        deadline = time.monotonic() + ROUTER_BACK_S
        while time.monotonic() < deadline:
            if await asyncio.to_thread(routes, url, program):
                return url
            await asyncio.sleep(0.5)
        say(f"{why} {deployment}: no routable worker {ROUTER_BACK_S:g} s after")
        return url

    async def _relabel(self, a: Action) -> None:
        """A person puts the eligibility label back on the deployment's unlabelled Pods."""
        pods = await asyncio.to_thread(
            self.core.list_namespaced_pod,
            self.ns,
            label_selector=f"{LABEL_INSTANCE}={a.target},{LABEL_ORDINAL}",  # members only
        )
        t0 = time.time()
        for p in pods.items:
            labels = p.metadata.labels or {}
            if p.metadata.deletion_timestamp is None and labels.get(LABEL_ELIGIBLE) != "true":
                body = {"metadata": {"labels": {LABEL_ELIGIBLE: "true"}}}
                await asyncio.to_thread(
                    self.core.patch_namespaced_pod, p.metadata.name, self.ns, body
                )
                self.faults.append(Fault("relabel", t0, time.time(), a.target))

    async def _unlabel(self, a: Action) -> None:
        """A person takes the eligibility label off one of the deployment's serving member
        Pods: the routers stop selecting it until the watcher puts it back (when no
        retirement names it).  The fault lasts until the label is back (or the Pod gone),
        at most ``LABEL_BACK_S``.  Not on a group's member: the label of a member of a
        group goes back only after the restore's identity probe (or with the operator's
        new Pod), which the watcher cannot run (``retirement.eligibility``), so nothing
        would ever repair it; the plan's action is then carried out as nothing."""
        dep = next(d for d in self.plan.deployments if d.name == a.target)
        if dep.size > 1:
            return
        pods = await asyncio.to_thread(
            self.core.list_namespaced_pod,
            self.ns,
            label_selector=f"{LABEL_INSTANCE}={a.target},{LABEL_ORDINAL},{LABEL_ELIGIBLE}=true",
        )
        live = [p for p in pods.items if p.metadata.deletion_timestamp is None]
        if not live:
            return
        victim = self.rng.choice(sorted(live, key=lambda p: p.metadata.name))
        t0 = time.time()
        key = LABEL_ELIGIBLE.replace("~", "~0").replace("/", "~1")
        body = [{"op": "remove", "path": f"/metadata/labels/{key}"}]  # a JSON patch
        try:
            with contextlib.suppress(client.ApiException):  # gone or relabelled meanwhile
                await asyncio.to_thread(
                    self.core.patch_namespaced_pod, victim.metadata.name, self.ns, body
                )
            deadline = time.monotonic() + LABEL_BACK_S
            while time.monotonic() < deadline:
                if await asyncio.to_thread(self._labelled_or_gone, victim.metadata.uid):
                    break
                await asyncio.sleep(0.5)
        finally:
            self.faults.append(Fault("unlabel", t0, time.time(), a.target))

    def _labelled_or_gone(self, uid: str) -> bool:
        """Whether the Pod ``uid`` carries the eligibility label again, or is gone or
        terminating (an unreadable API server: not yet)."""
        try:
            pods = self.core.list_namespaced_pod(self.ns, label_selector=LABEL_ORDINAL)
        except (client.ApiException, urllib3.exceptions.HTTPError, OSError):
            return False
        for p in pods.items:
            if p.metadata.uid == uid:
                labelled = (p.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true"
                return labelled or p.metadata.deletion_timestamp is not None
        return True

    # ------------------------------------------------------------------ settle and judge

    async def retirements(self, *, running_only: bool) -> list[tuple[Any, RetirementState | None]]:
        """Every retirement run (or the running ones) with its state (None: unreadable)."""
        query = QUERY + (" AND ExecutionStatus = 'Running'" if running_only else "")
        out = []
        async for wf in self.temporal.list_workflows(query):
            handle = self.temporal.get_workflow_handle(
                wf.id, run_id=wf.run_id, result_type=RetirementState
            )
            st: RetirementState | None = None
            with contextlib.suppress(Exception):
                if wf.status == WorkflowExecutionStatus.RUNNING:  # a query: a worker answers
                    st = await asyncio.wait_for(
                        handle.query("state", result_type=RetirementState), timeout=20
                    )
                else:  # an ended run's state is its result (continued-as-new: none)
                    st = await asyncio.wait_for(handle.result(follow_runs=False), timeout=20)
            out.append((wf, st))
        return out

    async def retry_held(self) -> int:
        """Send a retry token (the project's CLI) to every held retirement."""
        sent = 0
        for _wf, st in await self.retirements(running_only=True):
            if st is None or st.outcome is not Outcome.ABORTED:
                continue
            ref = f"{st.request.namespace}/{st.request.deployment}"
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "cli",
                "retry",
                ref,
                "--address",
                self.target,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            out, _ = await proc.communicate()
            say(f"retry {ref}: {out.decode(errors='replace').strip()[:160]}")
            sent += 1
        return sent

    def settled(self, running: dict[str, tuple[int, int]]) -> list[Settled]:
        """Each deployment as it stands: declared, present and eligible Pods."""
        out = []
        for dep in self.plan.deployments:
            try:
                md = self.custom.get_namespaced_custom_object(
                    GROUP, VERSION, self.ns, PLURAL, dep.name
                )
            except client.ApiException as e:
                if e.status != 404:
                    raise
                out.append(Settled(dep.name, 0, 0, 0, 0, missing=True))
                continue
            replicas = sum(int(r.get("replicas", 0)) for r in md["spec"]["roles"])
            declared = replicas * dep.size
            pods = [
                p
                for p in self.core.list_namespaced_pod(
                    self.ns, label_selector=f"{LABEL_INSTANCE}={dep.name},{LABEL_ORDINAL}"
                ).items
                if p.metadata.deletion_timestamp is None
            ]
            eligible = sum((p.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true" for p in pods)
            n, by_policy = running.get(dep.name, (0, 0))
            serving = replicas * dep.serving_members
            out.append(Settled(dep.name, declared, len(pods), eligible, n, by_policy, serving))
        return out

    async def running_by_deployment(self) -> dict[str, tuple[int, int]]:
        """Running retirements per deployment, and how many of them the router-less hold
        policy holds (held, its reason naming the policy)."""
        counts: dict[str, tuple[int, int]] = {}
        for wf, st in await self.retirements(running_only=True):
            name = deployment_of(wf.id)  # known whether or not its state could be read
            by_policy = (
                st is not None
                and st.outcome is Outcome.ABORTED
                and any("(policy hold)" in r for r in st.reasons)
            )
            n, held = counts.get(name, (0, 0))
            counts[name] = (n + 1, held + by_policy)
        return counts


async def settle(run: Run, *, seconds: float) -> list[Settled]:
    """After the faults: retry held retirements, then wait (bounded) for convergence."""
    deadline = time.monotonic() + seconds
    retried_at = time.monotonic() + min(30.0, seconds / 3)
    retried = False
    while True:
        running = await run.running_by_deployment()
        now = await asyncio.to_thread(run.settled, running)
        if all(converged(s) is None for s in now):
            return now
        if time.monotonic() >= deadline:
            return now
        if not retried and time.monotonic() >= retried_at:
            retried = True
            n = await run.retry_held()
            say(f"settle: {n} held retirement(s) sent a retry token")
        await asyncio.sleep(3)


def evidence_failures(run: Run) -> list[ClientFailure]:
    return [
        ClientFailure(name, start, end, kind)
        for name, load in run.loads.items()
        for start, end, kind in load.failed_spans
    ]


async def campaign(
    plan: Plan,
    *,
    bed: Bed,
    namespace: str,
    state_dir: Path,
    settle_s: float,
    streams: int,
    mode: str = "product",
    routerless: str = "quiet-window",
) -> dict[str, Any]:
    """Run ``plan`` in ``namespace`` of a running ``bed`` (its own Temporal dev server, worker
    and watcher, under ``state_dir``); returns the report's data (``verdict`` included).
    ``mode="plain"``: the same plan without the product, each scale-down deleting the
    Pods at once; ``mode="prestop"``: deleting them with the Pods' preStop sleep and grace
    period (the baselines the report compares with).  ``routerless``: the watcher's
    router-less policy (``hold`` keeps a router-less replica until a person decides)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    product = mode == "product"
    dev = None
    run: Run | None = None
    t_start = time.time()
    audit_from = bed.cp.audit_log.stat().st_size if bed.cp.audit_log.exists() else 0
    try:
        cfg = load_config().with_ports(
            port=free_port("127.0.0.1"),
            http_port=free_port("127.0.0.1"),
            ui_port=free_port("127.0.0.1"),
            metrics_port=free_port("127.0.0.1"),
            db_filename=state_dir / "temporal.db",
        )
        cfg.db_filename.unlink(missing_ok=True)
        dev = start_dev_server(cfg, log_dir=state_dir / "logs")
        temporal = await Client.connect(
            cfg.address, namespace=cfg.namespace, data_converter=pydantic_data_converter
        )
        custom = client.CustomObjectsApi(bed.api_client())
        for d in plan.deployments:
            custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, manifest(d, 2)
            )
        bed.operator(namespace, termination=PRESTOP if mode == "prestop" else None)
        core = client.CoreV1Api(bed.api_client())
        want = sum(2 * d.serving_members for d in plan.deployments)
        wait_until(
            f"{want} serving Pods",
            lambda: (
                len(
                    core.list_namespaced_pod(
                        namespace, label_selector=f"{LABEL_ELIGIBLE}=true"
                    ).items
                )
                >= want
            ),
            timeout=180,
        )
        run = Run(
            bed=bed,
            plan=plan,
            target=cfg.address,
            temporal=temporal,
            worker=start_worker(bed, cfg.address, 0) if product else None,
            watcher=start_watcher(bed, cfg.address, 0, namespace, routerless) if product else None,
            routerless=routerless,
            ns=namespace,
            mode=mode,
            replicas={d.name: 2 for d in plan.deployments},
            dev=dev,
            dev_cfg=cfg,
            state_dir=state_dir,
            rng=random.Random(plan.seed),
        )
        for d in plan.deployments:
            if d.router:
                run.urls[d.name] = bed.start_router(namespace, d.name, program=d.router)
        for name, url in run.urls.items():
            warm_up(url)
            run.loads[name] = Load(
                url,
                streams=streams,
                min_s=0.5,
                max_s=4.0,
                max_duration_s=plan.seconds + settle_s + 120,
                pause_after_failure_s=0.25,
            ).start()
        say(
            f"{len(plan.deployments)} deployments serving, load on {len(run.loads)}; "
            f"{len(plan.actions)} actions over {plan.seconds:g} s"
        )
        t0 = time.monotonic()
        tasks = []
        for i, a in enumerate(plan.actions):
            await asyncio.sleep(max(0.0, t0 + a.at - time.monotonic()))
            tasks.append(asyncio.create_task(run.act(a)))
            if i % 10 == 0:
                say(f"action {i + 1}/{len(plan.actions)}: {a.kind} {a.target} {a.value:g}")
        await asyncio.sleep(max(0.0, t0 + plan.seconds - time.monotonic()))
        await asyncio.gather(*tasks)
        faults_over = time.time()
        say(f"faults over; settling (at most {settle_s:g} s)")
        settled = await settle(run, seconds=settle_s)
        await asyncio.sleep(3)
        for load in run.loads.values():
            await asyncio.to_thread(load.stop)
        states = await run.retirements(running_only=False)
        admitted = {
            m.uid
            for _wf, st in states
            if st is not None and st.target is not None
            for m in st.target.members
        } | run.baseline_deleted
        journals = {
            name: Journal([(e[0], e[1], e[2]) for e in j["ended"]], list(j["open"]))
            for name, j in bed.hub_call("GET", "/journal")["pods"].items()
        }
        audit = audit_log.read_file(bed.cp.audit_log, offset=audit_from).only(namespace)
        failures = evidence_failures(run)
        verdict = judge(
            audit=audit,
            journals=journals,
            admitted_uids=admitted,
            faults=run.faults,
            failures=failures,
            settled=settled,
            agent=AGENTS[mode],
            graceful=mode == "prestop",
            rests=[
                Rest(
                    f"{wf.id} {wf.run_id}",
                    [(str(p), t.timestamp()) for p, t in st.phase_timeline],
                    wf.history_length,
                    wf.close_time.timestamp() if wf.close_time else None,
                )
                for wf, st in states
                if st is not None
            ],
            faults_over=faults_over,
            ended=time.time(),
            deployments=[d.name for d in plan.deployments],
            completed=sum(
                1
                for _wf, st in states
                if st is not None and st.outcome in (Outcome.COMPLETED, Outcome.COMPLETED_UNSETTLED)
            ),
            unreadable=[
                wf.id
                for wf, st in states
                if st is None and wf.status != WorkflowExecutionStatus.CONTINUED_AS_NEW
            ],
        )
        outcomes: dict[str, int] = {}
        for wf, st in states:
            if st is not None:
                key = str(st.outcome)
            elif wf.status == WorkflowExecutionStatus.CONTINUED_AS_NEW:
                key = "ContinuedAsNew"  # its state lives on in the next run
            else:
                key = "unreadable"
            outcomes[key] = outcomes.get(key, 0) + 1
        return {
            "seed": plan.seed,
            "seconds": plan.seconds,
            "deployments": [d.__dict__ for d in plan.deployments],
            "started": t_start,
            "faults_over": faults_over,
            "ended": time.time(),
            "actions": [(t, a.kind, a.target, a.value) for t, a in run.actions],
            "faults": [f.__dict__ for f in run.faults],
            "retirements": len(states),
            "outcomes": outcomes,
            "timelines": [
                (
                    st.request.deployment,
                    [(str(p), t.timestamp()) for p, t in st.phase_timeline],
                    str(st.outcome),
                )
                for _wf, st in states
                if st is not None
            ],
            "running_at_end": [
                (st.request.deployment, str(st.outcome), st.reasons[-1] if st.reasons else "")
                for wf, st in states
                if st is not None and wf.status == WorkflowExecutionStatus.RUNNING
            ],
            "deletes": [(d.at, d.namespace, d.name, d.agent) for d in audit.deletes],
            "mode": mode,
            "worker_deletes": sum(d.by_worker for d in audit.deletes),
            "judged_deletes": verdict.checked["in-flight"],
            "execs": len(audit.execs),
            "exec_agents": sorted({agent for _ns, agent in audit.execs}),
            "requests": {n: (ld.ok, ld.failed) for n, ld in run.loads.items()},
            "failures": [f.__dict__ for f in failures],
            "settled": [s.__dict__ for s in settled],
            "verdict": verdict,
        }
    finally:
        if run is not None:
            for load in run.loads.values():
                load._stop.set()
            for c in (run.watcher, run.worker):
                if c is not None:
                    with contextlib.suppress(Exception):
                        c.stop(timeout=5)
        last = run.dev if run is not None and run.dev is not None else dev
        if last is not None:
            last.stop(timeout=10)
