"""The worker's Prometheus endpoint on the real dev server: the SDK's own metrics and the
product's (``workflows/metrics.py``) on one ``/metrics``, after a completed and a held
retirement: counters named ``_total`` as the SDK's exporter serves them, and no gauge of
what holds (the watcher exports that, from Temporal's visibility)."""

from __future__ import annotations

import asyncio
import socket
import urllib.request

import pytest
from temporalio.testing import WorkflowEnvironment

from connection.client import connect
from connection.settings import ConnectionSettings
from retirement.phases import Outcome, Phase
from tests.helpers import eventually_async
from tests.helpers.dev_server import start, until
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import FakeWorld, running
from worker.telemetry import runtime_serving_metrics

pytestmark = [pytest.mark.devserver, pytest.mark.asyncio(loop_scope="session")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
        body: bytes = r.read()
        return body.decode()


async def test_the_worker_serves_sdk_and_retirement_metrics(dev_env: WorkflowEnvironment) -> None:
    address = f"127.0.0.1:{free_port()}"
    target = dev_env.client.service_client.config.target_host
    client = await connect(
        ConnectionSettings(address=target, namespace="default"),
        runtime=runtime_serving_metrics(address),
    )
    world = FakeWorld()
    async with running(client, world) as queue:
        done = await start(client, queue)
        await asyncio.wait_for(done.result(), 30)
        world.behaviour["drain"] = "failed"
        held = await start(client, queue)
        await until(held, Phase.ABORTED, Outcome.ABORTED)

        wanted = [
            ("retire_retirements_total", 'outcome="Completed"'),
            ("retire_retirements_total", 'outcome="Aborted"'),
            ("retire_phase_duration_seconds_count", 'phase="Draining"'),
            ("temporal_workflow_task_execution_latency_count", ""),
        ]

        def has_all() -> str | None:
            text = scrape(address)
            lines = text.splitlines()
            found = all(
                any(x.startswith(name + "{") and label in x for x in lines)
                for name, label in wanted
            )
            return text if found else None

        text = await eventually_async(
            lambda: asyncio.to_thread(has_all), what="every metric", timeout=20, interval=0.5
        )
        assert "# TYPE retire_retirements_total counter" in text
        # A gauge set from workflow code lived on whichever worker ran the last task (one
        # kept exporting 1 for ever, a terminate never reset it): gone from the worker.
        assert "retire_retirements_held" not in text and "retire_members_held" not in text
        await end_retirement(held)
