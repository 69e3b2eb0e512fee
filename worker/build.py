"""``build_worker``: one Temporal worker hosting the retirement for one cluster.

Kept apart from ``worker.__main__`` so tests, the benchmark and the demo build the very
worker the product runs, on a client of their own, without the command line.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from temporalio.client import Client
from temporalio.worker import Worker

from activities import RetirementActivities
from kube.client import Kube
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow


def build_worker(
    client: Client, *, task_queue: str, kube: Kube, executor: ThreadPoolExecutor
) -> Worker:
    """A worker for one task queue and one cluster."""
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[RetirementWorkflow],
        activities=RetirementActivities(kube).all(),
        activity_executor=executor,
        max_concurrent_activities=executor._max_workers,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
