"""pydantic v2 models of every workflow input, activity input/output, signal, update and
query (carried by ``temporalio.contrib.pydantic``'s data converter)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

from retirement.budgets import Budgets
from retirement.drain import DrainProgress
from retirement.names import K8S_NAME as K8S_NAME  # re-exported: kube.deployment reads it here
from retirement.names import ROLE_NAME_MAX
from retirement.phases import Outcome, Phase, Verdict
from retirement.protocol import Progress
from retirement.retry import validate_token


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IntentKind(StrEnum):
    """Why a replica (or member) is being retired (SPEC section 3)."""

    COUNT_TRIM = "CountTrim"
    SURPLUS_SHED = "SurplusShed"
    DEPARTED_ROLE = "DepartedRole"


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


class MemberTarget(_Model):
    """One admitted member Pod, bound by UID and the ``main`` container's ID."""

    pod: str
    uid: str
    container_id: str
    restart_count: int = 0
    ip: str
    member_index: int | None = None
    measured: bool = False  # answers for the replica: read during the drain, restored
    eligible_at_admission: bool = False
    serve_port: int | None = None
    metrics_port: int | None = None
    metrics_scheme: str = "http"
    metrics_path: str = "/metrics"
    #: The engine counts its requests exactly and serves the count at ``GET /load`` on the
    #: metrics port (vLLM 0.8.0+ with ``--enable-server-load-tracking`` and one API server
    #: process): every drain read takes it, and reads idle only at 0.
    exact_load: bool = False
    labels: dict[str, str] = Field(default_factory=dict)  # as admitted (before disqualify)


class Target(_Model):
    """What admission bound: the retirement may touch these objects and no other."""

    namespace: str
    deployment: str
    role: str
    ordinal: int
    intent: IntentKind
    engine: str
    engine_version: str = ""
    shape: str
    router: str | None = None
    members: list[MemberTarget]
    workload_name: str | None = None
    workload_uid: str | None = None
    observed_generation: int = 0
    deployment_uid: str = ""
    #: The replica's declared size at admission (a departed role: its Pods); None when not
    #: recorded.  With the member-index label it says which members belong to a group
    #: (``retirement.eligibility.in_group``).
    size: int | None = None

    @property
    def measured(self) -> tuple[str, ...]:
        """Names of the members that answer for the replica."""
        return tuple(m.pod for m in self.members if m.measured)

    @property
    def uids(self) -> list[str]:
        """Every admitted member UID (the delete binding)."""
        return [m.uid for m in self.members]

    def restorable(self) -> list[str]:
        """The members an abort must put back in service: those that had the label at
        admission, and the measured members of a whole replica (they answer for it).  A
        surplus member goes back only if it had the label: the restore never adds to
        routing a member nothing routed to."""
        answers = self.intent is not IntentKind.SURPLUS_SHED
        return [m.pod for m in self.members if m.eligible_at_admission or (m.measured and answers)]


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


class Observation(_Model):
    """What a phase activity saw: a verdict, a reason, and the last readings per member."""

    verdict: Verdict
    reason: str = ""
    readings: dict[str, str] = Field(default_factory=dict)
    polls: int = 0
    #: Withdrawal: every router removal asked for so far in this phase, as
    #: ``<router Pod UID>|<worker URL>`` (carried across retried attempts).
    router_removals: list[str] = Field(default_factory=list)
    #: When the reading the verdict rests on was taken (the drain: the start of its last
    #: idle round), on the activity's clock.
    evidence_at: datetime | None = None


class WithdrawProgress(_Model):
    """Heartbeat details of the withdrawal activity (a retry resumes from them)."""

    polls: int = 0
    removal_requested: list[str] = Field(default_factory=list)  # router/worker pairs
    last: Observation | None = None


class DrainHeartbeat(_Model):
    """Heartbeat details of the drain activity (a retry resumes from them)."""

    progress: DrainProgress = Field(default_factory=DrainProgress)
    readings: dict[str, str] = Field(default_factory=dict)


class DeleteResult(_Model):
    """What ``delete`` did to each admitted Pod and the Workload."""

    deleted: list[str] = Field(default_factory=list)
    already_gone: list[str] = Field(default_factory=list)
    replaced: list[str] = Field(default_factory=list)  # precondition failed: not touched
    workload: str = "none"  # none | deleted | kept (owns other Pods) | gone
    #: The last guard refused before any delete (nothing was touched): why, as a verdict
    #: (FAILED: abort; UNKNOWN: drain again).
    refused: Observation | None = None


class RestoreResult(_Model):
    """What ``restore`` did: members labelled again, held, or failed."""

    restored: list[str] = Field(default_factory=list)
    held: dict[str, str] = Field(default_factory=dict)
    failed: dict[str, str] = Field(default_factory=dict)
    #: Every add-worker call the restore made, as ``<router Pod name>|<worker URL>``.
    router_adds: list[str] = Field(default_factory=list)
    #: A router's selection counted only once it had lasted a while (smg): the workflow
    #: reads the routers again later (``retirement.progress.CONFIRM_AGAIN``).
    timed: bool = False


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

    The protocol's fields (``Progress``: phase, outcome, deadlines, evidence, reasons,
    timeline) are decided by ``retirement.protocol.decide``; the rest is what the
    activities reported.  The workflow holds exactly this object and the query returns it.
    """

    workflow_id: str
    request: RetirementRequest
    target: Target | None = None
    last_readings: dict[str, str] = Field(default_factory=dict)
    #: Every router removal withdrawal asked for in this attempt (``<router Pod UID>|<worker
    #: URL>``): the restore adds these very URLs back.
    router_removals: list[str] = Field(default_factory=list)
    deleted: DeleteResult | None = None
    restored: RestoreResult | None = None
    #: Every attempt so far (earlier ones carried across continue-as-new), this one last.
    history: list[AttemptRecord] = Field(default_factory=list)

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
