"""The product's headline figure: failed requests during a scale-down under load, per real
router, beside the two ways platform teams scale down without it.

Per real router (``--routers``; by default every one the bed has: the SGLang gateway
``sglang-router`` 0.3.2, its successor ``smg`` 1.13.0, ``vllm-router`` 0.1.17 and the
0.1.15 gpustack pins), three identical vLLM deployments (2 replicas each, each behind its
own instance of that router) carry the same load: N streams of 1-5 s streaming requests
each (``--longest`` sets the 5).  Each is scaled 2 -> 1 a different way:

- the product's: the watcher retires the replica (disqualify, withdraw, drain, delete);
- Pod deleted directly: the spec is scaled and the Pod deleted with grace 0;
- the preStop baseline: the spec is scaled and the Pod deleted with its own termination
  settings, a preStop ``sleep 5`` and a 30 s grace period (the gpustack defaults).  The
  Pod stays, terminating, while its emulated kubelet runs the hook, then SIGTERM, which
  the emulated vLLM handles as the real one does (``--shutdown-timeout 0``: every request
  in flight is aborted and the process exits; ``testbed/emulator/termination.py``), then
  SIGKILL at 30 s if it were still running.

One bed serves every router, one after the other.  The failed-request counts are printed
side by side in one table, and ``bench/results/scale_down.png`` shows them with each
retirement's phases.
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities import Kube
from bench.common import RESULTS, two_panels
from retirement.models import RetirementState, workflow_id_for
from retirement.names import GROUP, LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ORDINAL, PLURAL, VERSION
from testbed.bed import ROUTERS, Bed, wait_for
from testbed.load import Load, warm_up
from testbed.paths import REPO_ROOT, venv_bin
from testbed.procs import exit_on_sigterm
from testbed.standin_operator import StandInOperator, router_pod_name
from testbed.standin_termination import PodTermination
from testbed.temporal_dev import load_config, search_attribute_keys
from worker.__main__ import build_worker

#: The three ways to scale down, in the table's order, with their labels.
PATHS = {
    "product": "watcher retirement (this product)",
    "direct": "Pod deleted directly",
    "prestop": "preStop sleep 5 s + grace 30 s",
}
#: The preStop baseline's Pod settings (the gpustack defaults).
PRESTOP = PodTermination(prestop_seconds=5, grace_seconds=30)


def slug(program: str) -> str:
    """A router program's name as a DNS label part (its runs' namespaces are named so)."""
    return "".join(c if c.isalnum() else "-" for c in program.lower())


def say(msg: str) -> None:
    """Progress."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def md(name: str, router: str) -> dict[str, Any]:
    """A 2-replica vLLM deployment behind a router of kind ``router`` (the CRD's kind)."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "engine": {"name": "vLLM", "version": "0.29.0"},
            "router": {"kind": router},
            "roles": [{"name": "server", "replicas": 2, "size": 1}],
        },
    }


def scale_to_one(co: client.CustomObjectsApi, ns: str, name: str) -> None:
    """Patch the spec to one replica."""
    co.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        ns,
        PLURAL,
        name,
        {"spec": {"roles": [{"name": "server", "replicas": 1, "size": 1}]}},
    )


def ordinal_one(core: client.CoreV1Api, ns: str) -> list[client.V1Pod]:
    """The Pods of the deployment's ordinal 1 (the one each path removes)."""
    selector = f"{LABEL_INSTANCE}={ns},{LABEL_ORDINAL}=1"
    return list(core.list_namespaced_pod(ns, label_selector=selector).items)


