"""The watcher against a fleet: how fast a scale-down becomes a started retirement, and what
each one costs, while the fleet's Pods keep changing.

Per fleet size M (default 10, 100, 500): M router-less ModelDeployments of 10 single-member
replicas each (10 M Pods, created directly with the operator's labels: a Pod that is never
retired needs no engine), the watcher as a subprocess (``Bed.watcher``, its default
``--resync`` of 60 s), a Temporal dev server and no real worker: a stand-in that holds each
started retirement Running and answers the watcher's ``state`` query
(``bench/held_retirement.py``; with no worker at all that query waits ~30 s for one); all
are terminated at the end.  A churn thread patches a label or an annotation of a random
Pod at a steady rate; meanwhile K deployments are scaled down one at a time (10 -> 9
replicas), one a second (``--interval``), each waiting for its retirement to start.

Figures per M:

* latency: from just before the spec write to the retirement's start time as Temporal
  records it (``describe`` of ``retirement/<ns>/<name>``), p50 and p99 (nearest rank: with
  K = 20, p99 is the maximum);
* API calls: ``apiserver_request_total`` (all verbs) over the measured window, minus the
  benchmark's own writes (churn patches and spec patches) and minus the background rate
  (kwok's lease heartbeats and the like) measured for a few seconds before the watcher
  started; per scale-down, and per change (scale-downs plus churn patches);
* Temporal RPCs per scale-down: the watcher's own ``retire_watcher_temporal_calls``, and
  the dev server's frontend requests minus the benchmark's own ``describe`` calls;
* the watcher's CPU (``/proc/<pid>/stat``, every thread): per change (scale-downs plus
  churn patches) and per second of the window; its idle CPU per second, measured for
  ``--idle`` seconds after it is ready and before the churn starts (the visibility query
  every 2 s, the Temporal client, timers), and the CPU per change above that idle rate;
  the CPU per change of ``--churn-only`` seconds of churn alone (before the window), and
  from it what each scale-down cost beyond that churn;
  its start-up (first healthy pass) time and CPU, and its RSS now and at peak.

Run: ``python -m bench watcher [--fleets 10,100,500] [--k 20] [--churn 10] [--interval 1]
[--idle 10] [--churn-only 10]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.common import (
    RESULTS,
    DevServer,
    apiserver_requests,
    cpu_seconds,
    diff,
    pct,
    prom_counters,
    rss_mib,
    say,
    start_temporal,
    table,
    two_panels,
    wait_until,
    with_timeout_delete_namespace,
)
from bench.held_retirement import HeldRetirement
from retirement.models import workflow_id_for
from retirement.names import GROUP, PLURAL, VERSION
from testbed import fleet
from testbed.bed import Bed
from testbed.paths import REPO_ROOT
from testbed.procs import exit_on_sigterm, free_port

PODS_PER = 10
QUEUE = "bench-held"
#: Dev server frontend operations of workers (the stand-in's), not of the watcher, and
#: DescribeWorkflowExecution, which the benchmark itself polls.
NOT_WATCHER_OPS = ("Poll", "Respond", "RecordWorker", "ShutdownWorker", "DescribeWorkflowExecution")
CHURN_KEY = "bench.llm-retire/churn"


def md_manifest(name: str, replicas: int) -> dict[str, Any]:
    """A router-less vLLM deployment of ``replicas`` single-member replicas."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "engine": {"name": "vLLM", "version": "0.29.0"},
            "roles": [{"name": "server", "kind": "Server", "replicas": replicas, "size": 1}],
        },
    }


class Churn:
    """Patches a label or an annotation of a random Pod, ``rate`` times a second."""

    def __init__(self, core: client.CoreV1Api, ns: str, pods: list[str], rate: float) -> None:
        self.core, self.ns, self.pods, self.rate = core, ns, pods, rate
        self.done = 0
        self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def start(self) -> Churn:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        rng = random.Random(7)
        i = 0
        t_next = time.monotonic()
        while not self._stop.is_set():
            i += 1
            kind = "labels" if i % 2 else "annotations"
            try:
                self.core.patch_namespaced_pod(
                    rng.choice(self.pods), self.ns, {"metadata": {kind: {CHURN_KEY: str(i)}}}
                )
                self.done += 1
            except Exception:
                self.failed += 1
            t_next += 1 / self.rate
            self._stop.wait(max(0.0, t_next - time.monotonic()))


def readyz(port: int) -> bool:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
        return int(r.status) == 200


