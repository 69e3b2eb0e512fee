"""The race that wedged two retirements in the fault campaign, on the real dev server,
with the SDK's runner and with the product's (``worker.build.workflow_runner``).

A worker runs ``ClockProbe`` and is killed (SIGKILL) while the probe sleeps; a query sent
at once waits on the dead worker's sticky queue, the timer fires meanwhile, and the
query reaches a second worker with a history that ends in a workflow task scheduled but
not started.  The SDK's runner lets the workflow decide on the clock of the task before
the timer and sends those commands with the next task: the history does not replay
(``[TMPRL1100]``, what the campaign's wedged runs fail with).  The product's runner
refuses that activation: the query fails, the next task replays on the recorded clock,
and the history replays.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from testbed.paths import REPO_ROOT
from tests.helpers import eventually_async
from tests.helpers.clock_probe import ClockProbe, probe_step
from worker.build import workflow_runner
from worker.stale_activations import REFUSED


async def _first_task_done(client: Client, workflow_id: str) -> bool | None:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    done = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    return True if any(e.event_type == done for e in history.events) else None


async def _race(
    client: Client, runner: WorkflowRunner
) -> tuple[str | Exception, str, Exception | None]:
    """Run the race; the query's answer (or error), the result, and the replay's failure."""
    queue = f"clock-{uuid.uuid4().hex[:8]}"
    target = client.service_client.config.target_host
    first = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.clock_probe", target, queue], cwd=REPO_ROOT
    )
    try:
        handle = await client.start_workflow(
            ClockProbe.run, id=f"clock-{uuid.uuid4().hex[:8]}", task_queue=queue
        )
        await eventually_async(
            lambda: _first_task_done(client, handle.id), what="the first task", timeout=30
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # The probe sleeps now; the query waits on the dead sticky queue while its timer fires.
    query = asyncio.create_task(handle.query(ClockProbe.branch_taken))
    async with Worker(
        client,
        task_queue=queue,
        workflows=[ClockProbe],
        activities=[probe_step],
        workflow_runner=runner,
    ):
        answer: str | Exception
        try:
            answer = await asyncio.wait_for(query, 30)
        except WorkflowQueryFailedError as e:
            answer = e
        result: str = await asyncio.wait_for(handle.result(), 60)
    history = await handle.fetch_history()
    replayed = await Replayer(workflows=[ClockProbe]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    return answer, result, replayed.replay_failure


async def test_the_sdk_runner_decides_on_the_old_clock_and_the_history_does_not_replay(
    dev_env: WorkflowEnvironment,
) -> None:
    answer, result, failure = await _race(dev_env.client, SandboxedWorkflowRunner())
    # The query saw the probe move on before its task started, on the old clock ...
    assert answer == "early"
    assert result == "early"
    # ... and the history cannot be replayed (if a new SDK fixes the race, this fails:
    # the guard may then go, see worker/stale_activations.py).
    assert failure is not None and "TMPRL1100" in str(failure)


async def test_the_product_runner_refuses_the_stale_activation_and_the_history_replays(
    dev_env: WorkflowEnvironment,
) -> None:
    answer, result, failure = await _race(
        dev_env.client, workflow_runner(converter=dev_env.client.data_converter)
    )
    # The race happened: the guard refused the activation the query brought ...
    assert isinstance(answer, WorkflowQueryFailedError) and REFUSED in str(answer)
    # ... and the real task decided on its own clock.
    assert result == "due"
    assert failure is None
