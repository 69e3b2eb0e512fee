"""The people's CLI on the real dev server: ``status`` as a page and as JSON / YAML,
``watch`` until a retirement completes (exit 0) or holds (exit 3), one-line errors with
their exit codes, ``setup`` registering the search attributes idempotently, and the
``kubectl retire`` plugin name."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid

import pytest
import yaml
from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from cli.main import list_query
from cli.main import main as retire_cli
from retirement.models import RetirementRequest, workflow_id_for
from retirement.phases import Outcome, Phase
from testbed.paths import venv_bin
from tests.helpers import eventually_async
from tests.helpers.dev_server import running, start, until
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import FakeWorld
from workflows.mirror import SEARCH_ATTRIBUTES, initial_search_attributes
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.devserver, pytest.mark.asyncio(loop_scope="session")]
__all__ = ["running"]  # the fixture, shared


def cli(dev_env: WorkflowEnvironment, *args: str, namespace: str | None = None) -> int:
    target = dev_env.client.service_client.config.target_host
    ns = ["--temporal-namespace", namespace] if namespace else []
    return retire_cli(["--address", target, *ns, *args])


async def test_status_as_a_page_json_and_yaml(
    dev_env: WorkflowEnvironment,
    running: tuple[Client, FakeWorld, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, world, queue = running
    world.behaviour["drain"] = "hang"
    handle = await start(client, queue)
    await until(handle, Phase.DRAINING)
    ref = handle.id.removeprefix("retirement/")
    assert await asyncio.to_thread(cli, dev_env, "status", ref) == 0
    page = capsys.readouterr().out
    assert f"Target      {ref} server:1" in page
    assert "State       Draining (Running), phase deadline in" in page
    assert "Timeline" in page and "D Draining" in page
    assert f"retire abort {ref}" in page
    assert await asyncio.to_thread(cli, dev_env, "status", ref, "-o", "json") == 0
    as_json = json.loads(capsys.readouterr().out)
    assert as_json["phase"] == "Draining" and as_json["request"]["ordinal"] == 1
    assert await asyncio.to_thread(cli, dev_env, "status", ref, "-o", "yaml") == 0
    assert yaml.safe_load(capsys.readouterr().out)["workflow_id"] == handle.id
    await end_retirement(handle)


async def test_watch_follows_a_retirement_until_it_completes(
    dev_env: WorkflowEnvironment,
    running: tuple[Client, FakeWorld, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, _world, queue = running
    handle = await start(client, queue)
    ref = handle.id.removeprefix("retirement/")
    code = await asyncio.to_thread(cli, dev_env, "watch", ref, "--interval", "0.05")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "State       Completed (Completed)" in out
    assert out.count("--- ") >= 1  # at least one live page before the final one


async def test_watch_stops_with_3_when_the_retirement_holds(
    dev_env: WorkflowEnvironment,
    running: tuple[Client, FakeWorld, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, world, queue = running
    world.behaviour["drain"] = "failed"
    handle = await start(client, queue)
    ref = handle.id.removeprefix("retirement/")
    code = await asyncio.to_thread(cli, dev_env, "watch", ref, "--interval", "0.05")
    captured = capsys.readouterr()
    assert code == 3, captured
    assert "holds: it needs a retry or a cancel-intent" in captured.err
    assert "Aborted (Aborted)" in captured.out and f"retire retry {ref}" in captured.out
    await until(handle, Phase.ABORTED, Outcome.ABORTED)
    await end_retirement(handle)


async def test_errors_are_one_line_with_their_exit_code(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    assert await asyncio.to_thread(cli, dev_env, "status", "ops/never-there") == 1
    err = capsys.readouterr().err
    assert err == "retire: no retirement of ops/never-there (retirement/ops/never-there)\n"
    assert await asyncio.to_thread(cli, dev_env, "watch", "Bad/Ref") == 2
    assert len(capsys.readouterr().err.splitlines()) == 1
    assert await asyncio.to_thread(cli, dev_env, "watch", "ops/x", "--interval", "0") == 2
    assert capsys.readouterr().err == "retire: --interval must be positive\n"


async def test_setup_registers_the_search_attributes_once(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    client = dev_env.client
    ns = f"setup-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=ns, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )

    async def registered() -> bool:
        try:
            await client.operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=ns)
            )
        except Exception:
            return False
        return True

    await eventually_async(registered, what="the namespace", timeout=15)
    assert await asyncio.to_thread(cli, dev_env, "setup", namespace=ns) == 0
    out = capsys.readouterr().out
    assert all(f"{k.name} " in out for k in SEARCH_ATTRIBUTES) and "registered" in out
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=ns)
    )
    assert {k.name: int(k.indexed_value_type) for k in SEARCH_ATTRIBUTES}.items() <= dict(
        listed.custom_attributes
    ).items()
    assert await asyncio.to_thread(cli, dev_env, "setup", namespace=ns) == 0
    assert capsys.readouterr().out.count("already there") == len(SEARCH_ATTRIBUTES)
    # A name of ours registered with another type: a conflict, nothing changed.
    other = f"setup-{uuid.uuid4().hex[:6]}"
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=other, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    await eventually_async(
        lambda: client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=other,
                search_attributes={"RetirementPhase": IndexedValueType.INDEXED_VALUE_TYPE_INT},
            )
        ),
        accept=lambda _: True,
        what="a conflicting attribute",
        timeout=15,
        ignore=(Exception,),
    )
    assert await asyncio.to_thread(cli, dev_env, "setup", namespace=other) == 1
    assert "RetirementPhase is registered as Int, not Keyword" in capsys.readouterr().err


async def test_the_kubectl_plugin_name_runs_the_cli() -> None:
    done = await asyncio.to_thread(
        subprocess.run,
        [str(venv_bin("kubectl-retire")), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    assert done.stdout.startswith("usage: kubectl retire")


async def test_list_answers_quickly_when_a_retirement_has_no_worker(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running retirement whose worker is down cannot answer its state query: its row
    still prints, with "-" for the deadline and the reason, after the read's 2 s bound
    (before the bound, ``retire list`` waited on such queries; in CI, with the dev server
    holding other tests' retirements, each list took about 10 s)."""
    client = dev_env.client
    orphan = await start(client, f"nobody-{uuid.uuid4().hex[:8]}")  # no worker polls it
    ref = orphan.id.removeprefix("retirement/")
    t0 = time.monotonic()
    assert await asyncio.to_thread(cli, dev_env, "list", "-n", "ops") == 0
    took = time.monotonic() - t0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(ref + " "))
    assert row.split()[5:8] == ["-", orphan.id, "-"], row
    assert took < 15, took
    await orphan.terminate("test over")


