"""Every path of RetirementWorkflow on the time-skipping test server, with fake activities.

Budgets here are the real ones (300/30/240/30 s): the server skips the time.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowUpdateFailedError,
)
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import RetirementActivities
from kube.api import ExecResult
from retirement.budgets import Budgets
from retirement.models import (
    AbortRequest,
    CancelIntent,
    IntentKind,
    RetirementRequest,
    RetirementState,
    RetryRequest,
    RouterlessPolicy,
)
from retirement.phases import Outcome, Phase
from testbed.paths import venv_bin
from tests.conftest import register_search_attributes
from tests.helpers import model_deployment
from tests.helpers.fake_kube import FakeKube, member_pod, oneshot_stdout
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import FakeWorld, running, start
from worker.build import workflow_runner
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")

HISTORIES: list[tuple[str, object]] = []  # recorded for the replay test


@pytest.fixture
async def world_worker(
    time_skipping_env: WorkflowEnvironment,
) -> AsyncIterator[tuple[Client, FakeWorld, str]]:
    world = FakeWorld()
    async with running(time_skipping_env.client, world) as queue:
        yield time_skipping_env.client, world, queue


def request(**kw: object) -> RetirementRequest:
    base: dict[str, object] = {
        "namespace": "ns",
        "deployment": f"md-{uuid.uuid4().hex[:8]}",
        "role": "server",
        "ordinal": 1,
    }
    base.update(kw)
    return RetirementRequest.model_validate(base)


async def wait_held(handle: WorkflowHandle, timeout: float = 20.0) -> RetirementState:  # type: ignore[type-arg]
    """Query until the retirement holds (aborted, the restore done)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        if st.outcome is Outcome.ABORTED and not st.restoring:
            return st
        if loop.time() > end:
            raise AssertionError(f"not held: {st.phase}/{st.outcome}")
        await asyncio.sleep(0.05)


async def record(handle: WorkflowHandle) -> None:  # type: ignore[type-arg]
    HISTORIES.append((handle.id, await handle.fetch_history()))


