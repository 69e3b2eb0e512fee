"""pydantic v2 models of every workflow input, activity input/output, signal, update and
query (carried by ``temporalio.contrib.pydantic``'s data converter).

What the activities report and the protocol records (the target, a phase activity's
observation, the delete's and the restore's results) is defined below the protocol, in
``retirement.reports``, and re-exported here under the same names.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
)

from retirement.budgets import Budgets
from retirement.drain import DrainProgress
from retirement.names import K8S_NAME as K8S_NAME  # re-exported: kube.deployment reads it here
from retirement.names import ROLE_NAME_MAX
from retirement.phases import Outcome, Phase
from retirement.progress import REPORTED
from retirement.protocol import Progress
from retirement.reports import DeleteResult as DeleteResult
from retirement.reports import IntentKind as IntentKind
from retirement.reports import MemberTarget as MemberTarget
from retirement.reports import Observation as Observation
from retirement.reports import RestoreResult as RestoreResult
from retirement.reports import Target as Target
from retirement.retry import validate_token


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RouterlessPolicy(StrEnum):
    """What withdrawal means for a deployment with no router (SPEC section 6)."""

    HOLD = "hold"  # nothing reports that client connections went quiet: hold (then abort)
    QUIET_WINDOW = "quiet-window"  # require a window in which the work counters do not move


class AttemptRecord(_Model):
    """One attempt of a retirement, for the history in the query."""

    attempt: int
    started_at: datetime
    ended_at: datetime | None = None
    furthest_phase: Phase = Phase.ADMITTED
    outcome: Outcome = Outcome.RUNNING
    reason: str = ""


class RetirementRequest(_Model):
    """The workflow's input: what to retire, with which budgets and policy."""

    namespace: str = Field(pattern=K8S_NAME, max_length=63)
    deployment: str = Field(pattern=K8S_NAME, max_length=253)
    role: str = Field(pattern=K8S_NAME, max_length=ROLE_NAME_MAX)
    ordinal: int = Field(ge=0, le=100000, strict=True)  # JSON true is not ordinal 1
    intent: IntentKind = IntentKind.COUNT_TRIM
    #: Surplus shed: the member Pods to retire (empty: the whole replica).
    members: list[str] = Field(default_factory=list, max_length=64)
    budgets: Budgets = Field(default_factory=Budgets)
    routerless_policy: RouterlessPolicy = RouterlessPolicy.HOLD
    quiet_window_s: float = Field(default=10.0, gt=0, le=600)
    # Carried across continue-as-new (a fresh attempt after a retry):
    attempt: int = Field(default=1, ge=1)
    last_consumed_retry_token: str | None = None
    history: list[AttemptRecord] = Field(default_factory=list)
    #: Carried across continue-as-new of a long hold: the held state, resumed as it was.
    resume: RetirementState | None = None


class AdmitInput(_Model):
    """Input of the ``admit`` activity."""

    request: RetirementRequest
    workflow_id: str


class Admission(_Model):
    """Output of ``admit``: a target, or a refusal a person can act on."""

    target: Target | None = None
    refusal: str = ""


class PhaseInput(_Model):
    """Input of a phase activity."""

    target: Target
    deadline: datetime
    poll_interval_s: float = 1.0
    routerless_policy: RouterlessPolicy = RouterlessPolicy.HOLD
    quiet_window_s: float = 10.0
    #: The restore: the router removals withdrawal asked for (``Observation.router_removals``),
    #: so the very worker URL removed is the one added back.  Only a hint: the restore is
    #: level-based and re-adds whatever a router is missing, recorded or not.
    router_removals: list[str] = Field(default_factory=list)
    #: The delete: when the drain's last idle read was taken, and how old it may be when
    #: the first delete is sent (``retirement.progress.freshness_bound``).
    evidence_at: datetime | None = None
    fresh_s: float | None = None
    #: The delete: an earlier delete activity of this Deleting phase may have deleted
    #: members (a retried attempt knows it from its attempt number).
    delete_may_have_begun: bool = False
    #: The delete: the workflow found the drain's evidence older than the bound when it
    #: decided on the delete, so the guard reads the engines again whatever its own clock
    #: says (``activities.refresh``): both clocks must find the evidence fresh, as before.
    read_again: bool = False
    #: The mirror's snapshots to publish, in order, while the phase runs
    #: (``activities.alongside``); its result says how many went out (``mirrored``).
    mirror: list[PublishInput] = Field(default_factory=list)


class WithdrawProgress(_Model):
    """Heartbeat details of the withdrawal activity (a retry resumes from them)."""

    polls: int = 0
    removal_requested: list[str] = Field(default_factory=list)  # router/worker pairs
    last: Observation | None = None


