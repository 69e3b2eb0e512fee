"""The product's worker (``python -m worker``) as a child process of the bed, for the
benchmarks and the bed tests that need it out of their own process (its CPU and memory
measured apart, killed and restarted, or split by ``--serve``)."""

from __future__ import annotations

import sys

from testbed.bed import Bed, _no_proxy_env
from testbed.procs import Child, wait_until
from worker.build import Serves


def start_worker_process(
    bed: Bed, *, target: str, queue: str, tag: str, serves: Serves = Serves.ALL
) -> Child:
    """``python -m worker`` on ``target``'s ``default`` namespace, polling ``queue``; the
    bed's kubeconfig unless it serves workflows only (which need none: proven by leaving
    it out).  Returns once the worker has said it polls."""
    env = _no_proxy_env()
    env.pop("KUBECONFIG", None)
    kube = [] if serves is Serves.WORKFLOWS else ["--kubeconfig", str(bed.cp.kubeconfig)]
    child = Child(
        name=f"worker-{tag}",
        argv=[
            sys.executable,
            "-m",
            "worker",
            "--address",
            target,
            "--task-queue",
            queue,
            "--serve",
            serves.value,
            *kube,
        ],
        log_path=bed.state_dir / "logs" / f"worker-{tag}.log",
        env=env,
    )
    try:
        wait_until(
            "worker polling", lambda: "task queue" in child.log_tail(), timeout=60, child=child
        )
    except BaseException:
        child.stop(timeout=5)  # never leave a process that nothing refers to
        raise
    return child
