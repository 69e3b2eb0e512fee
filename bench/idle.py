"""How fast an idle replica is retired: spec write -> its Pod deleted, through the watcher,
per real router kind, broken down step by step, beside a direct delete.

Per router (``--routers``: every real router the bed has) and for a router-less
deployment under the quiet-window policy: ``--runs`` times, a fresh two-replica vLLM
deployment whose engines are idle (``--enable-server-load-tracking`` on, so the drain
reads the engines' exact count; ``--plain`` leaves it off) is scaled 2 -> 1 by a spec
write; the watcher (a process, as deployed) starts the retirement, the worker (the
product's, in this process) runs it.  A thread reads the victim Pod every 10 ms and
stamps the moment its delete began (a deletion timestamp, or gone).

The breakdown comes from the retirement's history (server time; the server runs on this
machine, so its clock is this one): watcher reaction (spec write -> workflow started),
then each activity until the next one completed: admission, disqualify, withdrawal, drain
(its two reads and their spacing), and the delete (drain completed -> the Pod's delete
began, including the delete's last guard).  The direct figure is a spec write followed
at once by a Pod delete, as a platform team scales down without the product.

Run: ``python -m bench idle [--runs 5] [--routers sglang-router,smg,...] [--plain]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities import Kube
from bench.common import RESULTS, say, table, two_panels, vllm_manifest
from retirement.models import workflow_id_for
from retirement.names import GROUP, LABEL_ELIGIBLE, LABEL_ORDINAL, PLURAL, VERSION
from testbed.bed import ROUTERS, Bed, wait_for
from testbed.paths import REPO_ROOT
from testbed.procs import exit_on_sigterm
from testbed.temporal_dev import load_config, search_attribute_keys
from worker.__main__ import build_worker

ROUTERLESS = "router-less"
#: The steps of the breakdown, in order: the activity whose completion ends each.
STEPS = ("watcher", "admit", "disqualify", "withdraw", "drain", "delete")
LOAD_FLAG = "--enable-server-load-tracking"


class DeleteWatch(threading.Thread):
    """Stamps the moment the victim Pod's delete began: every 10 ms it reads the Pod."""

    def __init__(self, core: client.CoreV1Api, ns: str, name: str, uid: str) -> None:
        super().__init__(daemon=True)
        self._core, self._ns, self._name, self._uid = core, ns, name, uid
        self.at: float | None = None
        self._until = time.monotonic() + 300

    def run(self) -> None:
        while self.at is None and time.monotonic() < self._until:
            try:
                pod = self._core.read_namespaced_pod(self._name, self._ns)
                if pod.metadata.uid != self._uid or pod.metadata.deletion_timestamp:
                    self.at = time.time()
            except client.ApiException as e:
                if e.status == 404:
                    self.at = time.time()
            time.sleep(0.01)


def _victim(core: client.CoreV1Api, ns: str) -> client.V1Pod:
    pods = core.list_namespaced_pod(ns, label_selector=f"{LABEL_ORDINAL}=1").items
    assert len(pods) == 1, [p.metadata.name for p in pods]
    return pods[0]


def _scale(co: client.CustomObjectsApi, ns: str, name: str, replicas: int) -> None:
    md = co.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    roles = md["spec"]["roles"]
    roles[0]["replicas"] = replicas
    co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, {"spec": {"roles": roles}})


async def _breakdown(
    temporal: Client, wid: str, spec_at: float, deleted_at: float
) -> dict[str, float]:
    """Seconds per step, from the retirement's history (see the module's docstring)."""
    handle = temporal.get_workflow_handle(wid)
    history = await handle.fetch_history()
    started = None
    scheduled: dict[int, str] = {}
    done: dict[str, float] = {}
    for e in history.events:
        t = e.event_time.seconds + e.event_time.nanos / 1e9
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            started = t
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name = scheduled.get(e.activity_task_completed_event_attributes.scheduled_event_id)
            if name is not None and name not in done:
                done[name] = t  # the first completion (a drain re-run keeps its first)
            if name == "drain":
                done["drain"] = t  # the drain that led to the delete: the last one
    assert started is not None, wid
    ends = {"watcher": started, **{s: done.get(s, float("nan")) for s in STEPS[1:5]}}
    ends["delete"] = deleted_at
    out: dict[str, float] = {}
    previous = spec_at
    for step in STEPS:
        out[step] = ends[step] - previous
        previous = ends[step]
    out["total"] = deleted_at - spec_at
    return out