class DrainHeartbeat(_Model):
    """Heartbeat details of the drain activity (a retry resumes from them)."""

    progress: DrainProgress = Field(default_factory=DrainProgress)
    readings: dict[str, str] = Field(default_factory=dict)


class PublishInput(_Model):
    """Input of ``publish``: mirror the workflow on the ModelDeployment."""

    namespace: str
    deployment: str
    workflow_id: str
    phase: Phase
    outcome: Outcome
    reason: str = ""
    role: str
    ordinal: int
    target: Target | None = None
    started_at: datetime
    deadline: datetime | None = None
    phase_started_at: datetime
    last_consumed_retry_token: str | None = None
    clear: bool = False  # remove status.retirement (no operation any more)


class AbortRequest(_Model):
    """Update/signal ``abort``."""

    reason: str = Field(min_length=1, max_length=256)

    @field_validator("reason")
    @classmethod
    def _printable(cls, v: str) -> str:
        if not v.strip() or not v.isprintable():
            raise ValueError("reason must be printable text")
        return v


class RetryRequest(_Model):
    """Update/signal ``retry``."""

    token: str

    @field_validator("token")
    @classmethod
    def _token(cls, v: str) -> str:
        return validate_token(v)


class RetryResult(_Model):
    """What a retry did."""

    decision: str
    message: str


class CancelIntent(_Model):
    """Signal ``cancel_intent``: the spec re-declared the ordinal (or the intent went away)."""

    reason: str = Field(default="the spec re-declares the ordinal", max_length=256)


class RetirementState(Progress):
    """Query ``state``: the one state object of a retirement.

    Its ``Progress`` (phase, outcome, deadlines, evidence, reasons, timeline, and what the
    activities reported: target, readings, router removals, the delete's and the
    restore's results) changes only in ``retirement.protocol.decide``; this adds whose
    retirement it is and the attempts so far.  The workflow holds exactly this object and
    the query returns it.
    """

    workflow_id: str
    request: RetirementRequest
    #: Every attempt so far (earlier ones carried across continue-as-new), this one last.
    history: list[AttemptRecord] = Field(default_factory=list)

    @model_serializer(mode="wrap")
    def _keys_in_their_order(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The keys in the order histories already hold (the query's answer, the input of
        a continue-as-new, the result): what the activities reported (``REPORTED``, the
        last fields of ``Progress``) after ``request`` and before ``history``, where this
        model declared them before ``Progress`` recorded them."""
        data: dict[str, Any] = handler(self)
        reported = {k: data.pop(k) for k in REPORTED if k in data}
        attempts = {"history": data.pop("history")} if "history" in data else {}
        return {**data, **reported, **attempts}

    @classmethod
    def begin(cls, *, workflow_id: str, request: RetirementRequest) -> RetirementState:
        """The state of a new attempt of ``request``."""
        return cls(
            workflow_id=workflow_id,
            request=request,
            attempt=request.attempt,
            last_consumed_retry_token=request.last_consumed_retry_token,
            history=list(request.history),
        )

    def recorded(self, *, ended_at: datetime | None = None) -> RetirementState:
        """This state with the current attempt's record brought up to date."""
        earlier = [h for h in self.history if h.attempt != self.attempt]
        current = [h for h in self.history if h.attempt == self.attempt]
        if ended_at is None and current:
            ended_at = current[0].ended_at  # an ended (held) attempt stays ended
        record = AttemptRecord(
            attempt=self.attempt,
            started_at=self.started_at or ended_at or datetime.min,
            ended_at=ended_at,
            furthest_phase=self.furthest_phase,
            outcome=self.outcome,
            reason=self.reason,
        )
        return self.model_copy(update={"history": [*earlier, record]})

    def carried_request(self) -> RetirementRequest:
        """The input of the same attempt's next run (continue-as-new of a long hold)."""
        bare = self.request.model_copy(update={"resume": None})
        return bare.model_copy(update={"resume": self.model_copy(update={"request": bare})})

    def next_request(self) -> RetirementRequest:
        """The input of the next attempt (continue-as-new), consuming the retry token."""
        return self.request.model_copy(
            update={
                "attempt": self.attempt + 1,
                "last_consumed_retry_token": self.retry_token,
                "history": list(self.history),
                "resume": None,
            }
        )


RetirementRequest.model_rebuild()  # ``resume`` names RetirementState, defined after it


def workflow_id_for(*, namespace: str, deployment: str) -> str:
    """One workflow ID per deployment, so Temporal refuses a second start atomically."""
    return f"retirement/{namespace}/{deployment}"
