"""A workflow that decides on ``workflow.now()`` after a timer, and a worker of it to kill.

``ClockProbe`` sleeps ``SLEEP`` and then branches on the time the sleep took: a live task
after the timer fired always sees at least ``SLEEP`` pass ("due", then an activity); a
task decided on the clock of the task before the timer sees no time pass ("early", then
a timer).  The two branches issue different commands, so a history decided on the old
clock does not replay.  ``python -m tests.helpers.clock_probe TARGET QUEUE`` runs a
worker of it (with the SDK's sandbox) for a test to kill with SIGKILL; its sticky queue
then waits ``STICKY_WAIT`` for it before the server gives a query to another worker.
"""

from __future__ import annotations

import asyncio
import sys
from datetime import timedelta

from temporalio import activity, workflow

SLEEP = timedelta(seconds=2.5)
STICKY_WAIT = timedelta(seconds=3)


@activity.defn
async def probe_step() -> str:
    return "done"


@workflow.defn(name="ClockProbe")
class ClockProbe:
    def __init__(self) -> None:
        self.branch = "waiting"

    @workflow.query
    def branch_taken(self) -> str:
        return self.branch

    @workflow.run
    async def run(self) -> str:
        start = workflow.now()
        await workflow.sleep(SLEEP)
        if workflow.now() - start >= SLEEP:
            self.branch = "due"
            await workflow.execute_activity(
                probe_step, start_to_close_timeout=timedelta(seconds=10)
            )
        else:
            self.branch = "early"
            await workflow.sleep(timedelta(seconds=1))
        return self.branch


async def _serve(target: str, queue: str) -> None:
    from temporalio.client import Client
    from temporalio.worker import Worker

    client = await Client.connect(target)
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[ClockProbe],
        activities=[probe_step],
        sticky_queue_schedule_to_start_timeout=STICKY_WAIT,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(_serve(sys.argv[1], sys.argv[2]))
