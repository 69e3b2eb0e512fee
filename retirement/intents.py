"""Removal intents, derived level-based from a deployment's spec and its live Pods
(SPEC section 3).  Pure: the same inputs always give the same intents in the same order.

Order (deterministic, documented): count trims first (roles in spec order, the highest
ordinal first), then departed roles (by role name, the highest ordinal first), then surplus
sheds (roles in spec order, by ordinal, members by name).  Terminating Pods are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from retirement.models import IntentKind
from retirement.names import LABEL_COMPONENT, LABEL_MEMBER_INDEX, LABEL_ORDINAL
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
    """Members beyond ``size`` or duplicating an index (the first name of an index stays)."""
    if size == 1:
        ordered = sorted(members, key=lambda p: p.name)
        return tuple(p.name for p in ordered[1:])
    keep: set[int] = set()
    surplus: list[str] = []
    for p in sorted(members, key=lambda p: p.name):
        idx = p.member
        if idx is None or idx >= size or idx in keep:
            surplus.append(p.name)
        else:
            keep.add(idx)
    return tuple(surplus)