async def _one(
    bed: Bed, temporal: Client, target: str, queue: str, kind: str, run: int, exact: bool
) -> dict[str, Any]:
    """One idle retirement behind ``kind`` (a program of ``ROUTERS``, or router-less)."""
    api = bed.api_client()
    co, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    ns = f"idle-{kind.replace('.', '-')}-{run}"
    router = None if kind == ROUTERLESS else ROUTERS[kind]
    bed.create_namespace(ns)
    manifest = vllm_manifest(ns, router=router, extra_args=[LOAD_FLAG] if exact else [])
    co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, manifest)
    op = bed.operator(ns)
    watcher = None
    try:
        wait_for(
            f"{ns}: 2 serving",
            lambda: (
                len(core.list_namespaced_pod(ns, label_selector=f"{LABEL_ELIGIBLE}=true").items)
                == 2
            ),
            timeout=90,
        )
        if router is not None:
            bed.start_router(ns, ns, program=kind)
        extra: tuple[str, ...] = ()
        if router is None:
            extra = ("--routerless-policy", "quiet-window", "--quiet-window", "0.5")
        watcher = bed.watcher(
            address=target,
            task_queue=queue,
            watch_namespace=ns,
            extra=extra,
            log_path=bed.state_dir / "logs" / f"watcher-{ns}.log",
            name=f"watcher-{ns}",
        )
        await asyncio.sleep(3)  # the watcher lists and settles (no intent yet)
        victim = _victim(core, ns)
        watch = DeleteWatch(core, ns, victim.metadata.name, victim.metadata.uid)
        watch.start()
        spec_at = time.time()
        _scale(co, ns, ns, 1)
        await asyncio.to_thread(watch.join, 120)
        wid = workflow_id_for(namespace=ns, deployment=ns)
        if watch.at is None:
            st = await temporal.get_workflow_handle(wid).describe()
            return {"kind": kind, "run": run, "failed": f"not deleted in 120 s ({st.status})"}
        steps = await _breakdown(temporal, wid, spec_at, watch.at)
        await temporal.get_workflow_handle(wid).result()
        return {"kind": kind, "run": run, "steps": steps}
    finally:
        if watcher is not None:
            watcher.stop(timeout=5)
        op.stop()
        bed.operators.remove(op)
        from testbed.standin_operator import router_pod_name

        child = bed.routers.pop(router_pod_name(ns), None)
        if child is not None:
            child.stop(timeout=5)


def _direct(bed: Bed, runs: int) -> list[float]:
    """A spec write followed at once by a Pod delete: seconds until the delete began."""
    api = bed.api_client()
    co, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    out = []
    for run in range(runs):
        ns = f"idle-direct-{run}"
        bed.create_namespace(ns)
        co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, vllm_manifest(ns))
        op = bed.operator(ns)
        try:
            wait_for(
                f"{ns}: 2 Pods",
                lambda ns=ns: len(core.list_namespaced_pod(ns).items) == 2,
                timeout=90,
            )
            victim = _victim(core, ns)
            t0 = time.time()
            _scale(co, ns, ns, 1)
            core.delete_namespaced_pod(victim.metadata.name, ns, grace_period_seconds=0)
            out.append(time.time() - t0)
        finally:
            op.stop()
            bed.operators.remove(op)
    return out


