"""``build_worker``: one Temporal worker hosting the retirement for one cluster.

Kept apart from ``worker.__main__`` so tests, the benchmark and the demo build the very
worker the product runs, on a client of their own, without the command line.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum

from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities import RetirementActivities
from activities.fairslots import WorkerSlots
from kube.client import Kube
from worker.context_free import ContextFreeSerialization, context_free
from worker.stale_activations import StaleActivationGuard
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow


class Serves(StrEnum):
    """What one worker process hosts (``retire-worker --serve``)."""

    #: Workflows and activities in one process (the default).
    ALL = "all"
    #: Workflow tasks only: no Kubernetes access (no kubeconfig needed).
    WORKFLOWS = "workflows"
    #: Activities only: the Kubernetes reads, writes and drain execs.
    ACTIVITIES = "activities"


def workflow_runner(*, converter: DataConverter) -> WorkflowRunner:
    """How the worker runs workflow code: the SDK's sandbox, with activations on a stale
    clock refused (``worker.stale_activations``); when ``converter`` (the client's) is
    context free, the SDK's per-payload context questions are answered outside the sandbox
    (``worker.context_free``)."""
    sandbox: WorkflowRunner = SandboxedWorkflowRunner()
    if context_free(converter):
        sandbox = ContextFreeSerialization(sandbox)
    return StaleActivationGuard(sandbox)


def build_worker(
    client: Client,
    *,
    task_queue: str,
    kube: Kube | None,
    executor: ThreadPoolExecutor,
    serves: Serves = Serves.ALL,
    slots: WorkerSlots | None = None,
) -> Worker:
    """A worker for one task queue and one cluster, hosting what ``serves`` says.

    Workflow tasks run on the worker's event loop and activities on ``executor``'s
    threads, under one interpreter lock: with hundreds of busy retirements, the polls'
    decoding delays the workflow tasks (measured in the worker benchmark).  Two processes
    on one task queue, one ``WORKFLOWS`` and one ``ACTIVITIES``, keep them apart: for
    workers on separate machines (on one 2-core machine the split measured worse).

    ``slots``: the worker's exec and poll slots, owned by its activities (None: the
    process's default pools)."""
    activities = serves is not Serves.WORKFLOWS
    if activities and kube is None:
        raise ValueError(f"a worker serving {serves.value} needs a cluster (kube)")
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[RetirementWorkflow] if serves is not Serves.ACTIVITIES else [],
        activities=(
            RetirementActivities(kube, slots=slots).all() if kube is not None and activities else []
        ),
        workflow_runner=workflow_runner(converter=client.data_converter),
        activity_executor=executor if activities else None,
        max_concurrent_activities=executor._max_workers if activities else None,
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
    )
