"""``python -m worker``: host RetirementWorkflow and its activities until SIGINT/SIGTERM.

Only the process around the worker lives here: parse (``worker.config``), check what can be
checked before connecting (the kubeconfig, the metrics address), connect (``connection``),
run ``worker.build.build_worker`` until a signal.

Exit codes: 2 for a bad setting (one line on stderr naming it), 1 when Temporal or the
cluster cannot be used (one line), 0 after a signal.  Once the Temporal SDK's runtime has
started, the process ends with ``os._exit`` (``connection.process.end_process``): see there why.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from concurrent.futures import ThreadPoolExecutor

from temporalio.runtime import Runtime

from connection.client import connect
from connection.errors import ConnectionConfigError
from connection.process import LOG_FORMAT, end_process, error_line, fail, kubeconfig_error
from kube.client import Kube
from worker.build import Serves, build_worker
from worker.config import WorkerConfig
from worker.telemetry import runtime_serving_metrics

__all__ = ["build_worker", "main", "serve"]  # build_worker: re-exported for older importers

log = logging.getLogger("retire-worker")
PROG = "retire-worker"


class StartupError(Exception):
    """A setting that parsed but cannot be used (exit 2); the message names it, one line."""


class Unreachable(Exception):
    """Temporal (or the cluster) cannot be used now (exit 1); the message is one line."""


def load_kube(cfg: WorkerConfig) -> Kube | None:
    """The cluster accessor, or None for a workflows-only worker; StartupError when the
    kubeconfig (or the in-cluster configuration) cannot be loaded.  Nothing is dialled."""
    if cfg.serves is Serves.WORKFLOWS:
        return None
    try:
        return Kube.from_config(
            kubeconfig=cfg.kubeconfig,
            connections=cfg.max_concurrent_activities,
            program="retire-worker",
        )
    except Exception as e:  # a missing file, bad YAML, not a kubeconfig, no cluster env
        raise StartupError(kubeconfig_error(cfg.kubeconfig, e)) from e


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
            f"cannot listen there: {error_line(e)}"
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
            f"cannot connect to Temporal at {cfg.connection.describe()}: {error_line(e)}"
        ) from e
    if cfg.metrics_address:
        log.info("metrics on http://%s/metrics", cfg.metrics_address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with ThreadPoolExecutor(max_workers=cfg.max_concurrent_activities) as executor:
        worker = build_worker(
            client,
            task_queue=cfg.task_queue,
            kube=kube,
            executor=executor,
            serves=cfg.serves,
            slots=cfg.slots(),
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


def main(argv: list[str] | None = None) -> int:
    """Entry point: 2 for bad configuration, 1 when Temporal or the cluster cannot be used.

    A bad setting returns 2; once serving has begun the process ends here
    (``connection.process.end_process``)."""
    try:
        cfg = WorkerConfig.parse(argv)
    except ConnectionConfigError as e:
        return fail(PROG, 2, str(e))
    configure_logging(cfg.log_level)
    log.debug("configuration: %r", cfg)
    try:
        kube = load_kube(cfg)
        runtime = metrics_runtime(cfg)
    except StartupError as e:
        return fail(PROG, 2, str(e))
    # From here the SDK's runtime and its threads may exist: leave through end_process.
    try:
        asyncio.run(serve(cfg, kube=kube, runtime=runtime))
        code = 0
    except StartupError as e:
        code = fail(PROG, 2, str(e))
    except Unreachable as e:
        code = fail(PROG, 1, str(e))
    except (OSError, RuntimeError) as e:
        code = fail(PROG, 1, error_line(e))
    end_process(code)


if __name__ == "__main__":
    raise SystemExit(main())
