"""``python -m worker``: host RetirementWorkflow and its activities until SIGINT/SIGTERM.

Only the process around the worker lives here: parse (``worker.config``), check what can be
checked before connecting (the kubeconfig, the metrics address), connect (``connection``),
run ``worker.build.build_worker`` until a signal.

Exit codes: 2 for a bad setting (one line on stderr naming it), 1 when Temporal or the
cluster cannot be used (one line), 0 after a signal.  Once the Temporal SDK's runtime has
started, the process ends with ``os._exit`` (``_end``): see there why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import NoReturn

from temporalio.runtime import Runtime

from activities.drain import limit_execs
from activities.polling import limit_polls
from connection.client import connect
from connection.errors import ConnectionConfigError
from kube.client import Kube
from worker.build import Serves, build_worker
from worker.config import LOG_FORMAT, WorkerConfig
from worker.telemetry import runtime_serving_metrics

__all__ = ["build_worker", "main", "serve"]  # build_worker: re-exported for older importers

log = logging.getLogger("retire-worker")
PROG = "retire-worker"


class StartupError(Exception):
    """A setting that parsed but cannot be used (exit 2); the message names it, one line."""


class Unreachable(Exception):
    """Temporal (or the cluster) cannot be used now (exit 1); the message is one line."""


def one_line(error: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (YAML and SDK messages span several)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_kube(cfg: WorkerConfig) -> Kube | None:
    """The cluster accessor, or None for a workflows-only worker; StartupError when the
    kubeconfig (or the in-cluster configuration) cannot be loaded.  Nothing is dialled."""
    if cfg.serves is Serves.WORKFLOWS:
        return None
    try:
        return Kube.from_config(
            kubeconfig=cfg.kubeconfig, connections=cfg.max_concurrent_activities
        )
    except Exception as e:  # a missing file, bad YAML, not a kubeconfig, no cluster env
        raise StartupError(kube_error(cfg.kubeconfig, e)) from e


def kube_error(kubeconfig: str | None, error: BaseException) -> str:
    """Why the Kubernetes configuration cannot be loaded, naming where it was looked for."""
    if kubeconfig:
        return f"--kubeconfig (or KUBECONFIG) {kubeconfig}: cannot load it: {one_line(error)}"
    return f"no --kubeconfig (or KUBECONFIG) and no in-cluster configuration: {one_line(error)}"


def metrics_runtime(cfg: WorkerConfig) -> Runtime | None:
    """The SDK runtime serving ``/metrics`` (None without ``--metrics-address``);
    StartupError when the address cannot be listened on (in use, not an address here)."""
    if not cfg.metrics_address:
        return None
    try:
        return runtime_serving_metrics(cfg.metrics_address)
    except (ValueError, RuntimeError, OSError) as e:
        raise StartupError(
            f"--metrics-address (or RETIRE_METRICS_ADDRESS) {cfg.metrics_address}: "
            f"cannot listen there: {one_line(e)}"
        ) from e


async def serve(
    cfg: WorkerConfig, *, kube: Kube | None = None, runtime: Runtime | None = None
) -> None:
    """Connect, run the worker, and shut it down gracefully on a signal."""
    if kube is None and cfg.serves is not Serves.WORKFLOWS:
        kube = load_kube(cfg)
    if runtime is None and cfg.metrics_address:
        runtime = metrics_runtime(cfg)
    log.debug("connecting to Temporal at %s", cfg.connection.describe())
    try:
        client = await connect(cfg.connection, runtime=runtime)
    except RuntimeError as e:
        raise Unreachable(
            f"cannot connect to Temporal at {cfg.connection.describe()}: {one_line(e)}"
        ) from e
    if cfg.metrics_address:
        log.info("metrics on http://%s/metrics", cfg.metrics_address)
    limit_execs(cfg.max_concurrent_execs)
    limit_polls(cfg.max_concurrent_polls)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with ThreadPoolExecutor(max_workers=cfg.max_concurrent_activities) as executor:
        worker = build_worker(
            client, task_queue=cfg.task_queue, kube=kube, executor=executor, serves=cfg.serves
        )
        async with worker:
            log.info(
                "worker on %s task queue %s (serving %s)",
                cfg.connection.describe(),
                cfg.task_queue,
                cfg.serves.value,
            )
            await stop.wait()
            log.info("shutting down: finishing in-flight activity attempts")


def configure_logging(level: str) -> None:
    """Log lines on stderr, each with its level, from ``level`` up."""
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)


def _fail(code: int, message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
    return code


def _end(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's finalization.

    The Temporal SDK completes its calls from its own (Rust, Tokio) threads: a failed
    ``Client.connect`` sets the Python future's result through ``call_soon_threadsafe``,
    whose write to the loop's socket releases the GIL.  The main thread then sees the
    error, returns, and the interpreter finalizes while that thread still has to take the
    GIL back; during finalization it cannot, and ``PyGILState_Release`` aborts the process
    (SIGABRT, exit 134) or it segfaults.  Reproduced in about one run in three against a
    closed port, in a ten-line script with only ``Client.connect``.  Nothing of the
    worker's needs finalization once it has stopped serving (the executor is joined, the
    worker shut down), so the process flushes its output and leaves with ``os._exit``.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """Entry point: 2 for bad configuration, 1 when Temporal or the cluster cannot be used.

    A bad setting returns 2; once serving has begun the process ends here (``_end``)."""
    try:
        cfg = WorkerConfig.parse(argv)
    except ConnectionConfigError as e:
        return _fail(2, str(e))
    configure_logging(cfg.log_level)
    log.debug("configuration: %r", cfg)
    try:
        kube = load_kube(cfg)
        runtime = metrics_runtime(cfg)
    except StartupError as e:
        return _fail(2, str(e))
    # From here the SDK's runtime and its threads may exist: leave through _end.
    try:
        asyncio.run(serve(cfg, kube=kube, runtime=runtime))
        code = 0
    except StartupError as e:
        code = _fail(2, str(e))
    except Unreachable as e:
        code = _fail(1, str(e))
    except (OSError, RuntimeError) as e:
        code = _fail(1, one_line(e))
    _end(code)


if __name__ == "__main__":
    raise SystemExit(main())
