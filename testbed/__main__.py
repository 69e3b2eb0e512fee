"""``python -m testbed demo``: the main job on the embedded default.

Brings up the Temporal dev server with its Web UI (from ``temporal-dev.yaml``) and the local
Kubernetes test cluster with a vLLM and an SGLang ModelDeployment (2 replicas each) behind
the real SGLang model gateway, runs the worker, puts a steady load through the gateway,
runs the watcher, scales the vLLM deployment down so the watcher retires the surplus
replica — printing each phase, the
workflow's address in the UI, and the load's error count.  Ctrl-C stops everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from kube.client import Kube
from retirement.models import RetirementState, workflow_id_for
from retirement.names import GROUP, PLURAL, VERSION
from retirement.phases import Outcome
from testbed.bed import ROUTERS, Bed, wait_for
from testbed.load import Load
from testbed.paths import REPO_ROOT, missing_binaries
from testbed.procs import Child
from testbed.temporal_dev import load_config, start_dev_server
from worker.__main__ import build_worker
from workflows.retirement import RetirementWorkflow

NS = "demo"
#: (name, engine, router program): one deployment behind vllm-router, one behind the SGLang
#: model gateway, each router a real process with service discovery on the bed.
DEPLOYMENTS = [("llama", "vLLM", "vllm-router"), ("qwen", "SGLang", "sglang-router")]


def say(msg: str) -> None:
    """Progress for the person watching."""
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def manifest(name: str, engine: str, router: str) -> dict[str, Any]:
    """A 2-replica ModelDeployment behind a router of kind ``router``."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "engine": {"name": engine, "version": "0.29.0" if engine == "vLLM" else "0.5.21"},
            "router": {"kind": router},
            "roles": [{"name": "server", "kind": "Server", "replicas": 2, "size": 1}],
        },
    }


async def demo(args: argparse.Namespace) -> int:
    """Run the demo until Ctrl-C (or once, with --once)."""
    if missing_binaries():
        print("control-plane binaries are missing: run `make bins` first", file=sys.stderr)
        return 1
    cfg = load_config()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    say("starting the Temporal dev server (temporal-dev.yaml)")
    temporal = start_dev_server(cfg, log_dir=REPO_ROOT / ".bed" / "demo-temporal")
    bed = Bed(state_dir=REPO_ROOT / ".bed" / "demo")
    load: Load | None = None
    watcher: Child | None = None
    try:
        say("starting etcd, kube-apiserver, kube-controller-manager, kwok")
        bed.start()
        say(f"cluster up in {bed.cp.timings['ready']:.1f} s at {bed.cp.server}")
        bed.create_namespace(NS)
        api = bed.api_client()
        co = client.CustomObjectsApi(api)
        for name, engine, router in DEPLOYMENTS:
            co.create_namespaced_custom_object(
                GROUP, VERSION, NS, PLURAL, manifest(name, engine, ROUTERS[router])
            )
        bed.operator(NS, request_seconds=2.0)
        core = client.CoreV1Api(api)
        wait_for(
            "4 serving member Pods",
            lambda: (
                len(
                    [
                        p
                        for p in core.list_namespaced_pod(
                            NS, label_selector="modeldeployment.gpustack.ai/endpoint-eligible=true"
                        ).items
                    ]
                )
                == 4
            ),
            timeout=90,
        )
        routers = {name: bed.start_router(NS, name, program=p) for name, _, p in DEPLOYMENTS}
        say(
            "ModelDeployments llama (vLLM, behind vllm-router) and qwen (SGLang, behind the "
            "SGLang model gateway), 2 replicas each:"
        )
        print(f"    kubectl --kubeconfig {bed.cp.kubeconfig} get md,pods -n {NS} -o wide")
        print(f"    Temporal UI: {cfg.ui_url}")
        tc = await Client.connect(
            cfg.address, namespace=cfg.namespace, data_converter=pydantic_data_converter
        )
        kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
        with ThreadPoolExecutor(max_workers=8) as pool:
            async with build_worker(tc, task_queue=cfg.task_queue, kube=kube, executor=pool):
                say(f"worker on task queue {cfg.task_queue!r}")
                watcher = bed.watcher(
                    address=cfg.address,
                    task_queue=cfg.task_queue,
                    watch_namespace=NS,
                    resync_s=2,
                    extra=("--temporal-namespace", cfg.namespace),
                    log_path=REPO_ROOT / ".bed" / "demo" / "logs" / "watcher.log",
                )
                say(f"watcher running (log: {watcher.log_path})")
                if not args.no_retire:
                    load = Load(
                        routers["llama"], streams=args.streams, min_s=1, max_s=5, max_duration_s=900
                    ).start()
                    say(
                        f"load: {args.streams} request streams (1-5 s each) through "
                        "llama's vllm-router"
                    )
                    await asyncio.sleep(3)
                    await retire_one(tc, co, cfg.ui_url)
                    await asyncio.sleep(2)
                    ok, failed = load.stop()
                    load = None
                    say(f"load: {ok} requests ok, {failed} failed")
                print_operating_help(cfg.address)
                if args.once:
                    return 0
                say("everything keeps running; Ctrl-C stops it")
                await stop.wait()
    finally:
        if load is not None:
            load.stop()
        if watcher is not None:
            watcher.stop()
        say("stopping")
        bed.stop()
        temporal.stop()
        say("stopped; no process left behind")
    return 0


