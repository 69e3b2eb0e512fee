"""What the fleet benchmarks share: progress lines, the Temporal dev server with its metrics
endpoint, counters read from the API server's and the dev server's ``/metrics``, a child
process's CPU time and memory from ``/proc``, percentiles, tables and pictures."""

from __future__ import annotations

import math
import os
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from retirement.names import GROUP, VERSION
from testbed.bed import Bed
from testbed.paths import REPO_ROOT
from testbed.procs import Child, free_port
from testbed.temporal_dev import TemporalDevConfig, load_config, start_dev_server

RESULTS = REPO_ROOT / "bench" / "results"


@contextmanager
def two_panels(path: Path, *, figsize: tuple[float, float] = (11, 4.2), **kw: Any) -> Iterator[Any]:
    """Two side-by-side panels (matplotlib axes) for the block to draw; then the figure is
    saved to ``path`` as a PNG and its path printed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=figsize, **kw)
    try:
        yield panels
        fig.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)
    print(f"  picture: {path}")


def say(msg: str) -> None:
    """A progress line."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ Temporal


@dataclass
class DevServer:
    """A Temporal dev server of the benchmark's own (own ports, own database)."""

    cfg: TemporalDevConfig
    child: Child

    @property
    def target(self) -> str:
        """The frontend's address."""
        return self.cfg.address

    async def client(self) -> Client:
        """A client with the product's data converter."""
        return await Client.connect(
            self.cfg.address, namespace=self.cfg.namespace, data_converter=pydantic_data_converter
        )

    def frontend_requests(self) -> dict[str, float]:
        """The dev server's frontend requests so far, by operation (its ``/metrics``)."""
        url = f"http://{self.cfg.host}:{self.cfg.metrics_port}/metrics"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            if fam.name not in ("service_requests", "service_requests_total"):
                continue
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                if s.labels.get("service_name", "frontend") != "frontend":
                    continue
                op = s.labels.get("operation", "?")
                out[op] = out.get(op, 0.0) + s.value
        return out

    def latencies(self) -> dict[tuple[str, str, str], tuple[float, float]]:
        """(histogram, service, operation) -> (count, sum of seconds) so far, of the dev
        server's ``persistence_latency`` (its database calls) and ``service_latency`` (its
        services' handling of each request) histograms (its ``/metrics``)."""
        url = f"http://{self.cfg.host}:{self.cfg.metrics_port}/metrics"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=10) as r:
            text = r.read().decode()
        out: dict[tuple[str, str, str], tuple[float, float]] = {}
        for fam in text_string_to_metric_families(text):
            if fam.name not in ("persistence_latency", "service_latency"):
                continue
            for s in fam.samples:
                kind = s.name.rpartition("_")[2]
                if kind not in ("count", "sum"):
                    continue
                key = (fam.name, s.labels.get("service_name", "?"), s.labels.get("operation", "?"))
                count, total = out.get(key, (0.0, 0.0))
                out[key] = (count + s.value, total) if kind == "count" else (count, total + s.value)
        return out


def start_temporal(state_dir: Path) -> DevServer:
    """Start a dev server from ``temporal-dev.yaml`` on free ports (metrics on)."""
    host = "127.0.0.1"
    cfg = load_config().with_ports(
        port=free_port(host),
        http_port=free_port(host),
        ui_port=free_port(host),
        metrics_port=free_port(host),
        db_filename=state_dir / "temporal.db",
    )
    state_dir.mkdir(parents=True, exist_ok=True)
    cfg.db_filename.unlink(missing_ok=True)
    return DevServer(cfg=cfg, child=start_dev_server(cfg, log_dir=state_dir / "logs"))


# ------------------------------------------------------------------ counters


def apiserver_requests(bed: Bed) -> dict[tuple[str, str, str], float]:
    """``apiserver_request_total`` by (verb, resource, subresource), from its ``/metrics``."""
    text = bed.cp._get("/metrics")
    out: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "apiserver_request":
            continue
        for s in fam.samples:
            if s.name != "apiserver_request_total":
                continue
            key = (s.labels["verb"], s.labels["resource"], s.labels.get("subresource", ""))
            out[key] = out.get(key, 0.0) + s.value
    return out


def diff(after: dict[Any, float], before: dict[Any, float]) -> dict[Any, float]:
    """``after - before`` per key (keys with no change dropped)."""
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v}


def prom_counters(url: str, prefix: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every ``*_total`` sample under ``prefix`` at ``url`` (a Prometheus text endpoint)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as r:
        text = r.read().decode()
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(prefix) and s.name.endswith("_total"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# ------------------------------------------------------------------ processes


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its reaped children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(fields[i]) for i in (11, 12, 13, 14))
    return (utime + stime + cutime + cstime) / _TICK


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of ``pid`` in MiB (``VmRSS`` now, ``VmHWM`` the peak)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return math.nan


def threads(pid: int) -> int:
    """The number of threads of ``pid`` now (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


# ------------------------------------------------------------------ figures


def pct(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table (right-aligned figures)."""

    def cell(v: Any) -> str:
        if isinstance(v, float):
            if math.isnan(v):
                return "n/a"
            return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def wait_until(what: str, check: Callable[[], Any], *, timeout: float, every: float = 0.5) -> Any:
    """Poll ``check`` until truthy (exceptions count as not yet); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as e:
            last = e
        time.sleep(every)
    raise TimeoutError(f"{what}: not true after {timeout:.0f} s (last: {last!r})")


def with_timeout_delete_namespace(core: client.CoreV1Api, ns: str, timeout: float = 300) -> None:
    """Delete the namespace and wait (bounded) until it is gone, so the next fleet starts on
    a quiet API server."""
    try:
        core.delete_namespace(ns)
        wait_until(
            f"namespace {ns} gone",
            lambda: ns not in {n.metadata.name for n in core.list_namespace().items},
            timeout=timeout,
            every=2,
        )
    except Exception as e:
        say(f"namespace {ns} not deleted in time: {e}")


def vllm_manifest(
    name: str, *, replicas: int = 2, router: str | None = None, extra_args: Sequence[str] = ()
) -> dict[str, Any]:
    """A vLLM 0.29.0 ModelDeployment of ``replicas`` single-member replicas, behind a router
    of kind ``router`` (the CRD's kind; None: router-less), with ``extra_args``."""
    spec: dict[str, Any] = {
        "engine": {"name": "vLLM", "version": "0.29.0"},
        "roles": [
            {"name": "server", "replicas": replicas, "size": 1, "extraArgs": list(extra_args)}
        ],
    }
    if router is not None:
        spec["router"] = {"kind": router}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }
