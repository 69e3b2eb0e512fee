"""One worker process against many retirements at once.

Per fleet size N (default 10, 50, 200): N router-less vLLM deployments of two
single-member replicas (the stand-in operator creates the Pods and registers engine
emulators), one request held in flight for D seconds (default 60) on each ordinal-1
engine, then every spec scaled to one replica and the N retirements of ordinal 1 started
at once with the Temporal client (as the watcher would start them; quiet-window policy),
all run by ONE worker process (``python -m worker`` as a subprocess).

Figures per N:

* outcomes: completed / aborted (held, waiting for a retry token) / other;
* idle -> next phase: from the moment the victim's engine went idle (its held request
  answered) to the retirement leaving Draining (the phase timeline's next entry): how long
  the worker takes to notice the drain is over, p50 and p99;
* activity start lag: ActivityTaskScheduled -> ActivityTaskStarted in each history (an
  activity that could start but waited for the worker), p50 and p99 over all activities,
  and the same for workflow tasks;
* time from the starts to the last deletion of a victim Pod (an aborted one keeps its Pod);
* the worker's CPU seconds (``/proc/<pid>/stat``), RSS now and at peak, and its peak
  thread count (sampled every ~5 s), and kwok's CPU seconds with its reaped children
  (every exec'd one-shot runs there);
* ``pods/exec`` requests per second (``apiserver_request_total{resource="pods",
  subresource="exec"}`` over the run), and all API requests per retirement, also by verb
  and resource (the bed's own controllers' included);
* workflow tasks per retirement and how many timed out (a sticky task not started in
  time), the Temporal server's CPU seconds and its frontend RPCs per retirement, its
  database calls, database seconds and workflow-state writes per retirement, and its
  history service's mean latency of a workflow task's start and completion and of an
  activity's completion (the server's ``persistence_latency`` and ``service_latency``).

Every retirement's history events, and each victim engine's idle moment, are written to
``.bed/bench-worker/histories-n<N>.jsonl`` (one JSON object a line) for a closer look at
where the time went.  Outcomes are read with one visibility query every ~5 s, so the
measurement adds little to the server it measures.

``--split`` runs the worker as two processes on the task queue (``--serve workflows`` and
``--serve activities``); the figures are then their sums.

``--namespaces K`` spreads the N deployments over K namespaces (default 1: all in one).
The withdrawal's Service check lists every Service and EndpointSlice of the namespace on
each read, so in one shared namespace a read costs more the more deployments share it.

``--exact`` runs the engines with ``--enable-server-load-tracking``: the drain then reads
vLLM's own count of requests in flight (``GET /load``) beside the metrics.

``--runs K`` runs every fleet size K times, each on a fresh bed and dev server, and reports
each run and the median (at N = 200 one run's figure differs from the next by up to a
factor of two on this 2-core bed: ``docs/benchmarks.md``); the picture draws the medians.

Run: ``python -m bench worker [--fleets 10,50,200] [--busy 60] [--namespaces 1] [--split]
[--exact] [--runs 1]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
from kubernetes import client
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.common import SearchAttributeKey

from bench.common import (
    RESULTS,
    DevServer,
    apiserver_requests,
    cpu_seconds,
    diff,
    pct,
    rss_mib,
    say,
    start_temporal,
    table,
    threads,
    two_panels,
    wait_until,
    with_timeout_delete_namespace,
)
from retirement.models import (
    RetirementRequest,
    RetirementState,
    RouterlessPolicy,
    workflow_id_for,
)
from retirement.names import GROUP, LABEL_ELIGIBLE, LABEL_INSTANCE, LABEL_ORDINAL, PLURAL, VERSION
from retirement.phases import Outcome, Phase
from testbed.bed import Bed
from testbed.paths import REPO_ROOT
from testbed.procs import Child, exit_on_sigterm
from testbed.standin_operator import SERVE_PORT
from testbed.worker_process import start_worker_process
from worker.build import Serves
from workflows.retirement import RetirementWorkflow

QUIET_S = 2.0
OUTCOME = SearchAttributeKey.for_keyword("RetirementOutcome")
PHASE = SearchAttributeKey.for_keyword("RetirementPhase")
SCALE_TO_ONE = {"spec": {"roles": [{"name": "server", "kind": "Server", "replicas": 1, "size": 1}]}}


def md_manifest(name: str, *, exact: bool = False) -> dict[str, Any]:
    """A router-less vLLM deployment of two single-member replicas (``exact``: with
    ``--enable-server-load-tracking``, so the drain reads vLLM's own count at ``/load``)."""
    roles: dict[str, Any] = {"name": "server", "kind": "Server", "replicas": 2, "size": 1}
    if exact:
        roles["extraArgs"] = ["--enable-server-load-tracking"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {"engine": {"name": "vLLM", "version": "0.29.0"}, "roles": [roles]},
    }


class Busy:
    """One request of ``seconds`` held on each victim engine; records when each answered."""

    def __init__(self, urls: dict[str, str], seconds: float) -> None:
        self.urls, self.seconds = urls, seconds
        self.idle_at: dict[str, float] = {}  # deployment -> wall time the request ended
        self.errors: dict[str, str] = {}
        self._threads = [
            threading.Thread(target=self._one, args=(md, url), daemon=True)
            for md, url in urls.items()
        ]

    def start(self) -> Busy:
        for t in self._threads:
            t.start()
        return self

    def join(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _one(self, md: str, url: str) -> None:
        body = {
            "model": "emulated",
            "prompt": "hold",
            "max_tokens": 16,
            "emulate_seconds": self.seconds,
            "stream": False,
        }
        try:
            with httpx.Client(trust_env=False, timeout=self.seconds + 60) as http:
                r = http.post(f"{url}/v1/completions", json=body)
                if r.status_code != 200:
                    self.errors[md] = f"HTTP {r.status_code}"
        except Exception as e:
            self.errors[md] = type(e).__name__
        self.idle_at[md] = time.time()


#: A list of Pods' metadata only: the measurement's twice-a-second count of the victims
#: left costs the API server and this process little (full Pods, decoded into the
#: client's models, took ~24 CPU s of this process and the API server's serialization at
#: N = 200, on the two cores the measured worker shares).
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def victims_left(bed: Bed, namespaces: list[str]) -> int:
    """How many victim (ordinal 1) Pods are left in ``namespaces``."""
    query = urllib.parse.urlencode({"labelSelector": f"{LABEL_ORDINAL}=1"})
    left = 0
    for ns in namespaces:
        body = bed.cp._get(f"/api/v1/namespaces/{ns}/pods?{query}", accept=METADATA_ONLY)
        left += len(json.loads(body).get("items") or [])  # an empty list's items: null
    return left


#: The history service's operations whose mean latency the report prints: a workflow
#: task's start and completion and an activity's completion (each one database write).
HISTORY_OPS = (
    "RecordWorkflowTaskStarted",
    "RespondWorkflowTaskCompleted",
    "RespondActivityTaskCompleted",
)


def server_costs(
    after: dict[tuple[str, str, str], tuple[float, float]],
    before: dict[tuple[str, str, str], tuple[float, float]],
    n: int,
) -> dict[str, float]:
    """What the run cost the Temporal server (``DevServer.latencies`` before and after):
    its database calls and database seconds per retirement, workflow-state writes
    (``UpdateWorkflowExecution``) per retirement, and the mean latency in ms of
    ``HISTORY_OPS`` in its history service."""

    def delta(key: tuple[str, str, str]) -> tuple[float, float]:
        (c1, s1), (c0, s0) = after.get(key, (0.0, 0.0)), before.get(key, (0.0, 0.0))
        return c1 - c0, s1 - s0

    db = [delta(k) for k in after if k[0] == "persistence_latency"]
    updates = sum(
        delta(k)[0]
        for k in after
        if k[0] == "persistence_latency" and k[2] == "UpdateWorkflowExecution"
    )
    out = {
        "db_calls_per_retirement": sum(c for c, _ in db) / n,
        "db_s_per_retirement": sum(t for _, t in db) / n,
        "updates_per_retirement": updates / n,
    }
    for op in HISTORY_OPS:
        count, total = delta(("service_latency", "history", op))
        out[f"{op}_ms"] = 1000 * total / count if count else float("nan")
    return out


def event_line(workflow_id: str, ev: Any) -> dict[str, Any]:
    """One history event as a line of the run's timelines file: what happened when (the
    activity's name on a schedule, the scheduling event on a start or completion)."""
    line: dict[str, Any] = {
        "wf": workflow_id,
        "id": ev.event_id,
        "t": ev.event_time.ToDatetime().timestamp(),
        "type": EventType.Name(ev.event_type).removeprefix("EVENT_TYPE_"),
    }
    if ev.HasField("activity_task_scheduled_event_attributes"):
        line["activity"] = ev.activity_task_scheduled_event_attributes.activity_type.name
    for field in (
        "activity_task_started_event_attributes",
        "activity_task_completed_event_attributes",
        "activity_task_failed_event_attributes",
        "workflow_task_started_event_attributes",
        "workflow_task_completed_event_attributes",
    ):
        if ev.HasField(field):
            line["of"] = getattr(ev, field).scheduled_event_id
    return line


def lags(history_events: list[Any], scheduled: int, started: int) -> list[float]:
    """Scheduled -> started lags (seconds) of every task of one kind in a history."""
    at: dict[int, datetime] = {}
    out: list[float] = []
    for ev in history_events:
        if ev.event_type == scheduled:
            at[ev.event_id] = ev.event_time.ToDatetime()
        elif ev.event_type == started:
            attrs = (
                ev.activity_task_started_event_attributes
                if started == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                else ev.workflow_task_started_event_attributes
            )
            t0 = at.get(attrs.scheduled_event_id)
            if t0 is not None:
                out.append((ev.event_time.ToDatetime() - t0).total_seconds())
    return out


@dataclass
class WorkerProcesses:
    """The worker side of a run: one process serving all, or two (``--split``: one
    serving workflows, one activities); CPU, memory and threads are their sums."""

    children: list[Child]

    @classmethod
    def start(
        cls, bed: Bed, dev: DevServer, queue: str, tag: str, *, split: bool
    ) -> WorkerProcesses:
        serves = [Serves.WORKFLOWS, Serves.ACTIVITIES] if split else [Serves.ALL]
        return cls(
            [
                start_worker_process(
                    bed, target=dev.target, queue=queue, tag=f"{tag}-{s.value}", serves=s
                )
                for s in serves
            ]
        )

    def cpu_s(self) -> float:
        return sum(cpu_seconds(c.pid) for c in self.children)

    def rss_mib(self, field: str = "VmRSS") -> float:
        return sum(rss_mib(c.pid, field) for c in self.children)

    def threads(self) -> int:
        return sum(threads(c.pid) for c in self.children)

    def stop(self) -> None:
        for c in self.children:
            c.stop(timeout=15)


async def one_fleet(
    bed: Bed,
    dev: DevServer,
    n: int,
    *,
    busy_s: float,
    spread: int = 1,
    split: bool = False,
    exact: bool = False,
) -> dict[str, Any]:
    """``n`` retirements at once on one worker, the deployments spread round-robin over
    ``spread`` namespaces (1: all in one, as a platform team's namespace holds them; the
    withdrawal's Service check reads every Service and EndpointSlice of the namespace, so
    its cost per read grows with the deployments that share it)."""
    namespaces = [f"wk{n}" if spread == 1 else f"wk{n}-{j}" for j in range(spread)]
    names = [f"md{i:03d}" for i in range(n)]
    ns_of = {m: namespaces[i % spread] for i, m in enumerate(names)}
    api = bed.api_client()
    api.configuration.connection_pool_maxsize = 32
    core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
    for ns in namespaces:
        bed.create_namespace(ns)
    t = time.monotonic()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda m: co.create_namespaced_custom_object(
                    GROUP, VERSION, ns_of[m], PLURAL, md_manifest(m, exact=exact)
                ),
                names,
            )
        )
    ops = [bed.operator(ns) for ns in namespaces]
    say(f"N={n}: {n} deployments created in {spread} namespace(s); waiting for {2 * n} engines")

    def serving() -> bool:
        return (
            sum(
                len(core.list_namespaced_pod(ns, label_selector=f"{LABEL_ELIGIBLE}=true").items)
                for ns in namespaces
            )
            >= 2 * n
        )

    await asyncio.to_thread(wait_until, f"{2 * n} serving", serving, timeout=900, every=2)
    say(f"N={n}: {2 * n} engines serving after {time.monotonic() - t:.1f} s")
    for op in ops:
        op.stop()  # every Pod exists; the operator's polling would only load the API server
    victims = {
        p.metadata.labels[LABEL_INSTANCE]: p
        for ns in namespaces
        for p in core.list_namespaced_pod(ns, label_selector=f"{LABEL_ORDINAL}=1").items
    }
    queue = f"bench-worker-{n}"
    worker = WorkerProcesses.start(bed, dev, queue, f"n{n}", split=split)
    tc = await dev.client()
    handles: list[WorkflowHandle[Any, RetirementState]] = []
    done = threading.Event()
    last_deleted: list[float] = []
    try:
        busy = Busy(
            {md: f"http://{p.status.pod_ip}:{SERVE_PORT}" for md, p in victims.items()}, busy_s
        ).start()
        await asyncio.sleep(2)  # every held request is in the engine
        say(f"N={n}: one {busy_s:.0f} s request in flight on each victim; scaling all to 1")
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(
                pool.map(
                    lambda m: co.patch_namespaced_custom_object(
                        GROUP,
                        VERSION,
                        ns_of[m],
                        PLURAL,
                        m,
                        {
                            "spec": {
                                "roles": [
                                    {"name": "server", "kind": "Server", "replicas": 1, "size": 1}
                                ]
                            }
                        },
                    ),
                    names,
                )
            )
        kwok = next(c for c in bed.cp.children if c.name == "kwok")
        api0, cpu0, kcpu0 = apiserver_requests(bed), worker.cpu_s(), cpu_seconds(kwok.pid)
        tcpu0, rpc0 = cpu_seconds(dev.child.pid), dev.frontend_requests()
        lat0 = dev.latencies()
        t_start = time.time()

        def watch_deletions() -> None:
            left = len(victims)
            while not done.is_set():
                with contextlib.suppress(Exception):
                    now_left = victims_left(bed, namespaces)
                    if now_left < left:
                        left = now_left
                        last_deleted[:] = [time.time()]
                    if left == 0:
                        return
                done.wait(0.5)

        poller = threading.Thread(target=watch_deletions, daemon=True)
        poller.start()
        handles = list(
            await asyncio.gather(
                *(
                    tc.start_workflow(
                        RetirementWorkflow.run,
                        RetirementRequest(
                            namespace=ns_of[md],
                            deployment=md,
                            role="server",
                            ordinal=1,
                            routerless_policy=RouterlessPolicy.QUIET_WINDOW,
                            quiet_window_s=QUIET_S,
                        ),
                        id=workflow_id_for(namespace=ns_of[md], deployment=md),
                        task_queue=queue,
                    )
                    for md in names
                )
            )
        )
        say(f"N={n}: {n} retirements started")
        states: list[RetirementState | str | BaseException] = []
        pending = {h.id: h for h in handles}
        deadline = time.monotonic() + busy_s + 400
        results: dict[str, RetirementState | str | BaseException] = {}
        peak_threads = worker.threads()
        while pending and time.monotonic() < deadline:
            # One visibility query a round for the retirements that ended or hold (not one
            # describe per retirement: at N = 200 that was 40 requests a second to the
            # server under measurement).
            ended = (
                f"TaskQueue = '{queue}' AND "
                "(ExecutionStatus != 'Running' OR RetirementOutcome != 'Running')"
            )
            async for ex in tc.list_workflows(ended):
                h = pending.pop(ex.id, None)
                if h is None:
                    continue
                if ex.close_time is not None:
                    try:
                        results[ex.id] = await h.result()
                    except BaseException as e:
                        results[ex.id] = e
                    continue
                # Aborted: the retirement holds (Running) until a retry token arrives.
                outcome = ex.typed_search_attributes.get(OUTCOME)
                try:
                    results[ex.id] = await h.query(
                        RetirementWorkflow.state, rpc_timeout=timedelta(seconds=10)
                    )
                except Exception:  # a saturated worker does not answer in time
                    results[ex.id] = str(outcome)
            if pending and time.monotonic() > deadline - 6:
                for wid, h in list(pending.items()):
                    phase = (await h.describe()).typed_search_attributes.get(PHASE)
                    results[wid] = TimeoutError(f"still {phase} at the deadline")
                    del pending[wid]
            peak_threads = max(peak_threads, worker.threads())
            say(
                f"N={n}: {len(results)}/{n} retirements ended or held, "
                f"{victims_left(bed, namespaces)} victim Pods left, "
                f"worker {worker.cpu_s() - cpu0:.0f} CPU s, "
                f"{worker.rss_mib():.0f} MiB, {worker.threads()} threads"
            )
            if pending:
                await asyncio.sleep(5)
        states = [results.get(h.id, TimeoutError("still running")) for h in handles]
        elapsed = time.time() - t_start
        cpu1, rss, hwm = worker.cpu_s(), worker.rss_mib(), worker.rss_mib("VmHWM")
        kcpu1, tcpu1 = cpu_seconds(kwok.pid), cpu_seconds(dev.child.pid)
        rpc1 = dev.frontend_requests()
        lat1 = dev.latencies()
        api1 = apiserver_requests(bed)
        done.set()
        poller.join(timeout=5)
        busy.join(timeout=5)
        say(f"N={n}: reading {n} histories")
        act_lags: list[float] = []
        wft_lags: list[float] = []
        wft_timeouts = 0
        timelines = bed.state_dir / f"histories-n{n}.jsonl"
        with timelines.open("w") as out:
            for h in handles:
                hist = await h.fetch_history()
                for ev in hist.events:
                    out.write(json.dumps(event_line(h.id, ev)) + "\n")
                wft_timeouts += sum(
                    ev.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT
                    for ev in hist.events
                )
                act_lags += lags(
                    list(hist.events),
                    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                    EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
                )
                wft_lags += lags(
                    list(hist.events),
                    EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
                    EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
                )
            for md, idle_t in busy.idle_at.items():
                out.write(json.dumps({"md": md, "t": idle_t, "type": "ENGINE_IDLE"}) + "\n")
        say(f"N={n}: every history's events in {timelines}")
    finally:
        done.set()
        for h in handles:
            with contextlib.suppress(Exception):
                await h.terminate("benchmark over")
        worker.stop()
    outcomes = {"completed": 0, "aborted": 0, "other": 0}
    idle_lags: list[float] = []
    del_lags: list[float] = []  # idle -> the victim's delete done (the timeline's Settling)
    tails: dict[str, list[float]] = {"withdrawing": [], "draining": [], "deleting": []}
    other_kinds: dict[str, int] = {}
    for md, st in zip(names, states, strict=True):
        if isinstance(st, BaseException):
            outcomes["other"] += 1
            kind = f"{type(st).__name__}: {st}"
            other_kinds[kind] = other_kinds.get(kind, 0) + 1
            continue
        if isinstance(st, str):  # the outcome from the search attribute (no query answer)
            key = {"Completed": "completed", "Aborted": "aborted"}.get(st, "other")
            outcomes[key] += 1
            other_kinds[f"{st} (state not read)"] = other_kinds.get(f"{st} (state not read)", 0) + 1
            continue
        if st.outcome is Outcome.COMPLETED:
            outcomes["completed"] += 1
        elif st.outcome is Outcome.ABORTED:
            outcomes["aborted"] += 1
            reason = re.sub(r"md\d+-server-\d+", "<pod>", (st.reasons or ["?"])[-1])[:100]
            other_kinds[f"aborted: {reason}"] = other_kinds.get(f"aborted: {reason}", 0) + 1
        else:
            outcomes["other"] += 1
            other_kinds[str(st.outcome)] = other_kinds.get(str(st.outcome), 0) + 1
        tl = st.phase_timeline
        for i, (phase, _) in enumerate(tl[:-1]):
            if phase == Phase.DRAINING and md in busy.idle_at:
                idle_lags.append(tl[i + 1][1].timestamp() - busy.idle_at[md])
        settled = [at for phase, at in tl if phase == Phase.SETTLING]
        if settled and md in busy.idle_at:
            del_lags.append(settled[0].timestamp() - busy.idle_at[md])
            at = {phase: when.timestamp() for phase, when in tl}
            idle = busy.idle_at[md]
            if Phase.DRAINING in at and Phase.DELETING in at:
                # Where the time after the engine went idle went, phase by phase (a phase
                # that began before the idle moment counts from it).
                tails["withdrawing"].append(max(0.0, at[Phase.DRAINING] - idle))
                tails["draining"].append(at[Phase.DELETING] - max(idle, at[Phase.DRAINING]))
                tails["deleting"].append(at[Phase.SETTLING] - at[Phase.DELETING])
    d_api = diff(api1, api0)
    execs = sum(v for (verb, res, sub), v in d_api.items() if res == "pods" and sub == "exec")
    say(f"N={n}: deleting the fleet")
    for ns in namespaces:
        with_timeout_delete_namespace(core, ns)
    return {
        "n": n,
        "namespaces": spread,
        "processes": len(worker.children),
        "busy_s": busy_s,
        **outcomes,
        "other_kinds": other_kinds,
        "busy_errors": dict(busy.errors),
        "idle_p50": pct(idle_lags, 50),
        "idle_p99": pct(idle_lags, 99),
        "del_p50": pct(del_lags, 50),
        "del_p99": pct(del_lags, 99),
        "tails_p50": {k: pct(v, 50) for k, v in tails.items()},
        "exact": exact,
        "act_p50_ms": pct(act_lags, 50) * 1000,
        "act_p99_ms": pct(act_lags, 99) * 1000,
        "wft_p50_ms": pct(wft_lags, 50) * 1000,
        "wft_p99_ms": pct(wft_lags, 99) * 1000,
        "wft_per_retirement": len(wft_lags) / n,
        "wft_timeouts": wft_timeouts,
        "temporal_cpu_s": tcpu1 - tcpu0,
        "temporal_server": server_costs(lat1, lat0, n),
        "rpc_per_retirement": {
            op: (v - rpc0.get(op, 0.0)) / n for op, v in rpc1.items() if v > rpc0.get(op, 0.0)
        },
        "last_deletion_s": (last_deleted[0] - t_start) if last_deleted else float("nan"),
        "elapsed_s": elapsed,
        "cpu_s": cpu1 - cpu0,
        "kwok_cpu_s": kcpu1 - kcpu0,
        "rss_mib": rss,
        "hwm_mib": hwm,
        "threads": peak_threads,
        "execs": execs,
        "execs_per_s": execs / elapsed,
        "execs_per_retirement": execs / n,
        "api_per_retirement": sum(d_api.values()) / n,
        "api_by_kind": {
            " ".join(x for x in key if x): v / n
            for key, v in sorted(d_api.items(), key=lambda kv: -kv[1])
        },
    }