async def wait_phase(
    handle: WorkflowHandle,
    phase: Phase,
    outcome: Outcome | None = None,  # type: ignore[type-arg]
    timeout: float = 10.0,
    env: WorkflowEnvironment | None = None,
) -> RetirementState:
    """Query until ``phase``; with ``env``, skip 30 s of server time between queries."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        if st.phase is phase and (outcome is None or st.outcome is outcome):
            return st
        if loop.time() > end:
            raise AssertionError(f"still {st.phase}/{st.outcome}, wanted {phase}")
        if env is not None:
            await env.sleep(timedelta(seconds=30))
        else:
            await asyncio.sleep(0.05)


async def test_happy_path(world_worker: tuple[Client, FakeWorld, str]) -> None:
    client, world, queue = world_worker
    req = request()
    handle = await start(client, queue, req)
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert st.phase is Phase.COMPLETED
    assert [p for p, _ in st.phase_timeline] == [
        Phase.ADMITTED,
        Phase.DISQUALIFIED,
        Phase.WITHDRAWING,
        Phase.DRAINING,
        Phase.DELETING,
        Phase.SETTLING,
        Phase.COMPLETED,
    ]
    assert world.calls == ["admit", "disqualify", "withdraw", "drain", "delete", "settle"]
    assert st.deleted is not None
    assert st.deleted.deleted == [f"{req.deployment}-server-1"] and st.deleted.refused is None
    # What the activities reported reached the state (carried in the events, recorded by
    # ``decide``): the target admission bound, the last phase's readings.
    assert st.target is not None and st.target.deployment == req.deployment
    assert st.last_readings == {"m": "settle reading"}
    assert world.published[-1].clear and world.published[-1].phase is Phase.COMPLETED
    desc = await handle.describe()
    sa = {k.name: v for k, v in ((p.key, p.value) for p in desc.typed_search_attributes)}
    assert sa["RetirementPhase"] == "Completed" and sa["RetirementOutcome"] == "Completed"
    assert sa["RetirementOrdinal"] == 1 and sa["RetirementRole"] == "server"
    await record(handle)


@pytest.mark.parametrize(
    ("phase_activity", "phase", "budget"),
    [
        ("withdraw", Phase.WITHDRAWING, 30.0),
        ("drain", Phase.DRAINING, 240.0),
        ("settle", Phase.SETTLING, 30.0),
    ],
)
async def test_phase_budget_exhausted(
    world_worker: tuple[Client, FakeWorld, str],
    time_skipping_env: WorkflowEnvironment,
    phase_activity: str,
    phase: Phase,
    budget: float,
) -> None:
    client, world, queue = world_worker
    world.behaviour[phase_activity] = "unknown"  # holds: never VERIFIED, never FAILED
    handle = await start(client, queue, request())
    if phase is Phase.SETTLING:
        st: RetirementState = await handle.result()
    else:
        st = await wait_phase(
            handle, Phase.ABORTED, Outcome.ABORTED, timeout=60, env=time_skipping_env
        )
    entered = next(t for p, t in st.phase_timeline if p is phase)
    left = next(
        t for p, t in st.phase_timeline if p in (Phase.ABORTED, Phase.COMPLETED) and t > entered
    )
    assert budget <= (left - entered).total_seconds() <= budget + 6
    if phase is Phase.SETTLING:
        # After the point of no return: deleted, but the settle was not confirmed.
        assert st.outcome is Outcome.COMPLETED_UNSETTLED
        assert "delete" in world.calls and "restore" not in world.calls
    else:
        assert st.outcome is Outcome.ABORTED or st.phase is Phase.ABORTED
        await end_retirement(handle)
        assert "delete" not in world.calls and "restore" in world.calls
        assert st.history[-1].furthest_phase is phase
    assert any("budget exhausted" in r for r in st.reasons), st.reasons
    await record(handle)


async def test_drain_held_then_aborted_at_drain_budget_with_real_300s_budget(
    world_worker: tuple[Client, FakeWorld, str],
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "unknown"  # an engine that stays busy
    handle = await start(client, queue, request())
    st = await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED, timeout=60, env=time_skipping_env)
    assert st.deadline is not None and st.started_at is not None
    drain_start = next(t for p, t in st.phase_timeline if p is Phase.DRAINING)
    # The drain phase ends at min(overall, start + 240 s).
    assert min(st.deadline, drain_start + timedelta(seconds=240)) == drain_start + timedelta(
        seconds=240
    )
    assert "restore" in world.calls and "delete" not in world.calls
    assert st.history[-1].furthest_phase is Phase.DRAINING
    assert st.history[-1].ended_at is not None
    drain_len = (st.history[-1].ended_at - drain_start).total_seconds()
    assert 240 <= drain_len <= 240 + 6, drain_len
    # Bounded cost: the early-UNKNOWN fake is re-run on a 5 s timer, never past the deadline.
    assert world.calls.count("drain") <= 240 / 5 + 2
    await end_retirement(handle)


async def test_overall_budget_bounds_every_phase(
    world_worker: tuple[Client, FakeWorld, str],
    time_skipping_env: WorkflowEnvironment,
) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "unknown"
    req = request(budgets={"overall_s": 60, "withdrawal_s": 30, "drain_s": 240, "settle_s": 30})
    handle = await start(client, queue, req)
    st = await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED, timeout=60, env=time_skipping_env)
    assert st.deadline is not None and st.history[-1].ended_at is not None
    # The drain was cut by the overall deadline, not its own 240 s.
    assert st.history[-1].ended_at <= st.deadline + timedelta(seconds=1)
    assert (st.deadline - st.phase_timeline[0][1]).total_seconds() == 60  # from admission
    assert "delete" not in world.calls
    await end_retirement(handle)


@pytest.mark.parametrize("phase_activity", ["disqualify", "withdraw", "drain"])
@pytest.mark.parametrize("how", ["update", "signal", "cancel"])
async def test_abort_before_deleting(
    world_worker: tuple[Client, FakeWorld, str],
    phase_activity: str,
    how: str,
) -> None:
    client, world, queue = world_worker
    world.behaviour[phase_activity] = "hang"
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event(phase_activity).wait(), 10)
    if how == "update":
        msg = await handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="oncall"))
        assert "aborting" in msg
    elif how == "signal":
        await handle.signal(RetirementWorkflow.abort_signal, AbortRequest(reason="oncall"))
    else:
        await handle.cancel()
    # Each way aborts the same way and holds, the replica kept (SPEC section 7): a
    # cancellation does not end the workflow, so the watcher does not start it again.
    st = await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED)
    st = await wait_held(handle)
    assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING
    if how == "cancel":
        assert st.cancelled and "workflow cancelled" in " ".join(st.reasons)
    await end_retirement(handle)
    assert "restore" in world.calls and "delete" not in world.calls
    assert world.published[-1].phase is Phase.ABORTED
    await record(handle)


async def test_cancel_during_the_restore_is_kept_and_the_retirement_holds(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    """A cancellation that arrives while a shielded step (the restore) runs is not lost:
    it is noted, the restore finishes, and the retirement holds with the replica kept."""
    client, world, queue = world_worker
    world.behaviour["drain"] = "failed"
    world.behaviour["restore"] = "hang"
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event("restore").wait(), 10)
    await handle.cancel()
    st = await wait_held(handle)
    assert st.cancelled and any("cancelled while aborting" in r for r in st.reasons)
    assert (await handle.describe()).status is WorkflowExecutionStatus.RUNNING
    assert "delete" not in world.calls and not world.published[-1].clear
    await end_retirement(handle)


async def test_abort_refused_once_deleting_began(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["delete"] = "hang"  # the delete takes 1 s: time to try to abort it
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event("delete").wait(), 10)
    with pytest.raises(WorkflowUpdateFailedError) as err:
        await handle.execute_update(RetirementWorkflow.abort, AbortRequest(reason="late"))
    assert "abort refused" in str(err.value.cause)
    await handle.signal(RetirementWorkflow.abort_signal, AbortRequest(reason="late signal"))
    await handle.cancel()  # cancellation does not stop the deletes either
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.COMPLETED
    assert "restore" not in world.calls and "settle" in world.calls
    assert any("abort signal ignored" in r for r in st.reasons)
    assert st.deleted is not None and st.deleted.deleted
    await record(handle)


async def test_abort_update_validator_rejects_bad_input(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "hang"
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event("drain").wait(), 10)
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("abort", {"reason": ""})
    with pytest.raises(WorkflowUpdateFailedError):
        await handle.execute_update("retry", {"token": "bad token with spaces"})
    st: RetirementState = await handle.query(RetirementWorkflow.state)
    assert st.phase is Phase.DRAINING and st.abort_requested is None  # left no trace
    await end_retirement(handle)


async def test_retry_replay_ignored_and_new_token_starts_fresh_attempt(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["withdraw"] = "failed"
    handle = await start(client, queue, request(last_consumed_retry_token="t1"))
    await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED)
    # A token equal to the last consumed one is a replay (checked before aborted-state).
    res = await handle.execute_update(RetirementWorkflow.retry, RetryRequest(token="t1"))
    assert res.decision == "Replay"
    st: RetirementState = await handle.query(RetirementWorkflow.state)
    assert st.phase is Phase.ABORTED and st.attempt == 1
    world.behaviour["withdraw"] = "verified"
    res = await handle.execute_update(RetirementWorkflow.retry, RetryRequest(token="t2"))
    assert res.decision == "Accept"
    # continue-as-new: the same workflow ID, a new run, fresh admission and budgets.
    final: RetirementState = await client.get_workflow_handle(
        handle.id, result_type=RetirementState
    ).result()
    assert final.outcome is Outcome.COMPLETED and final.attempt == 2
    assert final.last_consumed_retry_token == "t2"
    assert world.admissions == 2
    assert [h.outcome for h in final.history] == [Outcome.ABORTED, Outcome.COMPLETED]
    # A retry on a running (here completed) retirement: the replay check still comes first.


async def test_retry_signal_on_running_retirement_is_ignored(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "hang"
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event("drain").wait(), 10)
    res = await handle.execute_update(RetirementWorkflow.retry, RetryRequest(token="x9"))
    assert res.decision == "NotAborted"
    await handle.signal(RetirementWorkflow.retry_signal, RetryRequest(token="x9"))
    st: RetirementState = await handle.query(RetirementWorkflow.state)
    assert st.phase is Phase.DRAINING and st.attempt == 1
    await end_retirement(handle)


@pytest.mark.parametrize("when", ["draining", "held"])
async def test_cancel_intent_retains_capacity(
    world_worker: tuple[Client, FakeWorld, str],
    when: str,
) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "hang" if when == "draining" else "failed"
    handle = await start(client, queue, request())
    if when == "draining":
        await asyncio.wait_for(world.started_event("drain").wait(), 10)
    else:
        await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED)
    await handle.signal(RetirementWorkflow.cancel_intent, CancelIntent())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.CAPACITY_RETAINED
    assert "delete" not in world.calls and "restore" in world.calls
    assert world.published[-1].clear
    await record(handle)


async def test_second_start_for_same_deployment_is_refused(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "hang"
    req = request()
    handle = await start(client, queue, req)
    with pytest.raises(WorkflowAlreadyStartedError):
        await start(client, queue, req.model_copy(update={"ordinal": 0}))
    # Cancel only once admission has finished: the time-skipping server wedges a workflow
    # that cancels an activity in the task where that activity completes (sdk-java#2391;
    # the real server accepts it, see test_operating_on_dev_server).
    await asyncio.wait_for(world.started_event("drain").wait(), 10)
    await end_retirement(handle)


async def test_admission_refusal_touches_nothing(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.refusal = "prefill/decode member"
    handle = await start(client, queue, request())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.REFUSED
    assert world.calls == ["admit"]
    assert any("prefill/decode" in r for r in st.reasons)
    await record(handle)


async def test_admission_error_is_a_refusal_not_a_failed_workflow(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.refusal = "raise"
    handle = await start(client, queue, request())
    st: RetirementState = await handle.result()
    assert st.outcome is Outcome.REFUSED and world.calls == ["admit"]
    assert any("admission failed" in r and "422" in r for r in st.reasons), st.reasons


async def test_failed_verdict_aborts_now(world_worker: tuple[Client, FakeWorld, str]) -> None:
    client, world, queue = world_worker
    world.behaviour["drain"] = "failed"
    handle = await start(client, queue, request())
    st = await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED)
    assert any("drain failed" in r for r in st.reasons)
    assert "delete" not in world.calls
    await end_retirement(handle)


async def test_replay_recorded_histories() -> None:
    """Every history recorded above replays deterministically against today's code."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    assert HISTORIES, "the tests above record histories; run the module whole"
    replayer = Replayer(workflows=[RetirementWorkflow], data_converter=pydantic_data_converter)
    for _wid, history in HISTORIES:
        await replayer.replay_workflow(history)  # type: ignore[arg-type]