async def retire_one(tc: Client, co: client.CustomObjectsApi, ui: str) -> None:
    """Scale llama 2 → 1; the watcher retires ordinal 1; print each phase."""
    wid = workflow_id_for(namespace=NS, deployment="llama")
    with contextlib.suppress(Exception):  # a retirement left by an earlier demo run
        await tc.get_workflow_handle(wid).terminate("demo restart")
    md = co.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "llama")
    roles = md["spec"]["roles"]
    roles[0]["replicas"] = 1
    co.patch_namespaced_custom_object(
        GROUP, VERSION, NS, PLURAL, "llama", {"spec": {"roles": roles}}
    )
    say("scaled llama to 1 replica (kubectl would do the same); the watcher takes it from here")
    handle = tc.get_workflow_handle(wid, result_type=RetirementState)
    while True:
        try:
            st: RetirementState = await handle.query(RetirementWorkflow.state)
            if st.outcome is Outcome.RUNNING or st.phase_timeline:
                break
        except Exception:
            pass
        await asyncio.sleep(0.2)
    say(f"workflow: {ui}/namespaces/default/workflows/{urllib.parse.quote(wid, safe='')}")
    seen = 0
    while True:
        st = await handle.query(RetirementWorkflow.state)
        for phase, at in st.phase_timeline[seen:]:
            say(f"  phase {phase:<12} at {at.strftime('%H:%M:%S.%f')[:-3]}")
        seen = len(st.phase_timeline)
        if st.outcome is not Outcome.RUNNING:
            break
        await asyncio.sleep(0.2)
    tl = st.phase_timeline
    spans = ", ".join(
        f"{p} {(tl[i + 1][1] - t).total_seconds():.2f} s" for i, (p, t) in enumerate(tl[:-1])
    )
    say(f"retirement {st.outcome}: {spans}")
    for r in st.reasons:
        print(f"    {r}")


def print_operating_help(address: str) -> None:
    """How a person aborts or retries a retirement."""
    wid = workflow_id_for(namespace=NS, deployment="llama")
    print(f"""
To abort or retry a retirement (workflow ID {wid}):
    temporal workflow update execute --address {address} --workflow-id {wid} \\
        --name abort --input '{{"reason": "on-call"}}'
    temporal workflow signal --address {address} --workflow-id {wid} \\
        --name retry --input '{{"token": "t1"}}'
    tctl --address {address} workflow signal --workflow_id {wid} \\
        --name retry --input '{{"token": "t1"}}'
    .venv/bin/retire --address {address} abort {NS}/llama --reason on-call
    .venv/bin/retire --address {address} retry {NS}/llama --token t1
    kubectl annotate md llama -n {NS} modeldeployment.gpustack.ai/retirement-retry=server:1:t1
(tctl is not installable here: the Go module proxy refuses github.com/temporalio/tctl.)
""")


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m testbed")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="the main job on the embedded default")
    d.add_argument("--no-retire", action="store_true", help="only bring everything up")
    d.add_argument("--once", action="store_true", help="exit after the retirement")
    d.add_argument("--streams", type=int, default=20)
    args = p.parse_args(argv)
    if args.streams < 1 or args.streams > 200:
        p.error("--streams must be 1-200")
    return asyncio.run(demo(args))


if __name__ == "__main__":
    raise SystemExit(main())
