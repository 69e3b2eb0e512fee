"""Where the watcher's CPU per event goes, offline: no cluster, no Temporal server.

The bed benchmark (``bench/watcher_fleet.py``) measures the watcher's CPU per change from
outside; this one takes an event apart.  It builds the benchmark's fleet in memory (M
router-less ModelDeployments of 10 single-member replicas, whose Pods carry what kwok and
the API server add to a Pod: managed fields, defaulted spec, a running status) and a
stream of Pod watch lines like the benchmark's churn, then measures process CPU time
(``time.process_time``: every thread of this process, so it is fair on a loaded machine):

* **stages**, one event after the other: ``json.loads`` of the watch line (as
  ``kube.watching.watch_objects`` does), the Pod's typed view (``Pod.from_raw``), the
  cache update and queueing (``Controller.apply``), the reconcile of the deployment it
  touched (``Reconciler.reconcile_key``);
* **end to end**: the real ``Controller`` (informer thread, event loop, work queue, four
  workers, the visibility refresher) fed by a source that lists the fleet and then hands
  out the lines at ``--rate`` per second, so each event wakes the loop on its own as on a
  cluster; CPU per event over the stream, and the idle CPU per second before it;
* with ``--profile``, the top of a cProfile of the stages.

Kinds of event (``--kinds``): a label change and an annotation change (the bed
benchmark's churn: read only by a remembered refusal, so cached without a reconcile while
the deployment has none, ``watcher.changes``), status noise (a new resourceVersion and
timestamps only: cached without a reconcile), and a new Pod address (read: each one is
reconciled).

Temporal and the API server are the offline fakes of the tests (``tests/helpers``): the
stream starts nothing and writes nothing (the harness checks), and the fake visibility
query costs less than a real one, so the idle figure here is a floor.

Run: ``python -m bench watcher-profile [--fleet 500] [--events 2000] [--rate 50]``.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import cProfile
import json
import pstats
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.watcher_fleet import CHURN_KEY, PODS_PER, md_manifest
from kube.watching import Resource, WatchEvent
from retirement.names import ENGINE_CONTAINER
from testbed import fleet as bed_fleet
from tests.helpers.fake_kube import FakeKube
from tests.helpers.fake_temporal import FakeTemporal
from watcher.controller import Controller
from watcher.fleet import decode_deployment, decode_pod
from watcher.informer import Changed, Informer, Listed
from watcher.metrics import Health, WatcherMetrics
from watcher.reconcile import PassResult, Reconciler, WatcherSettings

NS = "wf"
KINDS = ("label", "annotation", "noise", "address")


def _stamp(i: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_790_000_000 + i))


def kwok_pod(deployment: str, ordinal: int, index: int) -> dict[str, Any]:
    """One of the benchmark's Pods as a watch hands it out on the bed: the manifest of
    ``testbed.fleet.member_pod`` with what the API server and kwok add (~4 KB of JSON)."""
    pod = bed_fleet.member_pod(deployment, "server", ordinal)
    meta, spec = pod["metadata"], pod["spec"]
    meta.update(
        namespace=NS,
        uid=f"{index:08x}-0000-4000-8000-{index:012x}",
        resourceVersion=str(1000 + index),
        creationTimestamp=_stamp(0),
        managedFields=[
            {
                "manager": "OpenAPI-Generator",
                "operation": "Update",
                "apiVersion": "v1",
                "time": _stamp(0),
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {
                        "f:annotations": {f"f:{k}": {} for k in meta["annotations"]},
                        "f:labels": {f"f:{k}": {} for k in meta["labels"]},
                    },
                    "f:spec": {
                        "f:containers": {
                            'k:{"name":"main"}': {
                                ".": {},
                                "f:image": {},
                                "f:name": {},
                                "f:ports": {},
                            }
                        },
                        "f:nodeName": {},
                    },
                },
            },
            {
                "manager": "kwok",
                "operation": "Update",
                "apiVersion": "v1",
                "time": _stamp(1),
                "fieldsType": "FieldsV1",
                "subresource": "status",
                "fieldsV1": {
                    "f:status": {
                        "f:conditions": {
                            f'k:{{"type":"{t}"}}': {
                                ".": {},
                                "f:lastTransitionTime": {},
                                "f:status": {},
                                "f:type": {},
                            }
                            for t in ("ContainersReady", "Initialized", "PodScheduled", "Ready")
                        },
                        "f:containerStatuses": {},
                        "f:hostIP": {},
                        "f:phase": {},
                        "f:podIP": {},
                        "f:podIPs": {},
                        "f:startTime": {},
                    }
                },
            },
        ],
    )
    container = spec["containers"][0]
    container.update(
        imagePullPolicy="Always",
        resources={},
        terminationMessagePath="/dev/termination-log",
        terminationMessagePolicy="File",
    )
    container["ports"][0]["protocol"] = "TCP"
    spec.update(
        dnsPolicy="ClusterFirst",
        enableServiceLinks=True,
        preemptionPolicy="PreemptLowerPriority",
        priority=0,
        restartPolicy="Always",
        schedulerName="default-scheduler",
        securityContext={},
        serviceAccount="default",
        serviceAccountName="default",
        tolerations=[
            {
                "effect": "NoExecute",
                "key": f"node.kubernetes.io/{t}",
                "operator": "Exists",
                "tolerationSeconds": 300,
            }
            for t in ("not-ready", "unreachable")
        ],
    )
    ip = f"198.18.{4 + index // 250}.{1 + index % 250}"
    pod["status"] = {
        "conditions": [
            {"lastProbeTime": None, "lastTransitionTime": _stamp(1), "status": "True", "type": t}
            for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        ],
        "containerStatuses": [
            {
                "containerID": f"kwok://{ENGINE_CONTAINER}-{index}",
                "image": "emulated/none:latest",
                "imageID": "",
                "lastState": {},
                "name": ENGINE_CONTAINER,
                "ready": True,
                "restartCount": 0,
                "started": True,
                "state": {"running": {"startedAt": _stamp(1)}},
            }
        ],
        "hostIP": "198.18.0.2",
        "hostIPs": [{"ip": "198.18.0.2"}],
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "qosClass": "BestEffort",
        "startTime": _stamp(1),
    }
    return pod


@dataclass
class Fleet:
    """The benchmark's fleet as raw bodies, and a stream of Pod watch lines."""

    deployments: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    lines: list[bytes]
    kinds: list[str]


