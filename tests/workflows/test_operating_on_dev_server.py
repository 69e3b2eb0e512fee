"""Operating a retirement on the real dev server: abort and retry through the project's CLI
and through the real ``temporal`` CLI (update and signal), query, and search attributes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import uuid

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from cli.main import main as retire_cli
from retirement.models import AbortRequest, RetirementState, workflow_id_for
from retirement.phases import Outcome, Phase
from testbed.paths import venv_bin
from tests.helpers import eventually_async, model_deployment
from tests.helpers.dev_server import running, start, until
from tests.helpers.fake_kube import FakeKube, member_pod
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import FakeWorld
from watcher.metrics import WatcherMetrics
from watcher.reconcile import Reconciler, WatcherSettings
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.devserver, pytest.mark.asyncio(loop_scope="session")]
__all__ = ["running"]  # the fixture, shared


async def temporal(dev_env: WorkflowEnvironment, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the real ``temporal`` CLI (off the event loop: the worker shares it)."""
    target = dev_env.client.service_client.config.target_host
    return await asyncio.to_thread(
        subprocess.run,
        [str(venv_bin("temporal")), *args, "--address", target],
        capture_output=True,
        text=True,
        timeout=30,
    )


def cli(dev_env: WorkflowEnvironment, *args: str) -> int:
    target = dev_env.client.service_client.config.target_host
    return retire_cli(["--address", target, *args])


