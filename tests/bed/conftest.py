"""The session's Kubernetes test bed (one per test session; ~5 s warm start)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from activities import Kube
from retirement.names import GROUP, PLURAL, VERSION
from testbed.bed import Bed
from testbed.controlplane import hostile_exec_processes, kill_hostile_execs
from testbed.paths import REPO_ROOT
from testbed.procs import exit_on_sigterm
from worker.__main__ import build_worker


@pytest.fixture(scope="session")
def bed() -> Iterator[Bed]:
    """A running bed: etcd, kube-apiserver, kube-controller-manager, kwok, emulator hub."""
    exit_on_sigterm()  # a CI timeout's SIGTERM still stops the bed
    b = Bed(state_dir=REPO_ROOT / ".bed" / "test")
    try:
        b.start()
        yield b
    finally:
        b.stop()


@pytest.fixture
def api(bed: Bed) -> client.ApiClient:
    """An admin client of the bed."""
    return bed.api_client()


@pytest.fixture
def namespace(bed: Bed) -> str:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    bed.create_namespace(name)
    return name


def create_md(api: client.ApiClient, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Create a ModelDeployment."""
    result: dict[str, Any] = client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, manifest
    )
    return result


@pytest.fixture(autouse=True)
def _stop_what_the_test_started(bed: Bed) -> Iterator[None]:
    """Stop the stand-in operators and routers a test started, so the session's bed does
    not accumulate pollers (they would load the API server and starve later tests), and
    kill the hostile execs it left (kwok keeps them past their Pods: ten floods left by
    the hostile-exec tests cost every later test about a core, and CI's loaded
    scale-down ran twice as long)."""
    running = hostile_exec_processes()
    assert not running, f"hostile execs {running} outlived an earlier test"
    operators, routers = len(bed.operators), set(bed.routers)
    yield
    kill_hostile_execs()
    for op in bed.operators[operators:]:
        op.stop()
    del bed.operators[operators:]
    for name in set(bed.routers) - routers:
        bed.routers.pop(name).stop(timeout=5)


@dataclass
class Ctx:
    """A test's bed, dev server client, its own worker's task queue and namespace."""

    bed: Bed
    client: Client
    queue: str
    core: client.CoreV1Api
    ns: str


@pytest.fixture
async def ctx(bed: Bed, dev_env: WorkflowEnvironment, namespace: str) -> AsyncIterator[Ctx]:
    """A real worker (the product's activities against the bed) on a fresh task queue."""
    queue = f"retire-{uuid.uuid4().hex[:8]}"
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
    with ThreadPoolExecutor(max_workers=8) as pool:
        async with build_worker(dev_env.client, task_queue=queue, kube=kube, executor=pool):
            yield Ctx(
                bed=bed,
                client=dev_env.client,
                queue=queue,
                core=client.CoreV1Api(bed.api_client()),
                ns=namespace,
            )
