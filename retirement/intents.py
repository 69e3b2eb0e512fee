"""Removal intents, derived level-based from a deployment's spec and its live Pods
(SPEC section 3).  Pure: the same inputs always give the same intents in the same order.

Order (deterministic, documented): count trims first (roles in spec order, the highest
ordinal first), then departed roles (by role name, the highest ordinal first), then surplus
sheds (roles in spec order, by ordinal, members by name).  Terminating Pods are ignored.

``intent_refusal`` is the one rule of whether a request is (still) one of these intents:
admission refuses a request it rejects, and the watcher sends cancel-intent to a running or
held retirement whose request it rejects.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from retirement.models import IntentKind, RetirementRequest, RetirementState
from retirement.names import LABEL_COMPONENT, LABEL_MEMBER_INDEX, LABEL_ORDINAL
from retirement.phases import Outcome, abortable
from retirement.text import is_decimal


@dataclass(frozen=True)
class RoleSpec:
    """What intent derivation reads of a role."""

    name: str
    replicas: int
    size: int = 1


@dataclass(frozen=True)
class PodView:
    """What intent derivation reads of a Pod."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False
    #: Whether the engine ever ran (``kube.objects.Pod.engine_started``): a surplus shed
    #: keeps members that ran before members that never did.
    engine_started: bool = True

    @property
    def role(self) -> str | None:
        """The role (``app.kubernetes.io/component``)."""
        return self.labels.get(LABEL_COMPONENT)

    @property
    def ordinal(self) -> int | None:
        """The replica ordinal, or None when the label is absent or not a number."""
        raw = self.labels.get(LABEL_ORDINAL)
        return int(raw) if raw is not None and is_decimal(raw) else None

    @property
    def member(self) -> int | None:
        """The member index (None at size one, or when not a number)."""
        raw = self.labels.get(LABEL_MEMBER_INDEX)
        return int(raw) if raw is not None and is_decimal(raw) else None


@dataclass(frozen=True)
class Intent:
    """One removal intent: a whole replica, or (surplus shed) named members of one."""

    kind: IntentKind
    role: str
    ordinal: int
    members: tuple[str, ...] = ()  # surplus shed only


def derive_intents(roles: Sequence[RoleSpec], pods: Sequence[PodView]) -> list[Intent]:
    """Every removal intent of one deployment, in the documented order."""
    live = [p for p in pods if not p.terminating and p.role and p.ordinal is not None]
    by_role: dict[str, dict[int, list[PodView]]] = {}
    for p in live:
        assert p.role is not None and p.ordinal is not None
        by_role.setdefault(p.role, {}).setdefault(p.ordinal, []).append(p)
    declared = {r.name for r in roles}
    trims: list[Intent] = []
    sheds: list[Intent] = []
    for role in roles:
        replicas = by_role.get(role.name, {})
        if role.replicas < 0 or role.size < 1:
            continue  # a malformed count decides nothing (never "retire everything")
        for ordinal in sorted((o for o in replicas if o >= role.replicas), reverse=True):
            trims.append(Intent(IntentKind.COUNT_TRIM, role.name, ordinal))
        for ordinal in sorted(o for o in replicas if o < role.replicas):
            surplus = surplus_members(replicas[ordinal], size=role.size)
            if surplus:
                sheds.append(Intent(IntentKind.SURPLUS_SHED, role.name, ordinal, surplus))
    departed = [
        Intent(IntentKind.DEPARTED_ROLE, name, ordinal)
        for name in sorted(set(by_role) - declared)
        for ordinal in sorted(by_role[name], reverse=True)
    ]
    return trims + departed + sheds


def surplus_members(members: Sequence[PodView], *, size: int) -> tuple[str, ...]:
    """Members beyond ``size`` or duplicating an index.  Of the members of one index, one
    whose engine ran stays before one that never did (a Pending duplicate is shed, not the
    member that serves), then the first by name."""
    ordered = sorted(members, key=lambda p: (not p.engine_started, p.name))
    if size == 1:
        return tuple(sorted(p.name for p in ordered[1:]))
    keep: set[int] = set()
    surplus: list[str] = []
    for p in ordered:
        idx = p.member
        if idx is None or idx >= size or idx in keep:
            surplus.append(p.name)
        else:
            keep.add(idx)
    return tuple(sorted(surplus))


