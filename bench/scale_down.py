"""The product's headline figure: failed requests during a scale-down under load.

Two identical vLLM deployments (2 replicas each, behind their own real SGLang gateway)
carry the same load: N streams of 1-5 s requests.  One is scaled down the product's way
(the watcher retires the replica: disqualify, withdraw, drain, delete); the other the
plain way (the spec is scaled and the Pod deleted directly).  The counts are printed side
by side, and ``bench/results/scale_down.png`` shows them with the retirement's phases.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kubernetes import client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from activities import Kube
from retirement.models import RetirementState, workflow_id_for
from retirement.names import GROUP, LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ORDINAL, PLURAL, VERSION
from testbed.bed import Bed, wait_for
from testbed.load import Load
from testbed.paths import REPO_ROOT, venv_bin
from testbed.procs import Child, exit_on_sigterm
from testbed.temporal_dev import load_config, search_attribute_keys
from worker.__main__ import build_worker

RESULTS = REPO_ROOT / "bench" / "results"


def say(msg: str) -> None:
    """Progress."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def md(name: str) -> dict[str, Any]:
    """A 2-replica vLLM deployment behind the SGLang gateway."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "engine": {"name": "vLLM", "version": "0.29.0"},
            "router": {"kind": "sglang-gateway"},
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


async def run(streams: int, settle_s: float) -> dict[str, Any]:
    """Both scale-downs under the same load; returns the figures."""
    exit_on_sigterm()
    bed = Bed(state_dir=REPO_ROOT / ".bed" / "bench")
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(venv_bin("temporal").resolve()),
        data_converter=pydantic_data_converter,
        ui=False,
        search_attributes=search_attribute_keys(load_config()),
        dev_server_extra_args=["--ui-disable-news-fetch"],
    )
    watcher: Child | None = None
    try:
        say("starting the bed")
        bed.start()
        api = bed.api_client()
        co, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
        for ns in ("product", "direct"):
            bed.create_namespace(ns)
            co.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, md("llama"))
            bed.operator(ns)
        for ns in ("product", "direct"):
            wait_for(
                f"{ns}: 2 serving",
                lambda ns=ns: (
                    len(core.list_namespaced_pod(ns, label_selector=f"{LABEL_ELIGIBLE}=true").items)
                    == 2
                ),
                timeout=90,
            )
        urls = {ns: bed.start_sglang_router(ns, "llama") for ns in ("product", "direct")}
        queue = "bench"
        kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
        target = env.client.service_client.config.target_host
        with ThreadPoolExecutor(max_workers=8) as pool:
            async with build_worker(env.client, task_queue=queue, kube=kube, executor=pool):
                watcher = bed.watcher(
                    address=target,
                    task_queue=queue,
                    watch_namespace="product",
                    log_path=bed.state_dir / "logs" / "watcher.log",
                )
                loads = {
                    ns: Load(urls[ns], streams=streams, max_duration_s=300).start() for ns in urls
                }
                say(f"load: {streams} streams of 1-5 s requests on each deployment")
                await asyncio.sleep(5)
                t0 = time.monotonic()
                scale_to_one(co, "product", "llama")
                scale_to_one(co, "direct", "llama")
                victim = core.list_namespaced_pod(
                    "direct", label_selector=f"{LABEL_INSTANCE}=llama,{LABEL_ORDINAL}=1"
                ).items[0]
                core.delete_namespaced_pod(victim.metadata.name, "direct", grace_period_seconds=0)
                say("scaled both to 1: product via the watcher, direct by deleting the Pod")
                await asyncio.to_thread(
                    wait_for,
                    "product replica retired",
                    lambda: (
                        not core.list_namespaced_pod(
                            "product", label_selector=(f"{LABEL_INSTANCE}=llama,{LABEL_ORDINAL}=1")
                        ).items
                    ),
                    timeout=300,
                )
                retire_s = time.monotonic() - t0
                await asyncio.sleep(settle_s)
                counts = {ns: await asyncio.to_thread(load.stop) for ns, load in loads.items()}
                failures = {ns: dict(load.failures) for ns, load in loads.items()}
                wid = workflow_id_for(namespace="product", deployment="llama")
                st: RetirementState = await env.client.get_workflow_handle(
                    wid, result_type=RetirementState
                ).result()
    finally:
        if watcher is not None:
            watcher.stop()
        bed.stop()
        await env.shutdown()
    tl = st.phase_timeline
    phases = [(str(p), (tl[i + 1][1] - t).total_seconds()) for i, (p, t) in enumerate(tl[:-1])]
    return {
        "streams": streams,
        "counts": counts,
        "failures": failures,
        "phases": phases,
        "retire_s": retire_s,
        "outcome": str(st.outcome),
    }


def report(r: dict[str, Any]) -> None:
    """Print the side-by-side table."""
    (pok, pfail), (dok, dfail) = r["counts"]["product"], r["counts"]["direct"]
    print()
    print(f"scale-down 2 -> 1 under {r['streams']} request streams (1-5 s each), same load:")
    print(f"  {'path':<34}{'ok':>8}{'failed':>8}")
    print(f"  {'watcher retirement (this product)':<34}{pok:>8}{pfail:>8}")
    print(f"  {'Pod deleted directly':<34}{dok:>8}{dfail:>8}")
    print(
        f"  failures by kind: product {r['failures']['product']}, direct {r['failures']['direct']}"
    )
    print(
        f"  retirement {r['outcome']} in {r['retire_s']:.1f} s: "
        + ", ".join(f"{p} {s:.2f} s" for p, s in r["phases"])
    )


def picture(r: dict[str, Any], path: Path) -> None:
    """Bars of the counts and the retirement's phase timeline, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bars, timeline) = plt.subplots(
        1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1, 1.6]}
    )
    labels = ["watcher retirement", "Pod deleted directly"]
    failed = [r["counts"]["product"][1], r["counts"]["direct"][1]]
    ok = [r["counts"]["product"][0], r["counts"]["direct"][0]]
    bars.bar(labels, ok, color="#4c9f70", label="ok")
    bars.bar(labels, failed, bottom=ok, color="#d1495b", label="failed")
    for i, (o, f) in enumerate(zip(ok, failed, strict=True)):
        bars.text(i, o + f, f"{f} failed", ha="center", va="bottom", fontsize=10)
    bars.set_title(f"Requests during a 2→1 scale-down ({r['streams']} streams)")
    bars.legend(loc="lower right")
    start = 0.0
    colors = ["#8ecae6", "#219ebc", "#ffb703", "#fb8500", "#d1495b", "#6a4c93"]
    total = sum(secs for _, secs in r["phases"]) or 1.0
    for (phase, secs), color in zip(r["phases"], colors, strict=False):
        timeline.barh(
            0, secs, left=start, color=color, edgecolor="white", label=f"{phase} {secs:.2f} s"
        )
        if secs / total > 0.12:
            timeline.text(
                start + secs / 2, 0, f"{phase}\n{secs:.2f} s", ha="center", va="center", fontsize=9
            )
        start += secs
    timeline.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, fontsize=8, frameon=False
    )
    timeline.set_yticks([])
    timeline.set_xlabel("seconds since admission")
    timeline.set_title(f"The retirement's phases ({r['outcome']})")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"  picture: {path}")


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--streams", type=int, default=20)
    p.add_argument("--settle", type=float, default=5.0, help="load kept after the scale-down")
    a = p.parse_args(argv)
    result = asyncio.run(run(a.streams, a.settle))
    report(result)
    picture(result, RESULTS / "scale_down.png")
    return 0