async def run(
    fleets: list[int],
    busy_s: float,
    spread: int = 1,
    split: bool = False,
    exact: bool = False,
    runs: int = 1,
) -> list[dict[str, Any]]:
    """Every fleet size, ``runs`` times, each time on a fresh bed and dev server (so one
    run's leftovers never weigh on the next)."""
    exit_on_sigterm()
    results: list[dict[str, Any]] = []
    for k in range(1, runs + 1):
        if runs > 1:
            say(f"run {k} of {runs}")
        bed = Bed(state_dir=REPO_ROOT / ".bed" / "bench-worker")
        dev: DevServer | None = None
        try:
            say("starting the bed and a Temporal dev server")
            bed.start()
            dev = start_temporal(bed.state_dir / "temporal")
            for n in fleets:
                r = await one_fleet(
                    bed, dev, n, busy_s=busy_s, spread=spread, split=split, exact=exact
                )
                results.append({**r, "run": k})
                report(results)
        finally:
            if dev is not None:
                dev.child.stop(timeout=10)
            bed.stop()
    return results


def median_runs(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One result per N: the first run's, its numbers replaced by their median over the
    runs of that N (for the picture, which draws one point per N)."""
    by_n: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        by_n.setdefault(r["n"], []).append(r)
    out = []
    for rs in by_n.values():
        merged = dict(rs[0])
        for key, value in rs[0].items():
            if isinstance(value, float | int) and not isinstance(value, bool) and key != "n":
                merged[key] = statistics.median(float(r[key]) for r in rs)
        out.append(merged)
    return out


def spread_of_runs(results: list[dict[str, Any]]) -> list[str]:
    """Per N run more than once: idle -> delete p50 of each run and their median, and the
    retirements completed in each."""
    by_n: dict[int, list[dict[str, Any]]] = {}
    for r in results:
        by_n.setdefault(r["n"], []).append(r)
    lines = []
    for n, rs in by_n.items():
        if len(rs) < 2:
            continue
        p50s = [float(r.get("del_p50", float("nan"))) for r in rs]
        lines.append(
            f"  N={n} over {len(rs)} runs: idle→del p50 median "
            f"{statistics.median(p50s):.1f} s ({' / '.join(f'{x:.1f}' for x in p50s)} s), "
            f"completed {' / '.join(str(r['completed']) for r in rs)} of {n}"
        )
    return lines


def report(results: list[dict[str, Any]]) -> None:
    """Print the table."""
    if not results:
        return
    print()
    print(
        f"worker: N retirements at once on one worker process, each victim engine busy "
        f"{results[0]['busy_s']:.0f} s then idle (router-less, quiet window {QUIET_S:g} s"
        + (", vLLM's exact count read at /load)" if results[0].get("exact") else ")")
    )
    rows = [
        [
            r["n"],
            r["namespaces"],
            r.get("processes", 1),
            r["completed"],
            r["aborted"],
            r["other"],
            r["idle_p50"],
            r["idle_p99"],
            r.get("del_p50", float("nan")),
            r.get("del_p99", float("nan")),
            r["act_p50_ms"],
            r["act_p99_ms"],
            r["wft_p50_ms"],
            r["wft_p99_ms"],
            r["last_deletion_s"],
            r["cpu_s"],
            r["kwok_cpu_s"],
            r["rss_mib"],
            r["hwm_mib"],
            r["threads"],
            r["execs_per_s"],
            r.get("execs_per_retirement", float("nan")),
            r["api_per_retirement"],
        ]
        for r in results
    ]
    print(
        table(
            [
                "N",
                "ns",
                "procs",
                "done",
                "aborted",
                "other",
                "idle→next p50 s",
                "p99 s",
                "idle→del p50 s",
                "p99 s",
                "act lag p50 ms",
                "p99 ms",
                "wft lag p50 ms",
                "p99 ms",
                "last del s",
                "CPU s",
                "exec CPU s",
                "RSS MiB",
                "peak MiB",
                "threads",
                "exec/s",
                "exec/ret",
                "API/ret",
            ],
            rows,
        )
    )
    for r in results:
        if r.get("tails_p50"):
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in r["tails_p50"].items())
            print(f"  N={r['n']}: after the engine went idle, p50 per phase: {parts}")
        if "wft_per_retirement" in r:
            print(
                f"  N={r['n']}: {r['wft_per_retirement']:.1f} workflow tasks per retirement, "
                f"{r['wft_timeouts']} timed out (a sticky task not started in time is one); "
                f"the Temporal server used {r['temporal_cpu_s']:.1f} CPU s"
            )
            ts = r.get("temporal_server")
            if ts:
                print(
                    f"  N={r['n']}: the Temporal server per retirement: "
                    f"{ts['db_calls_per_retirement']:.0f} database calls "
                    f"({ts['updates_per_retirement']:.0f} workflow-state writes), "
                    f"{ts['db_s_per_retirement']:.2f} database s; its history service's mean "
                    "latency: " + ", ".join(f"{op} {ts[op + '_ms']:.0f} ms" for op in HISTORY_OPS)
                )
            rpcs = sorted(r["rpc_per_retirement"].items(), key=lambda kv: -kv[1])
            print(
                f"  N={r['n']}: Temporal RPCs per retirement {sum(v for _, v in rpcs):.0f}: "
                + ", ".join(f"{op} {v:.1f}" for op, v in rpcs[:6])
            )
        if r.get("api_by_kind"):
            kinds = list(r["api_by_kind"].items())
            print(
                f"  N={r['n']}: API requests per retirement by verb and resource "
                "(the bed's own controllers included): "
                + ", ".join(f"{k} {v:.1f}" for k, v in kinds[:10])
            )
        if r["other_kinds"] or r["busy_errors"]:
            print(f"  N={r['n']}: {r['other_kinds']} held-request errors {r['busy_errors']}")
    for line in spread_of_runs(results):
        print(line)
    print(
        "  idle→next = victim engine idle (its held request answered) -> the retirement "
        "leaves Draining; idle→del = the same -> its Pods deleted (Settling begins); "
        "act/wft lag = history Scheduled -> Started of activities / "
        "workflow tasks; last del = starts -> the last victim Pod deleted; CPU, RSS, peak, "
        "threads = the worker's (procs 2: the sum of a workflows and an activities process); "
        "exec CPU = kwok's with its exec'd one-shots (the metric reads run there)"
    )


def picture(results: list[dict[str, Any]], path: Path = RESULTS / "worker_fleet.png") -> None:
    """Lags and cost against N, as a PNG."""
    ns = [r["n"] for r in results]
    with two_panels(path) as (lag, cost):
        lag.plot(ns, [r["idle_p50"] for r in results], "o-", label="idle → leaves Draining p50 (s)")
        lag.plot(
            ns, [r["idle_p99"] for r in results], "s--", label="idle → leaves Draining p99 (s)"
        )
        lag.plot(
            ns, [r["act_p99_ms"] / 1000 for r in results], "^:", label="activity start lag p99 (s)"
        )
        lag.set_xlabel("retirements at once (one worker)")
        lag.set_ylabel("s")
        lag.set_title(f"Lags (engines busy {results[0]['busy_s']:.0f} s)")
        lag.legend(fontsize=8)
        cost.bar([str(n) for n in ns], [r["execs_per_s"] for r in results], color="#219ebc")
        cost.set_xlabel("retirements at once")
        cost.set_ylabel("pods/exec per second")
        cost.set_ylim(0, max(r["execs_per_s"] for r in results) * 1.3 + 0.1)  # room for labels
        for i, r in enumerate(results):
            cost.text(
                i,
                r["execs_per_s"],
                f"{r['cpu_s']:.0f} CPU s\n{r['hwm_mib']:.0f} MiB peak",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        cost.set_title("Worker load")


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m bench worker")
    p.add_argument("--fleets", default="10,50,200", help="retirements at once, N")
    p.add_argument("--busy", type=float, default=60.0, help="seconds each victim stays busy")
    p.add_argument(
        "--namespaces",
        type=int,
        default=1,
        help="spread the N deployments over this many namespaces (default 1: all in one)",
    )
    p.add_argument(
        "--split",
        action="store_true",
        help="run the worker as two processes on the task queue: --serve workflows and "
        "--serve activities (default: one process serving both)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="run the engines with --enable-server-load-tracking (the drain reads /load)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run every fleet size this many times, each on a fresh bed (one run's figure "
        "varies a lot from the next at N = 200: the report gives each and their median)",
    )
    a = p.parse_args(argv)
    fleets = [int(x) for x in a.fleets.split(",") if x.strip()]
    # prints the table after each fleet
    results = asyncio.run(
        run(fleets, a.busy, max(1, a.namespaces), a.split, a.exact, max(1, a.runs))
    )
    picture(median_runs(results))
    return 0