class TerminationWatch:
    """Follows a Pod's emulated termination in the hub: when each phase was first seen
    (seconds since the deletion) and how the process ended."""

    def __init__(self, bed: Bed, hub_name: str, t0: float) -> None:
        self.phases: list[tuple[str, float]] = []
        self.exit: str | None = None
        self._stop = threading.Event()

        def run() -> None:
            while not self._stop.is_set():
                try:
                    status = bed.hub_call("GET", f"/pods/{hub_name}")
                except OSError:
                    return  # gone: the Pod was removed and its emulator with it
                term = status.get("termination") or {}
                phase = str(term.get("phase"))
                if not self.phases or self.phases[-1][0] != phase:
                    self.phases.append((phase, time.monotonic() - t0))
                if term.get("exit"):
                    self.exit = str(term["exit"])
                self._stop.wait(0.05)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop following."""
        self._stop.set()
        self._thread.join(5)


async def one_router(
    bed: Bed,
    temporal: Client,
    target: str,
    queue: str,
    kind: str,
    streams: int,
    longest_s: float,
    settle_s: float,
) -> dict[str, Any]:
    """The three scale-downs behind the real router ``kind`` (a program of ``ROUTERS``),
    under the same load."""
    api = bed.api_client()
    co, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    names = {path: f"{path}-{slug(kind)}" for path in PATHS}  # namespace = deployment
    operators: list[StandInOperator] = []
    for path, ns in names.items():
        bed.create_namespace(ns)
        co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, md(ns, ROUTERS[kind]))
        if path == "prestop":
            op = StandInOperator(
                api=bed.api_client(), namespace=ns, hub_url=bed.hub_url, termination=PRESTOP
            ).start()
            bed.operators.append(op)
        else:
            op = bed.operator(ns)
        operators.append(op)
    for ns in names.values():
        wait_for(
            f"{ns}: 2 serving",
            lambda ns=ns: (
                len(core.list_namespaced_pod(ns, label_selector=f"{LABEL_ELIGIBLE}=true").items)
                == 2
            ),
            timeout=90,
        )
    urls = {path: bed.start_router(ns, ns, program=kind) for path, ns in names.items()}
    cold = {path: warm_up(url) for path, url in urls.items()}
    say(f"{kind}: 3 deployments ready behind their routers (warm-up failures: {cold})")
    watcher = bed.watcher(
        address=target,
        task_queue=queue,
        watch_namespace=names["product"],
        log_path=bed.state_dir / "logs" / f"watcher-{kind}.log",
        name=f"watcher-{kind}",
    )
    watch: TerminationWatch | None = None
    try:
        loads = {
            path: Load(urls[path], streams=streams, max_s=longest_s, max_duration_s=300).start()
            for path in PATHS
        }
        say(f"{kind}: load: {streams} streams of 1-{longest_s:g} s requests on each deployment")
        await asyncio.sleep(5)
        t0 = time.monotonic()
        victims = {path: ordinal_one(core, names[path])[0] for path in ("direct", "prestop")}
        for ns in names.values():
            scale_to_one(co, ns, ns)
        core.delete_namespaced_pod(
            victims["direct"].metadata.name, names["direct"], grace_period_seconds=0
        )
        prestop_pod = victims["prestop"]
        core.delete_namespaced_pod(prestop_pod.metadata.name, names["prestop"])
        watch = TerminationWatch(
            bed, f"{prestop_pod.metadata.name}.{prestop_pod.metadata.uid[:8]}", t0
        )
        say(f"{kind}: scaled all to 1: product via the watcher, direct and preStop by deletion")

        async def gone(path: str, timeout: float) -> float:
            await asyncio.to_thread(
                wait_for,
                f"{kind}: {path} replica gone",
                lambda: not ordinal_one(core, names[path]),
                timeout=timeout,
            )
            return time.monotonic() - t0

        retire_s, prestop_s = await asyncio.gather(gone("product", 300), gone("prestop", 90))
        await asyncio.sleep(settle_s)
        # All loads stop together (one after the other, the last ones would run longer).
        stopped = await asyncio.gather(*(asyncio.to_thread(load.stop) for load in loads.values()))
        counts = dict(zip(loads, stopped, strict=True))
        failures = {path: dict(load.failures) for path, load in loads.items()}
        samples = {path: list(load.samples) for path, load in loads.items()}
        wid = workflow_id_for(namespace=names["product"], deployment=names["product"])
        st: RetirementState = await temporal.get_workflow_handle(
            wid, result_type=RetirementState
        ).result()
    finally:
        if watch is not None:
            watch.stop()
        watcher.stop()
        for op in operators:
            op.stop()
        for ns in names.values():
            child = bed.routers.pop(router_pod_name(ns), None)
            if child is not None:
                child.stop(timeout=5)
    tl = st.phase_timeline
    phases = [(str(p), (tl[i + 1][1] - t).total_seconds()) for i, (p, t) in enumerate(tl[:-1])]
    say(f"{kind}: failed {', '.join(f'{p} {counts[p][1]}' for p in PATHS)}")
    return {
        "counts": counts,
        "failures": failures,
        "samples": samples,
        "started": tl[0][1].timestamp() if tl else 0.0,
        "phases": phases,
        "retire_s": retire_s,
        "outcome": str(st.outcome),
        "prestop_s": prestop_s,
        "prestop_phases": watch.phases if watch else [],
        "prestop_exit": watch.exit if watch else None,
    }


async def run(
    streams: int, longest_s: float, settle_s: float, routers: list[str]
) -> dict[str, Any]:
    """Every router's three scale-downs, one router after the other, on one bed."""
    exit_on_sigterm()
    bed = Bed(state_dir=REPO_ROOT / ".bed" / "bench")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(venv_bin("temporal").resolve()),
        data_converter=pydantic_data_converter,
        ui=False,
        search_attributes=search_attribute_keys(load_config()),
        dev_server_extra_args=["--ui-disable-news-fetch"],
    )
    results: dict[str, Any] = {}
    cpu0 = time.process_time()
    try:
        say("starting the bed")
        bed.start()
        queue = "bench"
        kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
        target = env.client.service_client.config.target_host
        with ThreadPoolExecutor(max_workers=8) as pool:
            async with build_worker(env.client, task_queue=queue, kube=kube, executor=pool):
                for kind in routers:
                    results[kind] = await one_router(
                        bed, env.client, target, queue, kind, streams, longest_s, settle_s
                    )
    finally:
        bed.stop()
        await env.shutdown()
    return {
        "streams": streams,
        "longest_s": longest_s,
        "settle_s": settle_s,
        "routers": results,
        "bench_cpu_s": time.process_time() - cpu0,
    }