async def test_held_members_are_restored_once_they_qualify(
    world_worker: tuple[Client, FakeWorld, str],
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """Level-based restore: a member that did not qualify when the abort's restore ran
    (PodReady Unknown for a while) is evaluated again while held, on a backoff, until it
    is back in service; the hold itself goes on (no new attempt, no delete)."""
    client, world, queue = world_worker
    world.behaviour["drain"] = "failed"
    world.restores_held = 3
    req = request()
    handle = await start(client, queue, req)
    st = await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED, timeout=30)
    assert st.unrestored == {f"{req.deployment}-server-1": "PodReady is Unknown"}
    assert st.recheck_at is not None
    st = await eventually_held_restored(handle, time_skipping_env)
    assert world.calls.count("restore") == 4
    assert st.outcome is Outcome.ABORTED and st.unrestored == {}
    assert st.recheck_at is None  # nothing left to recheck: the hold has no timer
    assert "delete" not in world.calls and world.admissions == 1
    noted = [r for r in st.reasons if r.startswith("not yet back in service")]
    assert len(noted) == 1, st.reasons  # once per change, not once per round
    assert "every member that qualifies is back in service" in st.reasons
    # status.retirement.reason showed what was held, then that it is back.
    shown = [p.reason for p in world.published if p.outcome is Outcome.ABORTED]
    assert any(r.startswith("not yet back in service") for r in shown), shown
    assert shown[-1] == "every member that qualifies is back in service", shown
    await end_retirement(handle)


