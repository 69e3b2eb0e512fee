"""Paths of a retirement whose histories are kept for the replay test (safe upgrades).

A held retirement can live for days, so a new build must replay the histories of the
build before it.  ``tests/workflows/histories/*.json`` holds one history per run of the
paths below, recorded with fake activities (``FakeWorld``): the workflow, its timers,
signals, updates, cancellation and continue-as-new are real.  ``test_histories`` replays
every file with today's workflow; a change to the workflow that does not replay fails it
(docs/runbook.md, "Upgrading", says what to do then).

Record them again (only on purpose: the files are the baseline a change is checked
against; see "Upgrading")::

    .venv/bin/python -m tests.workflows.history_paths

Most paths run on the time-skipping test server; the continue-as-new of a long hold runs
on the dev server, told to suggest continuing as new after a few events.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from retirement.models import (
    AbortRequest,
    CancelIntent,
    RetirementRequest,
    RetirementState,
    RetryRequest,
)
from retirement.phases import Outcome
from tests.helpers.retirements import end_retirement
from tests.workflows.fakes import FakeWorld
from worker.build import workflow_runner
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow

HISTORIES = Path(__file__).parent / "histories"

Handle = WorkflowHandle[Any, RetirementState]
#: A recorded run: its file's name (without ``.json``) and its history.
Run = tuple[str, WorkflowHistory]


@dataclass
class Ctx:
    """What a path runs on."""

    env: WorkflowEnvironment
    world: FakeWorld
    queue: str

    @property
    def client(self) -> Client:
        return self.env.client

    async def start(self, req: RetirementRequest | str, *, wid: str | None = None) -> Handle:
        """Start a retirement (a name: of that deployment); its first run, pinned."""
        if isinstance(req, str):
            req = RetirementRequest(namespace="hist", deployment=req, role="server", ordinal=1)
        started = await self.client.start_workflow(
            RetirementWorkflow.run,
            req,
            id=wid or f"retirement/{req.namespace}/{req.deployment}",
            task_queue=self.queue,
        )
        return self.client.get_workflow_handle(
            started.id, run_id=started.result_run_id, result_type=RetirementState
        )

    def latest(self, handle: Handle) -> Handle:
        """The workflow's latest run, whichever it is (after a continue-as-new)."""
        return self.client.get_workflow_handle(handle.id, result_type=RetirementState)

    async def pinned(self, handle: Handle) -> Handle:
        """``handle``'s run as it is now, pinned."""
        run_id = (await handle.describe()).run_id
        return self.client.get_workflow_handle(
            handle.id, run_id=run_id, result_type=RetirementState
        )

    async def until(
        self,
        handle: Handle,
        accept: Callable[[RetirementState], bool],
        what: str,
        *,
        skip: timedelta | None = None,
        timeout: float = 60.0,
    ) -> RetirementState:
        """Query until ``accept``; with ``skip``, move the time-skipping server's clock
        on that much between queries."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while True:
            st: RetirementState = await handle.query(RetirementWorkflow.state)
            if accept(st):
                return st
            if loop.time() > end:
                raise AssertionError(f"not {what}: {st.phase}/{st.outcome} {st.reasons[-3:]}")
            if skip is not None:
                await self.env.sleep(skip)
            else:
                await asyncio.sleep(0.05)


async def settled_history(handle: Handle, timeout: float = 20.0) -> WorkflowHistory:
    """The history of a running workflow once it waits on nothing but a timer or a
    signal: no activity pending, its last workflow task completed."""
    from temporalio.api.enums.v1 import EventType

    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        desc = await handle.describe()
        history = await handle.fetch_history()
        last = history.events[-1].event_type
        quiet = not desc.raw_description.pending_activities
        if quiet and last == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            return history
        if loop.time() > end:
            raise AssertionError(f"still busy: last event {last}")
        await asyncio.sleep(0.05)


def held(st: RetirementState) -> bool:
    return st.outcome is Outcome.ABORTED and not st.restoring


def held_all_back(st: RetirementState) -> bool:
    return held(st) and not st.unrestored and st.recheck_at is None


async def complete(c: Ctx) -> list[Run]:
    """Every phase verified: deleted and settled."""
    h = await c.start("complete")
    assert (await h.result()).outcome is Outcome.COMPLETED
    return [("complete", await h.fetch_history())]


async def stale_evidence(c: Ctx) -> list[Run]:
    """The drain's answer rests on an idle read a minute old when it is decided on: the
    delete's guard takes it again (``GUARD_REFRESH_PATCH``), deleted and settled."""
    c.world.behaviour["drain"] = "stale"
    h = await c.start("stale-evidence")
    st = await h.result()
    assert st.outcome is Outcome.COMPLETED and c.world.calls.count("drain") == 1, c.world.calls
    return [("stale-evidence", await h.fetch_history())]