def _cell(ok_failed: tuple[int, int]) -> str:
    ok, failed = ok_failed
    return f"{failed} of {ok + failed}"


def report(r: dict[str, Any]) -> None:
    """Print the side-by-side table: per router, each path's failed requests of its total."""
    widths = {path: len(label) + 3 for path, label in PATHS.items()}
    first = max([len("all routers"), *map(len, r["routers"])]) + 2
    print()
    print(
        f"scale-down 2 -> 1 under {r['streams']} streams of 1-{r['longest_s']:g} s streaming "
        "requests per deployment; failed requests of all sent, per router:"
    )
    print(f"  {'router':<{first}}" + "".join(f"{PATHS[p]:>{widths[p]}}" for p in PATHS))
    totals = {path: [0, 0] for path in PATHS}
    for kind, res in r["routers"].items():
        row = f"  {kind:<{first}}"
        for path in PATHS:
            ok, failed = res["counts"][path]
            totals[path][0] += ok
            totals[path][1] += failed
            row += f"{_cell((ok, failed)):>{widths[path]}}"
        print(row)
    print(
        f"  {'all routers':<{first}}"
        + "".join(f"{_cell((totals[p][0], totals[p][1])):>{widths[p]}}" for p in PATHS)
    )
    for kind, res in r["routers"].items():
        print(f"  {kind}: failures by kind: {res['failures']}")
        print(
            f"    retirement {res['outcome']} in {res['retire_s']:.1f} s: "
            + ", ".join(f"{p} {s:.2f} s" for p, s in res["phases"])
        )
        for path, samples in res.get("samples", {}).items():
            for at, why, detail in samples[:5]:
                print(
                    f"    {path} failure at {at - res['started']:+.1f} s from the retirement's "
                    f"start: {why} {detail[:100]!r}"
                )
        seen = ", ".join(f"{p} at {s:.1f} s" for p, s in res["prestop_phases"])
        print(
            f"    preStop Pod: {seen or 'no phase seen'}; exit {res['prestop_exit']}; "
            f"gone {res['prestop_s']:.1f} s after its deletion"
        )
    print(f"  the benchmark process's CPU: {r['bench_cpu_s']:.1f} s")