async def test_list_as_json_limited_and_watch_with_a_timeout(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """``list -o json`` reads the search attributes the real server lists (the twin of the
    FakeTemporal listing); ``--limit`` bounds it; ``watch --timeout`` gives up with 1 on a
    retirement that goes on (no worker polls it here)."""
    client = dev_env.client
    orphan = await start(client, f"nobody-{uuid.uuid4().hex[:8]}")
    ref = orphan.id.removeprefix("retirement/")
    assert await asyncio.to_thread(cli, dev_env, "list", "-n", "ops", "-o", "json") == 0
    rows = json.loads(capsys.readouterr().out)
    (row,) = [r for r in rows if r["workflow"] == orphan.id]
    assert row["deployment"] == ref and row["outcome"] == "Running", row
    assert row["replica"] == "server:1" or row["replica"].endswith(":1"), row
    assert await asyncio.to_thread(cli, dev_env, "list", "-A", "--limit", "1", "-o", "yaml") == 0
    assert len(yaml.safe_load(capsys.readouterr().out)) == 1
    t0 = time.monotonic()
    code = await asyncio.to_thread(
        cli, dev_env, "watch", ref, "--interval", "0.1", "--timeout", "1"
    )
    assert code == 1 and time.monotonic() - t0 < 10
    assert "still runs after --timeout 1 s" in capsys.readouterr().err
    t0 = time.monotonic()  # no worker answers the state query: status gives up on time
    assert await asyncio.to_thread(cli, dev_env, "status", ref, "--timeout", "1") == 1
    assert time.monotonic() - t0 < 10
    assert "gave no answer within --timeout 1 s" in capsys.readouterr().err
    await orphan.terminate("test over")


async def test_the_server_filters_list_by_kubernetes_namespace(
    dev_env: WorkflowEnvironment, capsys: pytest.CaptureFixture[str]
) -> None:
    """``-n`` becomes ``RetirementDeployment STARTS_WITH 'ns/'`` in the visibility query, and
    the real server honours it (the offline fake does not read queries); ``-A`` lists every
    namespace."""
    client = dev_env.client
    ns = f"only-{uuid.uuid4().hex[:6]}"
    queue = f"nobody-{uuid.uuid4().hex[:8]}"  # no worker: the retirements just run
    req = RetirementRequest(namespace=ns, deployment="llm", role="server", ordinal=1)
    mine = await client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=workflow_id_for(namespace=ns, deployment="llm"),
        task_queue=queue,
        search_attributes=initial_search_attributes(req),
    )
    other = await start(client, queue)

    async def listed(*args: str) -> set[str]:
        assert await asyncio.to_thread(cli, dev_env, "list", *args, "-o", "json") == 0
        return {r["workflow"] for r in json.loads(capsys.readouterr().out)}

    await eventually_async(
        lambda: listed("-n", ns), accept=lambda ids: ids == {mine.id}, what="only ns listed"
    )
    assert {mine.id, other.id} <= await listed("-A")
    # The server itself filters (the CLI's own check is only a guard behind it).
    served = [wf.id async for wf in client.list_workflows(list_query(everything=False, scope=ns))]
    assert served == [mine.id]
    await mine.terminate("test over")
    await other.terminate("test over")