async def run(runs: int, kinds: list[str], exact: bool) -> dict[str, Any]:
    exit_on_sigterm()
    bed = Bed(state_dir=REPO_ROOT / ".bed" / "bench")
    env = await WorkflowEnvironment.start_local(
        data_converter=pydantic_data_converter,
        ui=False,
        search_attributes=search_attribute_keys(load_config()),
        dev_server_extra_args=["--ui-disable-news-fetch"],
        dev_server_existing_path=str(REPO_ROOT / ".venv" / "bin" / "temporal"),
    )
    results: list[dict[str, Any]] = []
    try:
        say("starting the bed")
        bed.start()
        kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
        target = env.client.service_client.config.target_host
        with ThreadPoolExecutor(max_workers=16) as pool:
            async with build_worker(env.client, task_queue="idle", kube=kube, executor=pool):
                for kind in kinds:
                    for i in range(runs):
                        r = await _one(bed, env.client, target, "idle", kind, i, exact)
                        results.append(r)
                        shown = r.get("failed") or f"{r['steps']['total']:.2f} s"
                        say(f"{kind} run {i + 1}/{runs}: {shown}")
        direct = await asyncio.to_thread(_direct, bed, runs)
    finally:
        bed.stop()
        await env.shutdown()
    return {"runs": runs, "exact": exact, "results": results, "direct": direct}


def report(r: dict[str, Any]) -> None:
    mode = "exact count (GET /load)" if r["exact"] else "gauge rule only"
    print(f"\nidle: spec write -> Pod delete began, median of {r['runs']} runs ({mode}), seconds")
    rows = []
    kinds = sorted({x["kind"] for x in r["results"]}, key=lambda k: (k == ROUTERLESS, k))
    for kind in kinds:
        ok = [x["steps"] for x in r["results"] if x["kind"] == kind and "steps" in x]
        failed = sum(1 for x in r["results"] if x["kind"] == kind and "failed" in x)
        med = {
            s: statistics.median(x[s] for x in ok) if ok else float("nan")
            for s in (*STEPS, "total")
        }
        rows.append(
            [
                kind,
                *(f"{med[s]:.2f}" for s in (*STEPS, "total")),
                f"{min(x['total'] for x in ok):.2f}-{max(x['total'] for x in ok):.2f}"
                if ok
                else "-",
                failed,
            ]
        )
    direct = r["direct"]
    rows.append(["direct delete", *[""] * len(STEPS), f"{statistics.median(direct):.2f}", "", 0])
    print(table(["path", *STEPS, "total", "range", "failed"], rows))
    for x in r["results"]:
        if "failed" in x:
            print(f"  {x['kind']} run {x['run']}: {x['failed']}")


def picture(r: dict[str, Any], path: Path) -> None:
    kinds = sorted({x["kind"] for x in r["results"]}, key=lambda k: (k == ROUTERLESS, k))
    with two_panels(path) as (left, right):
        bottom = [0.0] * len(kinds)
        for step in STEPS:
            heights = []
            for kind in kinds:
                ok = [x["steps"][step] for x in r["results"] if x["kind"] == kind and "steps" in x]
                heights.append(statistics.median(ok) if ok else 0.0)
            left.barh(kinds, heights, left=bottom, label=step)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        left.set_xlabel("seconds (median)")
        left.set_title("idle replica: spec write -> delete, by step")
        left.legend(fontsize=7)
        for kind in kinds:
            totals = [
                x["steps"]["total"] for x in r["results"] if x["kind"] == kind and "steps" in x
            ]
            right.scatter(totals, [kind] * len(totals), s=14)
        right.scatter(r["direct"], ["direct delete"] * len(r["direct"]), s=14)
        right.set_xlabel("seconds, each run")
        right.set_title("every run, beside a direct delete")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench idle", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="retirements per router kind")
    known = [*sorted(ROUTERS), ROUTERLESS]
    p.add_argument(
        "--routers", default=",".join(known), help=f"comma-separated, of: {', '.join(known)}"
    )
    p.add_argument("--plain", action="store_true", help="engines without the exact count")
    args = p.parse_args(argv)
    kinds = [k for k in args.routers.split(",") if k]
    unknown = [k for k in kinds if k not in known]
    if unknown or not kinds:
        p.error(
            f"--routers: unknown {', '.join(unknown) or '(none given)'}; known: {', '.join(known)}"
        )
    r = asyncio.run(run(args.runs, kinds, not args.plain))
    report(r)
    picture(r, RESULTS / ("idle.png" if not args.plain else "idle_plain.png"))
    return 0
