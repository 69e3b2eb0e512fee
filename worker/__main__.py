"""``python -m worker``: host RetirementWorkflow and its activities until SIGINT/SIGTERM.

Only the process around the worker lives here: parse (``worker.config``), connect
(``connection``), run ``worker.build.build_worker`` until a signal.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from activities.drain import limit_execs
from activities.polling import limit_polls
from connection.client import connect
from connection.errors import ConnectionConfigError
from kube.client import Kube
from worker.build import Serves, build_worker
from worker.config import WorkerConfig
from worker.telemetry import runtime_serving_metrics

__all__ = ["build_worker", "main", "serve"]  # build_worker: re-exported for older importers

log = logging.getLogger("retire-worker")


async def serve(cfg: WorkerConfig) -> None:
    """Connect, run the worker, and shut it down gracefully on a signal."""
    runtime = runtime_serving_metrics(cfg.metrics_address) if cfg.metrics_address else None
    client = await connect(cfg.connection, runtime=runtime)
    if cfg.metrics_address:
        log.info("metrics on http://%s/metrics", cfg.metrics_address)
    limit_execs(cfg.max_concurrent_execs)
    limit_polls(cfg.max_concurrent_polls)
    kube = (
        None
        if cfg.serves is Serves.WORKFLOWS
        else Kube.from_config(kubeconfig=cfg.kubeconfig, connections=cfg.max_concurrent_activities)
    )
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


def main(argv: list[str] | None = None) -> int:
    """Entry point: 2 for bad configuration, 1 when Temporal or the cluster cannot be used."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = WorkerConfig.parse(argv)
    except ConnectionConfigError as e:
        print(f"retire-worker: {e}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(cfg))
    except (OSError, RuntimeError) as e:
        print(f"retire-worker: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