def watcher_temporal_calls(port: int) -> dict[str, float]:
    """The watcher's ``retire_watcher_temporal_calls`` by call (empty if it has none)."""
    try:
        samples = prom_counters(f"http://127.0.0.1:{port}/metrics", "retire_watcher_temporal_calls")
    except Exception:
        return {}
    return {dict(labels).get("call", "?"): v for (_, labels), v in samples.items()}


SCALE_DOWN = {"spec": {"roles": [{"name": "server", "kind": "Server", "replicas": 9, "size": 1}]}}


async def one_fleet(
    bed: Bed,
    dev: DevServer,
    m: int,
    *,
    k: int,
    churn_rate: float,
    interval: float,
    idle_s: float = 10.0,
    churn_only_s: float = 10.0,
) -> dict[str, Any]:
    """Build a fleet of ``m`` deployments, run the watcher, measure ``k`` scale-downs."""
    ns = f"wf{m}"
    api = bed.api_client()
    api.configuration.connection_pool_maxsize = 32
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    bed.create_namespace(ns)
    names = [f"md{i:04d}" for i in range(m)]
    t = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda n: co.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, md_manifest(n, PODS_PER)
                ),
                names,
            )
        )
    pods = [fleet.member_pod(n, "server", o) for n in names for o in range(PODS_PER)]
    say(f"M={m}: {m} deployments created; creating {len(pods)} Pods")
    fleet.create_pods(core, ns, pods, parallel=16)
    fleet.wait_running(core, ns, len(pods), timeout=900, progress=say)
    setup_s = time.monotonic() - t
    say(f"M={m}: {len(pods)} Pods running after {setup_s:.1f} s")

    # Background API traffic (kwok's heartbeats, the controller manager) without the watcher.
    quiet_s = 5.0
    a0 = apiserver_requests(bed)
    await asyncio.sleep(quiet_s)
    background_per_s = sum(diff(apiserver_requests(bed), a0).values()) / quiet_s

    hp = free_port()
    t_w = time.monotonic()
    watcher = bed.watcher(
        address=dev.target,
        task_queue=QUEUE,
        watch_namespace=ns,
        log_path=bed.state_dir / "logs" / f"watcher-{ns}.log",
        resync_s=60,
        extra=("--health-address", f"127.0.0.1:{hp}"),
    )
    tc = await dev.client()
    started: list[str] = []
    holder = Worker(
        tc,
        task_queue=QUEUE,
        workflows=[HeldRetirement],
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    try:
        await holder.__aenter__()
        await asyncio.to_thread(
            wait_until, "watcher ready", lambda: watcher.alive() and readyz(hp), timeout=600
        )
        startup_s = time.monotonic() - t_w
        startup_cpu = cpu_seconds(watcher.pid)
        say(f"M={m}: watcher ready after {startup_s:.1f} s ({startup_cpu:.1f} CPU s)")
        await asyncio.sleep(3)
        cpu_i, t_i = cpu_seconds(watcher.pid), time.monotonic()
        await asyncio.sleep(idle_s)
        idle_per_s = (cpu_seconds(watcher.pid) - cpu_i) / (time.monotonic() - t_i)
        # The churn alone (no scale-down, so no reconcile that starts anything).
        churn_only = Churn(core, ns, [p["metadata"]["name"] for p in pods], churn_rate)
        cpu_c, t_c = cpu_seconds(watcher.pid), time.monotonic()
        churn_only.start()
        await asyncio.sleep(churn_only_s)
        churn_only.stop()
        churn_cpu = cpu_seconds(watcher.pid) - cpu_c - idle_per_s * (time.monotonic() - t_c)
        churn_ms = churn_cpu / max(1, churn_only.done) * 1000

        api0, fe0, tw0 = (
            apiserver_requests(bed),
            dev.frontend_requests(),
            watcher_temporal_calls(hp),
        )
        cpu0, t0 = cpu_seconds(watcher.pid), time.monotonic()
        churn = Churn(core, ns, [p["metadata"]["name"] for p in pods], churn_rate).start()
        picks = random.Random(m).sample(names, min(k, m))
        latencies: list[float] = []
        describes = 0
        for i, name in enumerate(picks):
            wid = workflow_id_for(namespace=ns, deployment=name)
            await asyncio.sleep(max(0.0, t0 + i * interval - time.monotonic()))
            t_write = time.time()
            co.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, SCALE_DOWN)
            deadline = time.monotonic() + 120
            while True:
                describes += 1
                try:
                    desc = await tc.get_workflow_handle(wid).describe()
                    break
                except RPCError as e:
                    if e.status != RPCStatusCode.NOT_FOUND or time.monotonic() > deadline:
                        raise
                await asyncio.sleep(0.05)
            started.append(wid)
            assert desc.start_time is not None
            latencies.append(desc.start_time.timestamp() - t_write)
            if (i + 1) % 5 == 0 or i + 1 == len(picks):
                say(
                    f"M={m}: {i + 1}/{len(picks)} scale-downs started "
                    f"(last {latencies[-1] * 1000:.0f} ms)"
                )
        window = time.monotonic() - t0
        churn.stop()
        cpu1 = cpu_seconds(watcher.pid)
        api1, fe1, tw1 = (
            apiserver_requests(bed),
            dev.frontend_requests(),
            watcher_temporal_calls(hp),
        )
        rss, hwm = rss_mib(watcher.pid), rss_mib(watcher.pid, "VmHWM")
        alive = watcher.alive()
    finally:
        watcher.stop(timeout=10)
        for wid in started:
            with contextlib.suppress(Exception):
                await tc.get_workflow_handle(wid).terminate("benchmark over")
        await holder.__aexit__(None, None, None)
    api_total = sum(diff(api1, api0).values())
    own = churn.done + churn.failed + len(picks)
    watcher_api = api_total - own - background_per_s * window
    fe_ops = diff(fe1, fe0)
    fe_total = sum(v for op, v in fe_ops.items() if not op.startswith(NOT_WATCHER_OPS))
    tw_calls = diff(tw1, tw0)
    say(f"M={m}: deleting the fleet")
    with_timeout_delete_namespace(core, ns)
    n = len(picks)
    changes = n + churn.done
    return {
        "m": m,
        "pods": len(pods),
        "k": n,
        "setup_s": setup_s,
        "startup_s": startup_s,
        "startup_cpu": startup_cpu,
        "p50_ms": pct(latencies, 50) * 1000,
        "p99_ms": pct(latencies, 99) * 1000,
        "max_ms": max(latencies) * 1000,
        "api_per_scale": watcher_api / n,
        "api_per_change": watcher_api / (n + churn.done),
        "temporal_watcher_per_scale": sum(tw_calls.values()) / n if tw1 else float("nan"),
        "temporal_watcher_calls": tw_calls,
        "temporal_server_ops": fe_ops,
        "describes": describes,
        "api_total": api_total,
        "api_own": own,
        "temporal_server_per_scale": fe_total / n,
        "cpu_per_scale": (cpu1 - cpu0) / n,
        "cpu_per_s": (cpu1 - cpu0) / window,
        "cpu_ms_per_change": (cpu1 - cpu0) / changes * 1000,
        "idle_cpu_per_s": idle_per_s,
        "above_idle_ms_per_change": (cpu1 - cpu0 - idle_per_s * window) / changes * 1000,
        "churn_ms_per_change": churn_ms,
        "churn_only_changes": churn_only.done,
        # What a scale-down costs beyond the churn around it (its reconcile, the start).
        "scale_ms": (cpu1 - cpu0 - idle_per_s * window - churn_ms / 1000 * churn.done) / n * 1000,
        "rss_mib": rss,
        "hwm_mib": hwm,
        "churn": churn.done,
        "churn_failed": churn.failed,
        "window_s": window,
        "background_per_s": background_per_s,
        "watcher_alive": alive,
        "latencies_ms": [x * 1000 for x in latencies],
    }