def build(m: int, events: int, kinds: tuple[str, ...], seed: int = 7) -> Fleet:
    """``m`` deployments of ``PODS_PER`` Pods, and ``events`` MODIFIED lines of random
    Pods cycling through ``kinds``, each built on the Pod's previous state."""
    deployments = []
    for i in range(m):
        md = md_manifest(f"md{i:04d}", PODS_PER)
        md["metadata"].update(
            namespace=NS, uid=f"md-uid-{i}", resourceVersion=str(i + 1), generation=1
        )
        deployments.append(md)
    pods = [kwok_pod(f"md{i:04d}", o, i * PODS_PER + o) for i in range(m) for o in range(PODS_PER)]
    live = copy.deepcopy(pods)
    rng = random.Random(seed)
    lines: list[bytes] = []
    chosen: list[str] = []
    rv = 10_000_000
    for n in range(events):
        kind = kinds[n % len(kinds)]
        pod = rng.choice(live)
        rv += 1
        meta = pod["metadata"]
        meta["resourceVersion"] = str(rv)
        if kind == "label":
            meta["labels"][CHURN_KEY] = str(n)
        elif kind == "annotation":
            meta["annotations"][CHURN_KEY] = str(n)
        elif kind == "noise":  # status noise: a timestamp the view does not keep
            pod["status"]["conditions"][0]["lastProbeTime"] = _stamp(n)
        else:  # a new address: read by the reconcile (a refusal depends on it)
            ip = f"198.19.{n // 250 % 250}.{1 + n % 250}"
            pod["status"]["podIP"], pod["status"]["podIPs"] = ip, [{"ip": ip}]
        lines.append(json.dumps({"type": "MODIFIED", "object": pod}).encode())
        chosen.append(kind)
    return Fleet(deployments, pods, lines, chosen)


