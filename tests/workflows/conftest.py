"""Fixtures of the workflow tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from tests.workflows.fakes import FakeWorld, running


@pytest.fixture
async def world_worker(
    time_skipping_env: WorkflowEnvironment,
) -> AsyncIterator[tuple[Client, FakeWorld, str]]:
    """A ``FakeWorld`` and a worker over it on the time-skipping server."""
    world = FakeWorld()
    async with running(time_skipping_env.client, world) as queue:
        yield time_skipping_env.client, world, queue