async def run(
    fleets: list[int],
    k: int,
    churn_rate: float,
    interval: float,
    idle_s: float = 10.0,
    churn_only_s: float = 10.0,
) -> list[dict[str, Any]]:
    """Every fleet size on one bed and one dev server."""
    exit_on_sigterm()
    bed = Bed(state_dir=REPO_ROOT / ".bed" / "bench-watcher")
    dev: DevServer | None = None
    results: list[dict[str, Any]] = []
    try:
        say("starting the bed and a Temporal dev server")
        bed.start()
        dev = start_temporal(bed.state_dir / "temporal")
        for m in fleets:
            results.append(
                await one_fleet(
                    bed,
                    dev,
                    m,
                    k=k,
                    churn_rate=churn_rate,
                    interval=interval,
                    idle_s=idle_s,
                    churn_only_s=churn_only_s,
                )
            )
            report(results)
    finally:
        if dev is not None:
            dev.child.stop(timeout=10)
        bed.stop()
    return results


def report(results: list[dict[str, Any]]) -> None:
    """Print the table."""
    if not results:
        return
    r0 = results[0]
    print()
    print(
        "watcher: scale-down (spec write) -> retirement started, K scale-downs per fleet, one "
        f"at a time, under {r0['churn'] / r0['window_s']:.0f} Pod label/annotation changes "
        "per second"
    )
    rows = [
        [
            r["m"],
            r["pods"],
            r["k"],
            r["p50_ms"],
            r["p99_ms"],
            r["api_per_scale"],
            r["api_per_change"],
            r["temporal_watcher_per_scale"],
            r["temporal_server_per_scale"],
            r["cpu_ms_per_change"],
            r["above_idle_ms_per_change"],
            r["churn_ms_per_change"],
            r["scale_ms"],
            r["cpu_per_s"],
            r["idle_cpu_per_s"],
            r["startup_s"],
            r["rss_mib"],
            r["hwm_mib"],
        ]
        for r in results
    ]
    print(
        table(
            [
                "M",
                "pods",
                "K",
                "p50 ms",
                "p99 ms",
                "API/scale",
                "API/change",
                "RPC/scale(w)",
                "RPC/scale(srv)",
                "CPU ms/chg",
                ">idle ms/chg",
                "churn ms/chg",
                "ms/scale",
                "CPU s/s",
                "idle CPU s/s",
                "start s",
                "RSS MiB",
                "peak MiB",
            ],
            rows,
        )
    )
    for r in results:
        print(
            f"  M={r['m']}: window {r['window_s']:.1f} s, apiserver requests {r['api_total']:.0f} "
            f"(own writes {r['api_own']}, background {r['background_per_s']:.1f}/s); "
            f"watcher Temporal calls {r['temporal_watcher_calls']}; dev server frontend "
            f"{ {k: int(v) for k, v in r['temporal_server_ops'].items()} } "
            f"(the benchmark's describes: {r['describes']}); setup {r['setup_s']:.0f} s; "
            f"watcher start-up CPU {r['startup_cpu']:.1f} s; watcher alive: {r['watcher_alive']}"
        )
    print(
        "  API = apiserver_request_total minus the benchmark's own writes and the background "
        "rate; RPC (w) = the watcher's retire_watcher_temporal_calls, (srv) = the dev "
        "server's frontend requests but workers' (Poll*, Respond*, ...) and "
        "DescribeWorkflowExecution (the benchmark polls it); "
        "start = first healthy pass; CPU ms/chg = the watcher's CPU over the window per "
        "change (scale-downs + churn patches), >idle = the same above its idle rate (idle "
        "CPU s/s, measured before the churn); churn ms/chg = above idle per change of a "
        "churn-only stretch before the window; ms/scale = what each scale-down cost beyond "
        "idle and that churn rate (its reconciles, the start)"
    )


