"""Ending a retirement in a test the way the product ends one.

A cancellation no longer ends a retirement (it aborts and holds, SPEC section 7), and a
terminate skips the mirror's last write (a pending ``publish`` stalls the time-skipping
server's clock).  What ends one for good is what the watcher sends when the intent goes
away: cancel-intent.  A running retirement then aborts and restores; a held one ends
once every member is back (``CapacityRetained``)."""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio.client import WorkflowHandle

from retirement.models import CancelIntent, RetirementState
from retirement.phases import Outcome
from workflows.retirement import RetirementWorkflow

ENDED = (Outcome.CAPACITY_RETAINED, Outcome.COMPLETED, Outcome.COMPLETED_UNSETTLED)


async def end_retirement(
    handle: WorkflowHandle[Any, Any], *, timeout: float = 60.0
) -> RetirementState:
    """Send cancel-intent and wait for the retirement's result (its worker must run)."""
    await handle.signal(RetirementWorkflow.cancel_intent, CancelIntent(reason="test over"))
    raw = await asyncio.wait_for(handle.result(), timeout)
    st = raw if isinstance(raw, RetirementState) else RetirementState.model_validate(raw)
    assert st.outcome in ENDED, st.outcome
    return st