# ---------------------------------------------------------------- the intent rule


class RoleLike(Protocol):
    """What the intent rule reads of a declared role (``kube.deployment.Role``)."""

    @property
    def name(self) -> str: ...

    @property
    def replicas(self) -> int: ...

    @property
    def size(self) -> int: ...


class SpecLike(Protocol):
    """What the intent rule reads of a deployment (``kube.deployment.ModelDeployment``)."""

    @property
    def roles(self) -> Sequence[RoleLike]: ...

    def role(self, name: str) -> RoleLike | None: ...


class DeploymentLike(SpecLike, Protocol):
    """A deployment with its identity (``kube.deployment.ModelDeployment``)."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


class PodLike(Protocol):
    """What the intent rule reads of a Pod (``kube.objects.Pod`` or ``PodView``)."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def terminating(self) -> bool: ...

    @property
    def engine_started(self) -> bool: ...


def view_of(p: PodLike) -> PodView:
    """What intent derivation reads of ``p``."""
    return PodView(
        name=p.name,
        labels=dict(p.labels),
        terminating=p.terminating,
        engine_started=p.engine_started,
    )


def intent_refusal(md: SpecLike, pods: Sequence[PodLike], req: RetirementRequest) -> str:
    """Why ``req`` is not (any more) one of the removal intents ``derive_intents`` derives
    from the live spec ``md`` and every Pod of the deployment ``pods``; empty when it is.

    A whole-replica request (count trim or departed role; the CLI asks for a count trim)
    needs a whole-replica intent for its role and ordinal; a surplus shed needs a surplus
    intent of that replica that still names every requested member."""
    roles = [RoleSpec(name=r.name, replicas=r.replicas, size=r.size) for r in md.roles]
    views = [view_of(p) for p in pods]
    key = (req.role, req.ordinal)
    mine = [i for i in derive_intents(roles, views) if (i.role, i.ordinal) == key]
    replica = f"{req.role} ordinal {req.ordinal}"
    declared = md.role(req.role)
    if req.intent is IntentKind.SURPLUS_SHED:
        named = set(req.members)
        replica_pods = {
            p.name
            for p in pods
            if p.labels.get(LABEL_COMPONENT) == req.role
            and p.labels.get(LABEL_ORDINAL) == str(req.ordinal)
        }
        if not named or not named <= replica_pods:
            return f"surplus members {sorted(named)} are not all Pods of the replica"
        shed = next((i for i in mine if i.kind is IntentKind.SURPLUS_SHED), None)
        if shed is None:
            return f"replica {replica} has no surplus member any more: nothing to shed"
        kept = sorted(set(req.members) - set(shed.members))
        if kept:
            return (
                f"{', '.join(kept)} of replica {replica} is no longer surplus (the surplus is "
                f"now {', '.join(shed.members)}): it would be retired while it serves"
            )
        return ""
    if req.intent is IntentKind.DEPARTED_ROLE and declared is not None:
        return f"role {req.role} is still in the spec: not a departed role"
    whole = (IntentKind.COUNT_TRIM, IntentKind.DEPARTED_ROLE)
    if any(i.kind in whole for i in mine):
        return ""
    if declared is not None and req.ordinal < declared.replicas:
        return (
            f"the spec still declares {replica} (replicas {declared.replicas}): "
            "it is not a removal intent"
        )
    return f"replica {replica} is no longer a removal intent of the live spec and Pods"


def intent_vanished(md: DeploymentLike, pods: Sequence[PodLike], state: RetirementState) -> str:
    """Why the intent of the retirement ``state`` went away; empty while it stands."""
    req = state.request
    role = md.role(req.role)
    if req.intent is IntentKind.COUNT_TRIM and role is not None and req.ordinal < role.replicas:
        return f"the spec re-declares {req.role} ordinal {req.ordinal}"
    admitted = state.target.deployment_uid if state.target is not None else ""
    if admitted and admitted != md.uid:
        return (
            f"ModelDeployment {md.namespace}/{md.name} was re-created (UID {md.uid}; "
            f"the retirement admitted UID {admitted})"
        )
    if state.outcome is Outcome.RUNNING and not abortable(state.phase):
        return ""  # the deletes are under way: its Pods go because of it
    return intent_refusal(md, pods, req)