def picture(results: list[dict[str, Any]], path: Path = RESULTS / "watcher_fleet.png") -> None:
    """Latency and cost against the fleet size, as a PNG."""
    ms = [r["m"] for r in results]
    with two_panels(path) as (lat, cost):
        lat.plot(ms, [r["p50_ms"] for r in results], "o-", label="p50")
        lat.plot(ms, [r["p99_ms"] for r in results], "s--", label="p99")
        lat.set_xscale("log")
        lat.set_xlabel("ModelDeployments (10 Pods each)")
        lat.set_ylabel("ms")
        lat.set_title("Spec write → retirement started")
        lat.legend()
        cost.plot(ms, [r["cpu_per_s"] for r in results], "o-", label="watcher CPU s per s")
        cost.plot(ms, [r["rss_mib"] / 1000 for r in results], "s--", label="watcher RSS (GiB)")
        cost.set_xscale("log")
        cost.set_xlabel("ModelDeployments (10 Pods each)")
        cost.set_title("Watcher cost under churn")
        cost.legend()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m bench watcher")
    p.add_argument("--fleets", default="10,100,500", help="fleet sizes M (deployments)")
    p.add_argument("--k", type=int, default=20, help="scale-downs per fleet")
    p.add_argument("--churn", type=float, default=10.0, help="Pod changes per second")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between scale-downs")
    p.add_argument(
        "--idle", type=float, default=10.0, help="seconds of the watcher's idle CPU measured"
    )
    p.add_argument("--churn-only", type=float, default=10.0, help="seconds of churn alone measured")
    a = p.parse_args(argv)
    fleets = [int(x) for x in a.fleets.split(",") if x.strip()]
    results = asyncio.run(
        run(fleets, a.k, a.churn, a.interval, a.idle, a.churn_only)
    )  # prints the table after each fleet
    picture(results)
    return 0
