"""A stand-in for the retirement workflow in the watcher benchmark: same workflow type and
``state`` query, but it only holds (no activity, so no API call of its own).

Without any worker, the watcher's ``state`` query of a running retirement waits for a
worker until its RPC deadline (about 30 s were measured), which would time the query, not
the watcher.  With this one, each started retirement stays Running in its first state
(Admitted, nothing done) and answers queries at once.
"""

from __future__ import annotations

from temporalio import workflow

from retirement.models import RetirementRequest, RetirementState


@workflow.defn(name="Retirement", sandboxed=False)
class HeldRetirement:
    """Holds in its first state until terminated."""

    @workflow.init
    def __init__(self, request: RetirementRequest) -> None:
        self._s = RetirementState.begin(workflow_id=workflow.info().workflow_id, request=request)

    @workflow.query
    def state(self) -> RetirementState:
        """The (first) state, as the real workflow's query returns it."""
        return self._s

    @workflow.run
    async def run(self, request: RetirementRequest) -> RetirementState:
        """Wait until terminated."""
        await workflow.wait_condition(lambda: False)
        return self._s
