"""In-test fake activities for the workflow tests: each phase's behaviour is scripted.

They are fakes of the world, not of the logic under test: the workflow, its handlers,
timers, cancellation and continue-as-new all run for real on a Temporal server.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from temporalio import activity
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

from retirement.models import (
    Admission,
    AdmitInput,
    DeleteResult,
    MemberTarget,
    Observation,
    PhaseInput,
    PublishInput,
    RestoreResult,
    RetirementRequest,
    RetirementState,
    Target,
)
from retirement.phases import Verdict
from worker.build import workflow_runner
from workflows.options import HEARTBEAT_THROTTLE
from workflows.retirement import RetirementWorkflow

Behaviour = Literal[
    "verified", "hang", "failed", "unknown", "stubborn", "stale", "refuse", "refuse-failed"
]


def make_target(
    req_ns: str = "ns", dep: str = "md", role: str = "server", ordinal: int = 1
) -> Target:
    """A two-member-free, one-member vLLM target."""
    return Target(
        namespace=req_ns,
        deployment=dep,
        role=role,
        ordinal=ordinal,
        intent="CountTrim",
        engine="vLLM",
        shape="Single",
        members=[
            MemberTarget(
                pod=f"{dep}-{role}-{ordinal}",
                uid=f"uid-{ordinal}",
                container_id="containerd://abc",
                ip="198.18.1.9",
                measured=True,
                eligible_at_admission=True,
                metrics_port=9100,
            )
        ],
        observed_generation=3,
    )


@dataclass
class FakeWorld:
    """Scripted behaviour per phase activity, and a record of every call."""

    behaviour: dict[str, Behaviour] = field(default_factory=dict)
    refusal: str = ""
    calls: list[str] = field(default_factory=list)
    #: What each delete run was handed.
    delete_inputs: list[PhaseInput] = field(default_factory=list)
    published: list[PublishInput] = field(default_factory=list)
    admissions: int = 0
    #: How many restore runs still find the members not qualifying (held).
    restores_held: int = 0
    #: How many restore runs still do nothing at all (an attempt that started too late).
    restores_empty: int = 0
    #: How many delete runs still refuse (``refuse``/``refuse-failed``) before deleting.
    refusals: int = 1
    #: How many snapshots were published when the last restore began.
    published_before_restore: int = -1
    started: dict[str, asyncio.Event] = field(default_factory=dict)

    def started_event(self, name: str) -> asyncio.Event:
        """Set when the named activity starts."""
        return self.started.setdefault(name, asyncio.Event())

    def _carry(self, inp: PhaseInput) -> int:
        """Publish the snapshots the phase carries, as ``activities.alongside`` does (at
        its start), unless the status subresource is scripted to hang or fail: then none
        is published and the workflow's publish activity gets them all."""
        if self.behaviour.get("publish") in ("hang", "failed"):
            return 0
        self.published.extend(inp.mirror)
        return len(inp.mirror)

    async def _phase(self, name: str, inp: PhaseInput) -> Observation:
        carried = self._carry(inp)
        obs = await self._phase_body(name)
        return obs.model_copy(update={"mirrored": carried})

    async def _phase_body(self, name: str) -> Observation:
        self.calls.append(name)
        self.started_event(name).set()
        mode = self.behaviour.get(name, "verified")
        if mode == "verified":
            return Observation(
                verdict=Verdict.VERIFIED,
                reason=f"{name} ok",
                readings={"m": f"{name} reading"},
                # The time-skipping server's clock, as the workflow's: read "now".
                evidence_at=activity.info().current_attempt_scheduled_time,
            )
        if mode == "failed":
            return Observation(verdict=Verdict.FAILED, reason=f"{name} definite fault")
        if mode == "stale":  # the idle read the verdict rests on is a minute old
            self.behaviour[name] = "verified"
            return Observation(
                verdict=Verdict.VERIFIED,
                reason=f"{name} ok",
                evidence_at=activity.info().current_attempt_scheduled_time - timedelta(minutes=1),
            )
        if mode == "unknown":
            return Observation(verdict=Verdict.UNKNOWN, reason=f"{name} budget exhausted")
        if mode == "stubborn":  # a synchronous step that never heartbeats: deaf to a cancel
            await asyncio.shield(asyncio.sleep(1.5))
            self.calls.append(f"{name} ended")
            return Observation(
                verdict=Verdict.VERIFIED,
                reason=f"{name} ok",
                evidence_at=activity.info().current_attempt_scheduled_time,
            )
        while True:  # hang until cancelled, heartbeating like the real pollers
            activity.heartbeat()
            await asyncio.sleep(0.05)

    @activity.defn(name="admit")
    async def admit(self, inp: AdmitInput) -> Admission:
        self.calls.append("admit")
        self.admissions += 1
        if self.refusal == "raise":
            from temporalio.exceptions import ApplicationError

            raise ApplicationError("HTTP 422 Unprocessable", type="Invalid", non_retryable=True)
        if self.refusal:
            return Admission(refusal=self.refusal)
        r = inp.request
        return Admission(target=make_target(r.namespace, r.deployment, r.role, r.ordinal))

    @activity.defn(name="disqualify")
    async def disqualify(self, inp: PhaseInput) -> Observation:
        return await self._phase("disqualify", inp)

    @activity.defn(name="withdraw")
    async def withdraw(self, inp: PhaseInput) -> Observation:
        return await self._phase("withdraw", inp)

    @activity.defn(name="drain")
    async def drain(self, inp: PhaseInput) -> Observation:
        return await self._phase("drain", inp)

    @activity.defn(name="settle")
    async def settle(self, inp: PhaseInput) -> Observation:
        return await self._phase("settle", inp)

    @activity.defn(name="delete")
    async def delete(self, inp: PhaseInput) -> DeleteResult:
        carried = self._carry(inp)
        result = await self._delete(inp)
        return result.model_copy(update={"mirrored": carried})

    async def _delete(self, inp: PhaseInput) -> DeleteResult:
        self.calls.append("delete")
        self.delete_inputs.append(inp)
        self.started_event("delete").set()
        mode = self.behaviour.get("delete")
        if mode == "hang":
            await asyncio.sleep(1.0)  # long enough for a test to try an abort meanwhile
        if mode in ("refuse", "refuse-failed") and self.refusals > 0:
            self.refusals -= 1
            verdict = Verdict.FAILED if mode == "refuse-failed" else Verdict.UNKNOWN
            reason = "label re-added by someone else" if mode == "refuse-failed" else "router"
            return DeleteResult(refused=Observation(verdict=verdict, reason=reason))
        return DeleteResult(deleted=[m.pod for m in inp.target.members], workload="none")

    @activity.defn(name="restore")
    async def restore(self, inp: PhaseInput) -> RestoreResult:
        self.calls.append("restore")
        self.published_before_restore = len(self.published)
        self.started_event("restore").set()
        if self.behaviour.get("restore") == "hang":
            await asyncio.sleep(1.0)  # long enough for a test to cancel meanwhile
        if self.restores_empty > 0:  # started past its deadline: reports nothing
            self.restores_empty -= 1
            return RestoreResult()
        if self.restores_held > 0:  # the member does not qualify yet (PodReady Unknown)
            self.restores_held -= 1
            return RestoreResult(held={m.pod: "PodReady is Unknown" for m in inp.target.members})
        return RestoreResult(restored=[m.pod for m in inp.target.members])

    @activity.defn(name="publish")
    async def publish(self, inp: PublishInput) -> None:
        mode = self.behaviour.get("publish")
        if mode == "hang":  # a status subresource that answers slowly
            await asyncio.sleep(2.0)
        elif mode == "failed":
            from temporalio.exceptions import ApplicationError

            raise ApplicationError("HTTP 422 status rejected", type="Invalid", non_retryable=True)
        self.published.append(inp)

    def activities(self) -> list[object]:
        """Every activity, for a Worker."""
        return [
            self.admit,
            self.disqualify,
            self.withdraw,
            self.drain,
            self.settle,
            self.delete,
            self.restore,
            self.publish,
        ]


@asynccontextmanager
async def running(client: Client, world: FakeWorld, **options: Any) -> AsyncIterator[str]:
    """A worker running RetirementWorkflow (the product's runner) and ``world``'s
    activities on a task queue of its own; yields the queue.  ``options``: more of the
    Worker's (``max_concurrent_activities=1``)."""
    queue = f"tq-{uuid.uuid4()}"
    async with Worker(
        client,
        task_queue=queue,
        workflows=[RetirementWorkflow],
        workflow_runner=workflow_runner(converter=client.data_converter),
        activities=world.activities(),
        max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
        **options,
    ):
        yield queue


async def start(client: Client, queue: str, req: RetirementRequest) -> WorkflowHandle:  # type: ignore[type-arg]
    """Start the retirement of ``req`` on ``queue`` under its product workflow ID."""
    return await client.start_workflow(
        RetirementWorkflow.run,
        req,
        id=f"retirement/{req.namespace}/{req.deployment}",
        task_queue=queue,
        result_type=RetirementState,
    )