async def abort_and_hold(c: Ctx) -> list[Run]:
    """Aborted by the update while draining; the first restore finds the member not back
    yet, the hold's timer looks again and puts it back; a cancellation (the UI's) while
    held keeps it held.  Recorded while still held: what an upgrade meets."""
    c.world.behaviour["drain"] = "hang"
    c.world.restores_held = 1
    h = await c.start("abort-hold")
    await asyncio.wait_for(c.world.started_event("drain").wait(), 20)
    await h.execute_update(RetirementWorkflow.abort, AbortRequest(reason="on call"))
    await c.until(h, lambda st: held(st) and bool(st.unrestored), "held, member not back")
    await c.until(h, held_all_back, "held, member back", skip=timedelta(seconds=5))
    await h.cancel()
    await c.until(h, lambda st: held(st) and st.cancelled, "held after a cancellation")
    history = await settled_history(h)
    await end_retirement(h)
    return [("abort-hold", history)]


async def retry_by_signal(c: Ctx) -> list[Run]:
    """A definite fault while withdrawing aborts and holds; the ``retry`` signal with a new
    token continues as new: a fresh attempt that completes."""
    c.world.behaviour["withdraw"] = "failed"
    h = await c.start("retry-signal")
    await c.until(h, held_all_back, "held")
    c.world.behaviour["withdraw"] = "verified"
    await h.signal(RetirementWorkflow.retry_signal, RetryRequest(token="t2"))
    st = await h.result()  # follows the run it continued as new into
    assert st.outcome is Outcome.COMPLETED and st.attempt == 2, st.outcome
    second = await c.pinned(c.latest(h))
    assert second.run_id != h.run_id
    return [
        ("retry-signal-1", await h.fetch_history()),
        ("retry-signal-2", await second.fetch_history()),
    ]


async def cancel_intent_end(c: Ctx) -> list[Run]:
    """The drain fails, the retirement holds; cancel-intent ends the hold (capacity
    retained)."""
    c.world.behaviour["drain"] = "failed"
    h = await c.start("cancel-intent")
    await c.until(h, held_all_back, "held")
    await h.signal(RetirementWorkflow.cancel_intent, CancelIntent(reason="kept"))
    assert (await h.result()).outcome is Outcome.CAPACITY_RETAINED
    return [("cancel-intent", await h.fetch_history())]


async def reruns_then_abort(c: Ctx) -> list[Run]:
    """Withdrawal reads UNKNOWN until its budget: the activity runs again after a short
    timer each time, then the retirement aborts, holds, and cancel-intent ends it."""
    c.world.behaviour["withdraw"] = "unknown"
    h = await c.start("reruns")
    await c.until(h, held_all_back, "held", skip=timedelta(seconds=10))
    await end_retirement(h)
    return [("reruns", await h.fetch_history())]