async def test_abort_and_retry_with_the_temporal_cli(
    dev_env: WorkflowEnvironment,
    running: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = running
    world.behaviour["drain"] = "hang"
    handle = await start(client, queue)
    await asyncio.wait_for(world.started_event("drain").wait(), 10)
    # A bad abort is rejected by the validator and leaves no trace.
    bad = await temporal(
        dev_env,
        "workflow",
        "update",
        "execute",
        "--workflow-id",
        handle.id,
        "--name",
        "abort",
        "--input",
        json.dumps({"reason": ""}),
    )
    assert bad.returncode != 0 and "validation error for AbortRequest" in bad.stderr
    # The real CLI's update aborts.
    ok = await temporal(
        dev_env,
        "workflow",
        "update",
        "execute",
        "--workflow-id",
        handle.id,
        "--name",
        "abort",
        "--input",
        json.dumps({"reason": "on-call via temporal"}),
    )
    assert ok.returncode == 0, ok.stderr
    st = await until(handle, Phase.ABORTED, Outcome.ABORTED)
    assert st.reasons.count("abort requested: on-call via temporal") == 1
    # A retry token by signal starts a fresh attempt (continue-as-new).
    world.behaviour["drain"] = "verified"
    sig = await temporal(
        dev_env,
        "workflow",
        "signal",
        "--workflow-id",
        handle.id,
        "--name",
        "retry",
        "--input",
        json.dumps({"token": "tok-1"}),
    )
    assert sig.returncode == 0, sig.stderr
    final: RetirementState = await client.get_workflow_handle(
        handle.id, result_type=RetirementState
    ).result()
    assert final.outcome is Outcome.COMPLETED and final.attempt == 2
    # The UI's list filters by the typed search attributes.
    await asyncio.sleep(1.5)  # visibility is eventually consistent
    deployment = handle.id.split("/")[-1]
    query = f"RetirementOutcome = 'Completed' AND RetirementDeployment = 'ops/{deployment}'"
    found = [w.id async for w in client.list_workflows(query)]
    assert handle.id in found


async def test_abort_and_retry_with_the_project_cli(
    dev_env: WorkflowEnvironment,
    running: tuple[Client, FakeWorld, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    client, world, queue = running
    world.behaviour["withdraw"] = "hang"
    handle = await start(client, queue, last_consumed_retry_token="old")
    await asyncio.wait_for(world.started_event("withdraw").wait(), 10)
    ref = handle.id.removeprefix("retirement/")
    assert await asyncio.to_thread(cli, dev_env, "abort", "not a ref", "--reason", "x") == 2
    assert await asyncio.to_thread(cli, dev_env, "retry", ref, "--token", "bad token") == 2
    assert await asyncio.to_thread(cli, dev_env, "abort", ref, "--reason", "on-call") == 0
    await until(handle, Phase.ABORTED, Outcome.ABORTED)
    # Abort again: refused by the validator, exit 1 with the server's message.
    assert await asyncio.to_thread(cli, dev_env, "abort", ref, "--reason", "again") == 1
    assert "nothing to abort" in capsys.readouterr().err
    # The last consumed token is a replay: ignored.
    assert await asyncio.to_thread(cli, dev_env, "retry", ref, "--token", "old") == 0
    assert "Replay" in capsys.readouterr().out
    st: RetirementState = await handle.query(RetirementWorkflow.state)
    assert st.phase is Phase.ABORTED and st.attempt == 1
    assert await asyncio.to_thread(cli, dev_env, "status", ref, "-o", "json") == 0
    assert '"phase": "Aborted"' in capsys.readouterr().out
    await end_retirement(handle)


async def test_cancellation_racing_admission_aborts_and_holds_with_nothing_touched(
    running: tuple[Client, FakeWorld, str],
) -> None:
    """Cancelled the moment it starts: the cancel may reach the workflow in the very task in
    which admission completes.  The real server accepts that (the time-skipping server
    wedges on it, sdk-java#2391); the retirement aborts and holds (a cancellation keeps
    the replica, SPEC section 7), nothing deleted, the workflow still running."""
    client, world, queue = running
    handles = [await start(client, queue) for _ in range(5)]
    await asyncio.gather(*(h.cancel() for h in handles))
    for h in handles:
        st = await until(h, Phase.ABORTED, Outcome.ABORTED)
        assert st.cancelled and st.deleted is None
        assert (await h.describe()).status is WorkflowExecutionStatus.RUNNING
    assert "delete" not in world.calls
    for h in handles:
        await end_retirement(h)


@pytest.mark.parametrize("how", ["abort", "cancel"])
async def test_restore_waits_for_a_cancelled_phase_activity_to_stop(
    running: tuple[Client, FakeWorld, str], how: str
) -> None:
    """A phase activity that cannot hear the cancel (disqualify never heartbeats) goes on
    removing labels for a while: the restore must start only after it has stopped, or the
    label it removes last stays off a replica that is meant to be serving."""
    client, world, queue = running
    world.behaviour["disqualify"] = "stubborn"
    handle = await start(client, queue)
    await asyncio.wait_for(world.started_event("disqualify").wait(), 10)
    if how == "abort":
        await handle.signal("abort", AbortRequest(reason="oncall"))
        st = await until(handle, Phase.ABORTED, Outcome.ABORTED)
    else:
        await handle.cancel()
        st = await until(handle, Phase.ABORTED, Outcome.ABORTED)
    while st.restoring or st.restored is None:
        await asyncio.sleep(0.05)
        st = await handle.query(RetirementWorkflow.state)
    calls = world.calls
    assert "restore" in calls and "disqualify ended" in calls, calls
    assert calls.index("disqualify ended") < calls.index("restore"), calls
    assert st.restored is not None
    await end_retirement(handle)


async def test_the_ui_tells_the_story(
    dev_env: WorkflowEnvironment, running: tuple[Client, FakeWorld, str]
) -> None:
    """The workflow list shows what is retired; the details show what was asked; the
    current details follow the phase, the readings and, when held, how to act.  The
    summary and details are set by the product's own start paths and read back from
    Temporal's describe: the watcher's (``Starts._start``, on a scale-down it derived)
    and the CLI's (``retire start``)."""
    from temporalio.api.sdk.v1 import WorkflowMetadata

    client, world, queue = running
    world.behaviour["drain"] = "failed"
    # The watcher starts it: a deployment of 3 replicas scaled to 2 retires ordinal 2.
    ns, md = f"ui-{uuid.uuid4().hex[:6]}", "llama"
    kube = FakeKube()
    kube.add_deployment(model_deployment(md, namespace=ns, uid="md-uid", replicas=2))
    for o in range(3):
        kube.add_pod(
            member_pod(f"{md}-server-{o}", deployment=md, namespace=ns, ordinal=o, uid=f"u{o}")
        )
    rec = Reconciler(
        kube=kube,
        temporal=client,
        settings=WatcherSettings(task_queue=queue),
        metrics=WatcherMetrics(),
        namespaces=[ns],
    )
    await rec.reconcile_all()
    handle = client.get_workflow_handle(
        workflow_id_for(namespace=ns, deployment=md), result_type=RetirementState
    )
    desc = await handle.describe()
    assert await desc.static_summary() == f"retire {ns}/{md} server:2 (CountTrim)"
    details = await desc.static_details()
    assert details is not None
    assert f"**Deployment** {ns}/{md}" in details, details
    assert "**Replica** server:2 (CountTrim)" in details, details
    assert "**Budgets** overall 300 s, withdrawal 30 s, drain 240 s, settle 30 s" in details
    assert "**Router-less policy** hold" in details, details
    await until(handle, Phase.ABORTED, Outcome.ABORTED)
    meta = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    now = meta.current_details
    assert "**Aborted** (Aborted)" in now, now
    assert f"Held, replica kept and serving. Retry: `retire retry {ns}/{md} --token T`" in now
    assert "drain failed" in now, now
    await end_retirement(handle)
    # The CLI starts one by hand: the same story, with the budgets it was given.
    ref = f"ops/md-{uuid.uuid4().hex[:6]}"
    started = await asyncio.to_thread(
        cli,
        dev_env,
        "--task-queue",
        queue,
        "start",
        ref,
        "--role",
        "server",
        "--ordinal",
        "1",
        "--budgets",
        '{"drain_s": 120}',
        "--routerless-policy",
        "quiet-window",
    )
    assert started == 0
    by_hand = client.get_workflow_handle(f"retirement/{ref}", result_type=RetirementState)
    desc = await by_hand.describe()
    assert await desc.static_summary() == f"retire {ref} server:1 (CountTrim)"
    details = await desc.static_details()
    assert details is not None
    assert f"**Deployment** {ref}" in details and "drain 120 s" in details, details
    assert "**Router-less policy** quiet-window" in details, details
    await until(by_hand, Phase.ABORTED, Outcome.ABORTED)
    await end_retirement(by_hand)


async def test_retire_list_shows_running_and_held_retirements(
    dev_env: WorkflowEnvironment,
    running: tuple[Client, FakeWorld, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``retire list``: one line per retirement from Temporal's visibility (the search
    attributes the UI filters on): deployment, replica, phase, outcome, age."""
    client, world, queue = running
    world.behaviour["drain"] = "failed"
    held = await start(client, queue)
    await until(held, Phase.ABORTED, Outcome.ABORTED)
    ref = held.id.removeprefix("retirement/")

    async def listed() -> str | None:
        assert await asyncio.to_thread(cli, dev_env, "list", "--in", "ops") == 0
        out = capsys.readouterr().out
        line = next((x for x in out.splitlines() if x.startswith(ref + " ")), None)
        # Columns are padded to the widest row (other tests' retirements may be listed).
        return line if line is not None and line.split()[2:4] == ["Aborted", "Aborted"] else None

    line = await eventually_async(listed, what="the held retirement listed", timeout=15)
    assert line.split()[:4] == [ref, "server:1", "Aborted", "Aborted"], line
    # The deadline column says it holds; the reason is the state's last reason.
    assert line.split()[5:7] == ["held", held.id], line
    assert "aborted in Draining" in line, line
    world.behaviour["drain"] = "hang"
    running = await start(client, queue)
    await until(running, Phase.DRAINING)
    assert await asyncio.to_thread(cli, dev_env, "list", "--in", "ops") == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith(running.id.removeprefix("retirement/")))
    assert row.split()[2:4] == ["Draining", "Running"] and row.split()[5] == "in", row
    await end_retirement(running)
    assert await asyncio.to_thread(cli, dev_env, "list", "--in", "elsewhere") == 0
    assert ref not in capsys.readouterr().out
    assert await asyncio.to_thread(cli, dev_env, "list", "--in", "Not_A_Namespace") == 2
    assert "not a Kubernetes namespace" in capsys.readouterr().err
    await end_retirement(held)