def picture(r: dict[str, Any], path: Path) -> None:
    """Failed requests per router and path, and each retirement's phases, as a PNG."""

    kinds = list(r["routers"])
    with two_panels(path, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.2, 1.4]}) as (
        bars,
        timeline,
    ):
        colors = {"product": "#4c9f70", "direct": "#d1495b", "prestop": "#edae49"}
        width = 0.26
        for j, (p, label) in enumerate(PATHS.items()):
            xs = [i + (j - 1) * width for i in range(len(kinds))]
            failed = [r["routers"][k]["counts"][p][1] for k in kinds]
            bars.bar(xs, failed, width=width, color=colors[p], label=label)
            for x, f, k in zip(xs, failed, kinds, strict=True):
                total = sum(r["routers"][k]["counts"][p])
                bars.text(x, f, f" {f}/{total}", ha="center", va="bottom", fontsize=7, rotation=90)
        top = max((r["routers"][k]["counts"][p][1] for k in kinds for p in PATHS), default=0)
        bars.set_ylim(0, top * 1.6 + 1)  # room for the legend above the bars
        bars.set_xticks(range(len(kinds)), kinds)
        bars.set_ylabel("failed requests")
        bars.set_title(
            f"Failed requests in a 2→1 scale-down ({r['streams']} streams of "
            f"1-{r['longest_s']:g} s requests per path)",
            fontsize=10,
        )
        bars.legend(loc="upper left", fontsize=8)
        palette = ["#8ecae6", "#219ebc", "#ffb703", "#fb8500", "#d1495b", "#6a4c93"]
        seen: dict[str, str] = {}
        for row, k in enumerate(kinds):
            start = 0.0
            for phase, secs in r["routers"][k]["phases"]:
                color = seen.setdefault(phase, palette[len(seen) % len(palette)])
                timeline.barh(row, secs, left=start, color=color, edgecolor="white")
                if secs > 1.0:
                    timeline.text(start + secs / 2, row, f"{secs:.1f}", ha="center", va="center")
                start += secs
        for phase, color in seen.items():
            timeline.barh(0, 0, color=color, label=phase)
        timeline.set_yticks(range(len(kinds)), kinds)
        timeline.invert_yaxis()
        timeline.set_xlabel("seconds since the retirement's admission")
        timeline.set_title("The product's retirement, phase by phase")
        timeline.legend(
            loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8, frameon=False
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m bench scale-down")
    p.add_argument("--streams", type=int, default=20, help="request streams per deployment")
    p.add_argument(
        "--longest", type=float, default=5.0, help="the longest request, s (the shortest: 1 s)"
    )
    p.add_argument("--settle", type=float, default=5.0, help="load kept after the scale-down")
    p.add_argument(
        "--routers",
        default=",".join(ROUTERS),
        help=f"real routers, comma-separated (of {', '.join(ROUTERS)})",
    )
    a = p.parse_args(argv)
    routers = [k.strip() for k in a.routers.split(",") if k.strip()]
    unknown = [k for k in routers if k not in ROUTERS]
    if unknown or not routers:
        p.error(f"unknown routers {unknown}; choose from {', '.join(ROUTERS)}")
    if a.longest < 1:
        p.error("--longest must be at least 1 s")
    result = asyncio.run(run(a.streams, a.longest, a.settle, routers))
    report(result)
    name = "scale_down.png" if a.longest == 5.0 else f"scale_down_longest_{a.longest:g}s.png"
    picture(result, RESULTS / name)
    return 0
