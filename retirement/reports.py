"""What the activities report and the protocol records of an attempt.

The target admission bound, a phase activity's observation, and what the delete and the
restore did.  They sit below the protocol: ``retirement.progress`` keeps them in
``Progress`` (the record of the attempt), the events of ``retirement.vocabulary`` carry
them into ``retirement.protocol.decide``, and ``retirement.models`` re-exports them with
every other model under the same names.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from retirement.phases import Verdict


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class IntentKind(StrEnum):
    """Why a replica (or member) is being retired (SPEC section 3)."""

    COUNT_TRIM = "CountTrim"
    SURPLUS_SHED = "SurplusShed"
    DEPARTED_ROLE = "DepartedRole"


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
    #: How many of the snapshots the phase carried (``PhaseInput.mirror``) it published,
    #: in order from the first (``activities.alongside``).
    mirrored: int = 0


class DeleteResult(_Model):
    """What ``delete`` did to each admitted Pod and the Workload."""

    deleted: list[str] = Field(default_factory=list)
    already_gone: list[str] = Field(default_factory=list)
    replaced: list[str] = Field(default_factory=list)  # precondition failed: not touched
    workload: str = "none"  # none | deleted | kept (owns other Pods) | gone
    #: The last guard refused before any delete (nothing was touched): why, as a verdict
    #: (FAILED: abort; UNKNOWN: drain again).
    refused: Observation | None = None
    #: As ``Observation.mirrored``.
    mirrored: int = 0


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
