"""A hostile engine container cannot stretch the drain read's exec past its bounds (issue 22,
H1), through the real API server and kwok.

The Pods here are named so that kwok runs their execs with a hostile ``python3``
(``testbed.controlplane.HOSTILE_EXECS``, ``testbed/hostile_python3/sitecustomize.py``): one
that floods stdout for ever, one that floods stderr, one that never prints nor exits.  The
one-shot starts ``python3 -ISc``, which keeps ``PYTHONPATH`` and ``sitecustomize`` out,
so the read names the hostile interpreter itself (``testbed/hostile_python3/python3``, as
a container whose ``python3`` is hostile would run it) before the rest of the drain
one-shot's command.  The worker's exec (``Kube.exec_pod``, the product's 5 s bound and
64 KiB cap) must end within the bound plus 1 s, with a reason, and the worker's memory
(this process's RSS, sampled every 20 ms) must stay bounded.  Before the reader enforced
its bounds while reading, one such read took 18 s and +120 MiB.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kubernetes import client

from activities.oneshot import EXEC_TIMEOUT_S, command
from activities.sampling import OUTPUT_CAP
from kube.api import ExecResult
from kube.client import Kube
from retirement.names import ENGINE_CONTAINER
from retirement.readings import SERIES
from testbed.bed import Bed
from testbed.controlplane import HOSTILE_EXECS, HOSTILE_PYTHONPATH, NODE_NAME
from tests.helpers import eventually

pytestmark = pytest.mark.bed

MiB = 1 << 20
#: How much this process's RSS may grow during one hostile read.
RSS_BOUND = 32 * MiB


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def measured(fn: Callable[[], ExecResult]) -> tuple[ExecResult, float, int]:
    """``fn``'s result, how long it took, and the most this process's RSS grew meanwhile."""
    base, peak, done = rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], rss() - base)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        result = fn()
    finally:
        took = time.monotonic() - started
        done.set()
        sampler.join()
    return result, took, peak[0]


def hostile_pod(core: client.CoreV1Api, namespace: str, name: str) -> None:
    core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                node_name=NODE_NAME,
                containers=[client.V1Container(name=ENGINE_CONTAINER, image="hostile/engine")],
                termination_grace_period_seconds=0,
            ),
        ),
    )

    def ready() -> bool:
        pod = core.read_namespaced_pod(name, namespace)
        conds = {c.type: c.status for c in pod.status.conditions or []}
        return pod.status.phase == "Running" and conds.get("Ready") == "True"

    eventually(ready, what=f"{name} Running", timeout=60, ignore=(Exception,))


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("hostile-python3-flood-stdout", "exec output over its cap"),
        ("hostile-python3-flood-stderr", "exec stderr over its cap"),
        ("hostile-python3-hang", f"exec exceeded {EXEC_TIMEOUT_S:g} s"),
    ],
)
def test_a_hostile_python3_cannot_stretch_the_drain_read(
    bed: Bed, api: client.ApiClient, namespace: str, name: str, why: str
) -> None:
    core = client.CoreV1Api(api)
    hostile_pod(core, namespace, name)
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig), connections=4)
    argv = command(port=9, scheme="http", path="/metrics", names=SERIES["vLLM"].all)
    assert argv[:2] == ["python3", "-ISc"]
    argv[0] = str(HOSTILE_PYTHONPATH / "python3")  # the container's python3 is hostile

    def read() -> ExecResult:
        return kube.exec_pod(
            namespace=namespace,
            name=name,
            container=ENGINE_CONTAINER,
            argv=argv,
            timeout_s=EXEC_TIMEOUT_S,
            output_cap=OUTPUT_CAP,
        )

    for attempt in range(3):  # three reads in a row: the bound holds each time
        result, took, grew = measured(read)
        assert result.error == why, (attempt, result.error[:200])
        assert result.stdout == ""
        assert took < EXEC_TIMEOUT_S + 1, f"read {attempt}: {took:.1f} s"
        assert grew < RSS_BOUND, f"read {attempt}: RSS grew {grew / MiB:.0f} MiB"


def bytes_read() -> int:
    """Bytes this process has read so far, sockets included (``rchar`` of /proc/self/io)."""
    lines = Path("/proc/self/io").read_text().splitlines()
    return next(int(line.split()[1]) for line in lines if line.startswith("rchar:"))


def test_a_flooding_python3_costs_the_worker_nothing_once_the_read_ends(
    bed: Bed, api: client.ApiClient, namespace: str
) -> None:
    """At the cap the worker closes the websocket and reads nothing more of the flood.

    What happens to the flooding process is the runtime's business, not the worker's: the
    runtime does not kill an exec'd process when its client goes away (kubernetes/kubernetes
    #89031, opencontainers/runc#3359).  Measured on the bed: kwok v0.8.0's exec server keeps
    draining the process's stdout after the client left, so a hostile ``python3`` floods on
    (~400 MB/s written, ~10 CPU ticks a second) for as long as its container lives.  An
    earlier version of this test asserted that it went quiet; it passed while the first
    seconds happened to be blocked in ``anon_pipe_write`` and failed CI once they were not.
    The product's own one-shot cannot flood: it prints a bounded summary and exits."""
    name = "hostile-python3-flood-stdout"
    assert HOSTILE_EXECS[name] == "flood-stdout"
    core = client.CoreV1Api(api)
    hostile_pod(core, namespace, name)
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig), connections=4)
    before = bytes_read()
    result = kube.exec_pod(
        namespace=namespace,
        name=name,
        container=ENGINE_CONTAINER,
        argv=["python3", "-c", "pass"],
        timeout_s=EXEC_TIMEOUT_S,
        output_cap=OUTPUT_CAP,
    )
    assert result.error == "exec output over its cap", result
    assert bytes_read() - before >= OUTPUT_CAP, "the measure below would not see a flood"
    time.sleep(1)  # what the socket had buffered is gone with it
    start = bytes_read()
    time.sleep(3)
    grew = bytes_read() - start
    # The flood runs at hundreds of MB/s; this process's own reads of /proc are bytes.
    assert grew < 64 * 1024, f"the worker read {grew} bytes in 3 s after its read ended"