async def long_hold_carried(c: Ctx) -> list[Run]:
    """The run a long hold continues as new into, started from the carried state: it holds
    on, puts the member back on its timer, and a retry token starts a fresh attempt."""
    c.world.behaviour["drain"] = "failed"
    c.world.restores_held = 1
    first = await c.start("carried-from")
    st = await c.until(first, lambda st: held(st) and bool(st.unrestored), "held")
    await end_retirement(first)
    c.world.restores_held = 1
    h = await c.start(st.carried_request(), wid=f"{st.workflow_id}-carried")
    await c.until(h, held_all_back, "held, member back", skip=timedelta(seconds=10))
    await end_retirement(h)
    return [("long-hold-carried", await h.fetch_history())]


async def long_hold_continued(c: Ctx) -> list[Run]:
    """A long hold continued as new for real (the server suggests it after
    ``SUGGEST_CONTINUE_AS_NEW`` events): the first run ends in continue-as-new when its
    recheck timer fires; the next run resumes held, looks at the member twice more (once
    on its own timer) until it is back, and cancel-intent ends it."""
    c.world.behaviour["drain"] = "failed"
    c.world.restores_held = 2
    h = await c.start("continued")
    nxt = c.latest(h)
    st = await c.until(nxt, held_all_back, "held, member back", timeout=90)
    run2 = await c.pinned(nxt)
    assert st.attempt == 1
    await end_retirement(run2)
    first, second = await h.fetch_history(), await run2.fetch_history()
    started = second.events[0].workflow_execution_started_event_attributes
    assert started.continued_execution_run_id == h.run_id, "not the run the hold continued in"
    return [("long-hold-continued-1", first), ("long-hold-continued-2", second)]


#: Events after which the dev server suggests continuing as new when recording: fewer than
#: the first run has when it holds, more than the continued run has.
SUGGEST_CONTINUE_AS_NEW = 60

Path_ = Callable[[Ctx], Awaitable[list[Run]]]
#: The paths that run on the time-skipping server.
TIME_SKIPPING: list[Path_] = [
    complete,
    stale_evidence,
    abort_and_hold,
    retry_by_signal,
    cancel_intent_end,
    reruns_then_abort,
    long_hold_carried,
]
#: Recorded into ``histories/`` (the carried run is the continued one's second half).
RECORDED_TIME_SKIPPING: list[Path_] = [p for p in TIME_SKIPPING if p is not long_hold_carried]


async def run_paths(env: WorkflowEnvironment, paths: list[Path_]) -> list[Run]:
    """Run ``paths`` each with a fresh world and worker; their runs' histories by name."""
    out: list[Run] = []
    for path in paths:
        world = FakeWorld()
        queue = f"hist-{path.__name__}"
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[RetirementWorkflow],
            workflow_runner=workflow_runner(converter=env.client.data_converter),
            activities=world.activities(),
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        ):
            out += await path(Ctx(env=env, world=world, queue=queue))
    return out


async def record() -> None:
    from testbed.paths import venv_bin
    from tests.conftest import project_search_attributes, register_search_attributes

    recorded: list[Run] = []
    ts = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_bin("temporal-test-server").resolve()),
        data_converter=pydantic_data_converter,
    )
    async with ts:
        await register_search_attributes(ts.client)
        recorded += await run_paths(ts, RECORDED_TIME_SKIPPING)
    dev = await WorkflowEnvironment.start_local(
        dev_server_existing_path=str(venv_bin("temporal").resolve()),
        data_converter=pydantic_data_converter,
        search_attributes=project_search_attributes(),
        ui=False,
        dev_server_extra_args=[
            "--dynamic-config-value",
            f"limit.historyCount.suggestContinueAsNew={SUGGEST_CONTINUE_AS_NEW}",
        ],
    )
    async with dev:
        recorded += await run_paths(dev, [long_hold_continued])
    HISTORIES.mkdir(exist_ok=True)
    for name, history in recorded:
        (HISTORIES / f"{name}.json").write_text(history.to_json() + "\n")
        print(f"{name}: {len(history.events)} events", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(record())