async def eventually_held_restored(
    handle: WorkflowHandle,
    env: WorkflowEnvironment,  # type: ignore[type-arg]
) -> RetirementState:
    for _ in range(40):
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        if st.outcome is Outcome.ABORTED and not st.unrestored and not st.restoring:
            return st
        await env.sleep(timedelta(seconds=10))
    raise AssertionError(f"members still held: {st.unrestored}")


async def test_a_long_hold_continued_as_new_resumes_held(
    world_worker: tuple[Client, FakeWorld, str],
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A run that starts from a carried held state (continue-as-new of a long hold) holds
    on where it was: no admission, the members still held are evaluated again, and a retry
    token still starts a fresh attempt."""
    client, world, queue = world_worker
    world.behaviour["drain"] = "failed"
    world.restores_held = 1
    first = await start(client, queue, request())
    held = await wait_phase(first, Phase.ABORTED, Outcome.ABORTED, timeout=30)
    await end_retirement(first)
    assert held.unrestored
    carried = held.carried_request()
    world.calls.clear()
    handle = await client.start_workflow(
        RetirementWorkflow.run,
        carried,
        id=f"{held.workflow_id}-carried",
        task_queue=queue,
        result_type=RetirementState,
    )
    st = await eventually_held_restored(handle, time_skipping_env)
    assert world.calls == ["restore"], world.calls  # no admission, one more restore round
    assert st.attempt == held.attempt and st.phase_timeline == held.phase_timeline
    world.behaviour["drain"] = "verified"
    res = await handle.execute_update(RetirementWorkflow.retry, RetryRequest(token="t-1"))
    assert res.decision == "Accept", res
    final: RetirementState = await client.get_workflow_handle(
        handle.id, result_type=RetirementState
    ).result()  # the fresh attempt's run
    assert final.outcome is Outcome.COMPLETED and final.attempt == held.attempt + 1
    assert world.calls[:2] == ["restore", "admit"], world.calls  # admitted afresh


@pytest.mark.parametrize("publish", ["hang", "failed"])
async def test_the_mirror_never_delays_the_restore(
    world_worker: tuple[Client, FakeWorld, str],
    publish: str,
) -> None:
    """A slow or failing status subresource costs no budget: the restore starts while the
    snapshots of the phases before it are still being published (or failing)."""
    client, world, queue = world_worker
    world.behaviour["publish"] = publish  # type: ignore[assignment]
    world.behaviour["drain"] = "failed"
    handle = await start(client, queue, request())
    await asyncio.wait_for(world.started_event("restore").wait(), 10)
    # Admitted, Disqualified, Withdrawing, Draining and Aborted were each queued first.
    assert world.published_before_restore < 5
    st = await wait_phase(handle, Phase.ABORTED, Outcome.ABORTED, timeout=30)
    assert st.restored is not None and st.restored.restored
    if publish == "failed":
        await end_retirement(handle)
        return
    for _ in range(200):  # the queue drains in order afterwards
        if len(world.published) >= 5:
            break
        await asyncio.sleep(0.1)
    assert [p.phase for p in world.published][:5] == [
        Phase.ADMITTED,
        Phase.DISQUALIFIED,
        Phase.WITHDRAWING,
        Phase.DRAINING,
        Phase.ABORTED,
    ]
    await end_retirement(handle)


# ---------------------------------------------------------------- with the real activities


async def test_an_unlabelled_surplus_member_is_shed_not_held() -> None:
    """Issue 9, end to end: the real activities against the fake cluster.  A surplus member
    without the eligibility label used to be admitted with no member to measure: its drain
    read "no member to measure" until the drain budget, then the retirement aborted and
    held.  Measured by the member-selection rule, it is drained (read idle twice) and shed.

    On a fresh test server of its own: the activities wait on the wall clock, so the
    server's clock must not have been skipped ahead by the tests above."""
    kube = FakeKube()
    ns, md = "ns", "llm"
    kube.add_deployment(model_deployment(md, namespace=ns, uid="md-uid", replicas=2, size=1))
    for name, ordinal, eligible in (
        ("llm-0", 0, True),
        ("llm-1-a", 1, True),
        ("llm-1-b", 1, False),
    ):
        kube.add_pod(
            member_pod(
                name,
                deployment=md,
                namespace=ns,
                ordinal=ordinal,
                uid=f"uid-{name}",
                ip=f"198.18.1.{10 + len(kube.pods)}",
                eligible=eligible,
            )
        )
    kube.script_exec(
        "llm-1-b", ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0), namespace=ns
    )
    req = request(
        namespace=ns,
        deployment=md,
        intent=IntentKind.SURPLUS_SHED,
        members=["llm-1-b"],
        budgets=Budgets(
            overall_s=60, withdrawal_s=10, drain_s=10, settle_s=10, poll_interval_s=0.1
        ),
        routerless_policy=RouterlessPolicy.QUIET_WINDOW,
        quiet_window_s=0.3,
    )
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_bin("temporal-test-server").resolve()),
        data_converter=pydantic_data_converter,
    )
    try:
        await register_search_attributes(env.client)
        queue = f"tq-{uuid.uuid4()}"
        with ThreadPoolExecutor(max_workers=4) as pool:
            async with Worker(
                env.client,
                task_queue=queue,
                workflows=[RetirementWorkflow],
                workflow_runner=workflow_runner(converter=env.client.data_converter),
                activities=RetirementActivities(kube).all(),
                activity_executor=pool,
                max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            ):
                handle = await start(env.client, queue, req)
                st = await until_ended(handle, timeout=60)
                if st.outcome is not Outcome.COMPLETED:
                    await end_retirement(handle)
                assert (st.phase, st.outcome) == (Phase.COMPLETED, Outcome.COMPLETED), st.reasons
                assert st.target is not None and st.target.measured == ("llm-1-b",)
                assert st.deleted is not None and st.deleted.deleted == ["llm-1-b"]
                assert {c.args["name"] for c in kube.called("exec_pod")} == {"llm-1-b"}
                assert {c.args["name"] for c in kube.called("delete_pod")} == {"llm-1-b"}
                assert (ns, "llm-1-a") in kube.pods and (ns, "llm-0") in kube.pods
    finally:
        await env.shutdown()