def make_reconciler() -> tuple[Reconciler, FakeKube, FakeTemporal]:
    kube, temporal = FakeKube(), FakeTemporal()
    rec = Reconciler(
        kube=kube, temporal=temporal.client(), settings=WatcherSettings(), metrics=WatcherMetrics()
    )
    return rec, kube, temporal


def _decode_line(line: bytes) -> WatchEvent:
    """What ``kube.watching.watch_objects`` does with one line of the stream."""
    event = json.loads(line)
    return WatchEvent(type=str(event.get("type") or ""), body=event["object"])


# ------------------------------------------------------------------ stages


async def _drain(ctl: Controller) -> int:
    n = 0
    while len(ctl.queue):
        key = await ctl.queue.get()
        assert isinstance(key, tuple)
        try:
            await ctl.rec.reconcile_key(key, PassResult())
            n += 1
        finally:
            ctl.queue.done(key)
    return n


async def stages(f: Fleet, *, profile: int = 0) -> dict[str, Any]:
    """CPU per stage, one event after the other (no threads, no waiting)."""
    rec, kube, _ = make_reconciler()
    ctl = Controller(rec=rec, source=_Silent(), health=Health())
    entries = tuple(d for d in map(decode_deployment, f.deployments) if d is not None)
    ctl.apply(Listed("modeldeployments", None, deployments=entries))
    ctl.apply(Listed("pods", None, pods=tuple(p for p in map(decode_pod, f.pods) if p)))
    await _drain(ctl)
    writes = len(kube.calls)
    inf = Informer(source=_Silent(), resource="pods", namespace=None, deliver=ctl.apply)
    spent = {"json": 0.0, "view": 0.0, "apply": 0.0, "reconcile": 0.0}
    per_kind: dict[str, list[float]] = {k: [] for k in KINDS}
    reconciles = 0
    clock = time.process_time
    for line, kind in zip(f.lines, f.kinds, strict=True):
        t0 = clock()
        event = _decode_line(line)
        t1 = clock()
        delta = inf._decode(event)
        t2 = clock()
        assert isinstance(delta, Changed)
        ctl.apply(delta)
        t3 = clock()
        reconciles += await _drain(ctl)
        t4 = clock()
        for name, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[name] += dt
        per_kind[kind].append(t4 - t0)
    assert len(kube.calls) == writes, "the stream must not write anything"
    out: dict[str, Any] = {
        "events": len(f.lines),
        "reconciles": reconciles,
        "us": {k: v / len(f.lines) * 1e6 for k, v in spent.items()},
        "kind_us": {k: sum(v) / len(v) * 1e6 for k, v in per_kind.items() if v},
        "line_bytes": sum(map(len, f.lines)) / len(f.lines),
    }
    if profile:
        prof = cProfile.Profile()
        for line in f.lines:  # applied once already: the same lines again, profiled
            prof.enable()
            delta = inf._decode(_decode_line(line))
            assert isinstance(delta, Changed)
            ctl.apply(delta)
            await _drain(ctl)
            prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(profile)
    return out


class _Silent:
    """A source with nothing to list or watch (the stages feed the controller directly)."""

    def list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        return [], "1"

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str
    ) -> Iterator[WatchEvent]:
        return iter(())


# ------------------------------------------------------------------ end to end


class StreamSource:
    """Lists the fleet, then hands out the Pod lines at ``rate`` per second once
    ``go`` is set; every watch otherwise waits (as a quiet server's watch does)."""

    def __init__(self, f: Fleet, rate: float, stop: threading.Event) -> None:
        self.f, self.rate, self.stop = f, rate, stop
        self.go = threading.Event()
        self.delivered = 0

    def list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        items = self.f.pods if resource == "pods" else self.f.deployments
        return copy.deepcopy(items), "1"

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str
    ) -> Iterator[WatchEvent]:
        if resource == "pods" and self.delivered == 0:
            while not self.go.wait(0.05):
                if self.stop.is_set():
                    return
            t_next = time.monotonic()
            for line in self.f.lines:
                self.stop.wait(max(0.0, t_next - time.monotonic()))
                if self.stop.is_set():
                    return
                yield _decode_line(line)
                self.delivered += 1
                t_next += 1 / self.rate
        self.stop.wait(3600)


