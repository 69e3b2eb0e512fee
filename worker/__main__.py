"""``python -m worker``: host RetirementWorkflow and its activities until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities import Kube, RetirementActivities
from worker.config import WorkerConfig
from workflows.retirement import RetirementWorkflow

log = logging.getLogger("retire-worker")


def build_worker(client: Client, *, task_queue: str, kube: Kube,
                 executor: ThreadPoolExecutor) -> Worker:
    """A worker for one task queue and one cluster."""
    return Worker(client, task_queue=task_queue, workflows=[RetirementWorkflow],
                  activities=RetirementActivities(kube).all(), activity_executor=executor,
                  max_concurrent_activities=executor._max_workers)


async def serve(cfg: WorkerConfig) -> None:
    """Connect, run the worker, and shut it down gracefully on a signal."""
    client = await Client.connect(cfg.address, namespace=cfg.namespace, tls=cfg.tls,
                                  api_key=cfg.api_key, data_converter=pydantic_data_converter)
    kube = Kube.from_config(kubeconfig=cfg.kubeconfig)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    with ThreadPoolExecutor(max_workers=cfg.max_concurrent_activities) as executor:
        worker = build_worker(client, task_queue=cfg.task_queue, kube=kube, executor=executor)
        async with worker:
            log.info("worker on %s namespace %s task queue %s", cfg.address, cfg.namespace,
                     cfg.task_queue)
            await stop.wait()
            log.info("shutting down: finishing in-flight activity attempts")


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    cfg = WorkerConfig.parse(argv)
    try:
        asyncio.run(serve(cfg))
    except (OSError, RuntimeError) as e:
        print(f"retire-worker: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