async def until_ended(handle: WorkflowHandle, *, timeout: float) -> RetirementState:  # type: ignore[type-arg]
    """Query (in real time) until the attempt has an outcome: completed, or aborted and
    held with its restore done."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        st: RetirementState = await handle.query(RetirementWorkflow.state)
        if st.outcome is not Outcome.RUNNING and not st.restoring:
            return st
        if loop.time() > end:
            raise AssertionError(f"still {st.phase}/{st.outcome}: {st.reasons}")
        await asyncio.sleep(0.1)


async def test_a_delete_refused_by_its_last_guard_drains_again_then_deletes(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["delete"] = "refuse"  # once: a router selects the victim again
    handle = await start(client, queue, request())
    st: RetirementState = await asyncio.wait_for(handle.result(), 30)
    assert st.outcome is Outcome.COMPLETED
    assert world.calls == [
        "admit", "disqualify", "withdraw", "drain", "delete", "drain", "delete", "settle"
    ]  # fmt: skip
    phases = [p for p, _ in st.phase_timeline]
    assert phases[3:7] == [Phase.DRAINING, Phase.DELETING, Phase.DRAINING, Phase.DELETING]
    assert any("delete refused: router" in r and "draining again" in r for r in st.reasons)
    assert [d.read_again for d in world.delete_inputs] == [False, False]  # fresh evidence
    await record(handle)


async def test_a_delete_refused_on_a_definite_fault_aborts_and_keeps_the_replica(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    client, world, queue = world_worker
    world.behaviour["delete"] = "refuse-failed"  # the label was put back meanwhile
    handle = await start(client, queue, request())
    st = await wait_held(handle)
    assert st.phase is Phase.ABORTED and st.deleted is None
    assert world.calls[-2:] == ["delete", "restore"]
    assert "delete refused: label re-added by someone else" in " ".join(st.reasons)
    await end_retirement(handle)
    await record(handle)


async def test_drain_evidence_stale_when_acted_on_goes_to_the_guard_that_reads_it_again(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    """A run under ``GUARD_REFRESH_PATCH``: the delete's guard takes stale evidence again
    itself (``activities.refresh``), so the workflow does not run another drain and two
    more workflow tasks first; the delete is handed the stale evidence as it is.  (Runs
    recorded before the patch drain again: their histories replay in test_histories.)"""
    client, world, queue = world_worker
    world.behaviour["drain"] = "stale"  # its idle read is a minute old
    handle = await start(client, queue, request())
    st: RetirementState = await asyncio.wait_for(handle.result(), 30)
    assert st.outcome is Outcome.COMPLETED
    assert world.calls == ["admit", "disqualify", "withdraw", "drain", "delete", "settle"]
    assert any("old" in r and "the delete's guard reads the engines again" in r for r in st.reasons)
    [delete] = world.delete_inputs
    assert delete.read_again  # the workflow's clock found it stale: read again, whatever
    assert delete.evidence_at is not None and delete.fresh_s is not None
    deleting = next(at for phase, at in st.phase_timeline if phase is Phase.DELETING)
    assert (deleting - delete.evidence_at).total_seconds() > delete.fresh_s


async def test_a_restore_that_did_nothing_holds_the_members_and_puts_them_back_later(
    world_worker: tuple[Client, FakeWorld, str],
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """A restore attempt that started after its deadline reported nothing: not "every
    member back" but every member still to put back, evaluated again while held."""
    client, world, queue = world_worker
    world.behaviour["drain"] = "failed"
    world.restores_empty = 1
    req = request()
    handle = await start(client, queue, req)
    st = await wait_held(handle)
    member = f"{req.deployment}-server-1"
    assert member in st.unrestored and "did not reach it" in st.unrestored[member]
    await time_skipping_env.sleep(timedelta(seconds=10))
    loop = asyncio.get_running_loop()
    end = loop.time() + 20
    while (st := await handle.query(RetirementWorkflow.state)).unrestored or st.restoring:
        assert loop.time() < end, st.unrestored
        await time_skipping_env.sleep(timedelta(seconds=5))
    assert world.calls.count("restore") == 2
    await end_retirement(handle)


async def test_a_cancel_while_the_mirror_flushes_before_a_retry_keeps_the_hold(
    world_worker: tuple[Client, FakeWorld, str],
) -> None:
    """A retry token ends a hold by continuing as new once the mirror has flushed; a
    cancellation that arrives during that flush is decided on first (it drops the retry),
    never swallowed: the retirement stays held in the same run."""
    client, world, queue = world_worker
    world.behaviour["drain"] = "failed"
    handle = await start(client, queue, request())
    await wait_held(handle)
    run_id = (await handle.describe()).run_id
    world.behaviour["publish"] = "hang"  # each snapshot takes 2 s
    await handle.signal(RetirementWorkflow.retry_signal, RetryRequest(token="t-1"))
    await asyncio.sleep(0.5)  # the retry was accepted; the flush is under way
    await handle.cancel()
    await asyncio.sleep(5)
    world.behaviour.pop("publish")
    st: RetirementState = await handle.query(RetirementWorkflow.state)
    assert (await handle.describe()).run_id == run_id  # not continued as new
    assert st.attempt == 1 and st.retry_token is None and st.outcome is Outcome.ABORTED
    assert any("retry token 't-1' dropped" in r for r in st.reasons)
    assert world.admissions == 1
    await end_retirement(handle)