async def end_to_end(f: Fleet, *, rate: float, idle_s: float) -> dict[str, Any]:
    """The controller as it runs: CPU per event over the stream, idle CPU per second."""
    rec, kube, temporal = make_reconciler()
    stop = threading.Event()
    src = StreamSource(f, rate, stop)
    ctl = Controller(rec=rec, source=src, health=Health(), refresh_s=2.0, resync_s=3600)
    task = asyncio.create_task(ctl.run(stop))
    metrics = rec.metrics.registry

    def reconciled() -> float:
        return metrics.get_sample_value("retire_watcher_reconciles_total") or 0.0

    try:
        while reconciled() < len(f.deployments) or len(ctl.queue):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)
        writes, base = len(kube.calls), reconciled()
        c0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(idle_s)
        idle = (time.process_time() - c0) / (time.monotonic() - t0)
        c1, t1 = time.process_time(), time.monotonic()
        src.go.set()
        while src.delivered < len(f.lines) or len(ctl.queue):
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)
        cpu, window = time.process_time() - c1, time.monotonic() - t1
        assert len(kube.calls) == writes, "the stream must not write anything"
        starts = [c for c in temporal.calls if c.method != "list_workflows"]
        assert not starts, "the stream must not start anything"
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)
    n = len(f.lines)
    return {
        "events": n,
        "reconciles": reconciled() - base,
        "window_s": window,
        "idle_cpu_per_s": idle,
        "cpu_per_event_ms": cpu / n * 1000,
        "marginal_per_event_ms": (cpu - idle * window) / n * 1000,
    }


# ------------------------------------------------------------------ the report


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m bench watcher-profile", description=__doc__)
    p.add_argument("--fleet", type=int, default=500, help="deployments (10 Pods each)")
    p.add_argument("--events", type=int, default=2000, help="Pod events in the stream")
    p.add_argument("--rate", type=float, default=50.0, help="end to end: events per second")
    p.add_argument("--idle", type=float, default=4.0, help="end to end: idle seconds measured")
    p.add_argument(
        "--kinds",
        default="label,annotation,noise",
        help=f"event kinds, cycled ({', '.join(KINDS)})",
    )
    p.add_argument("--profile", type=int, default=0, help="print this many cProfile lines")
    p.add_argument("--skip-e2e", action="store_true", help="the stages only")
    a = p.parse_args(argv)
    kinds = tuple(k for k in a.kinds.split(",") if k)
    if not kinds or any(k not in KINDS for k in kinds):
        p.error(f"--kinds: a comma-separated choice of {', '.join(KINDS)}")
    f = build(a.fleet, a.events, kinds)
    print(
        f"watcher profile: {a.fleet} deployments, {len(f.pods)} Pods, {a.events} Pod events "
        f"({', '.join(kinds)}), {len(f.lines[0])} bytes per watch line"
    )
    s = asyncio.run(stages(f, profile=a.profile))
    us = s["us"]
    print(
        "  stages, CPU µs per event: "
        + ", ".join(f"{k} {v:.1f}" for k, v in us.items())
        + f"; total {sum(us.values()):.1f} ({s['reconciles']} reconciles for {s['events']} "
        "events)"
    )
    print(
        "  by kind, CPU µs per event: " + ", ".join(f"{k} {v:.1f}" for k, v in s["kind_us"].items())
    )
    if not a.skip_e2e:
        e = asyncio.run(end_to_end(f, rate=a.rate, idle_s=a.idle))
        print(
            f"  end to end at {a.rate:g} events/s: {e['cpu_per_event_ms']:.3f} ms CPU per "
            f"event ({e['marginal_per_event_ms']:.3f} ms above idle); idle "
            f"{e['idle_cpu_per_s'] * 1000:.2f} ms CPU per s; {e['reconciles']:.0f} reconciles "
            f"for {e['events']} events in {e['window_s']:.1f} s"
        )
    return 0
