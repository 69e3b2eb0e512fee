"""The one rule for putting the eligibility label (back) on a member.

Two writers add the label: the restore of an aborted retirement (``activities.restore``)
and the watcher's repair of orphans (``watcher.reconcile``).  Both ask this function, so a
member the restore holds is never labelled by the watcher a second later:

- PodReady must be True;
- a member of a multi-member group (``in_group``) must also pass the identity probe with
  its version guard (``activities.probes``), which only the restore can run (the watcher
  never execs): the watcher therefore never labels a group member, it leaves it to the
  restore (and the operator that created it).

Taking the label off is not this rule: any writer removes it from a member that should
not serve.

The watcher's repair decides here too (``label_repair``: which Pods of a deployment lose
the label and which get it); the watcher applies the decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from retirement.names import LABEL_COMPONENT, LABEL_ELIGIBLE, LABEL_MEMBER_INDEX, LABEL_ORDINAL
from retirement.shape import MemberPod, ShapeReading, select_members


def in_group(*, size: int | None, member_index: object | None) -> bool:
    """Whether a member belongs to a multi-member group: its replica's declared size is
    above one, or it carries the member-index label (set only on members of a group: a
    lone follower left of a departed role is still one).  The one definition, used by the
    restore and the watcher alike."""
    return (size or 1) > 1 or member_index is not None


#: What a caller that cannot probe is told for a group member.
UNPROBED = "a member of a group is labelled only after the identity probe (the restore's)"


def label_refusal(*, ready: str, group: bool, probe: Callable[[], str] | None) -> str:
    """Why a member may not be labelled eligible now ("" when it may).

    ``ready`` is the Pod's PodReady status ("True", "False" or "Unknown"); ``group``
    whether it belongs to a multi-member replica; ``probe`` runs the identity probe and
    answers why it failed ("" when it passed), None when the caller cannot probe.  The
    probe runs only when everything else allows the label."""
    if ready != "True":
        return f"PodReady is {ready}"
    if group:
        return UNPROBED if probe is None else probe()
    return ""


# ---------------------------------------------------------------- the watcher's repair


class RepairPod(Protocol):
    """What the label repair reads of a Pod (``kube.objects.Pod``)."""

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def terminating(self) -> bool: ...


P = TypeVar("P", bound=RepairPod)


@dataclass(frozen=True)
class LabelRepair(Generic[P]):
    """What the watcher's label repair decided for a deployment's Pods: take the label
    off ``remove``, put it on ``add`` (after asking Temporal that nothing runs)."""

    remove: tuple[P, ...] = ()
    add: tuple[P, ...] = ()


def label_repair(
    pods: Sequence[P],
    *,
    ready: Callable[[P], str],
    sizes: Mapping[str, int],
    shape_of: Callable[[str], ShapeReading],
    protected: AbstractSet[str] = frozenset(),
) -> LabelRepair[P]:
    """Which Pods of one deployment the watcher's label repair changes: off a member that
    is labelled but should not serve (not measured by its replica's shape, or not Ready);
    on a measured member that may be labelled by this module's rule (``label_refusal``
    without a probe: never a group member).

    ``ready`` reads a Pod's PodReady status; ``sizes`` is the declared size per role name
    (a role not declared is a departed role: its retirement decides); ``shape_of`` reads
    a declared role's shape (asked only for a replica that can be decided); ``protected``
    the UIDs no repair touches (those an active retirement names).  A replica whose count
    of non-terminating members is not its declared size, or whose members cannot be
    selected, is undecidable now: none of it is touched.  Terminating Pods are ignored."""
    groups: dict[tuple[str, str], list[P]] = {}
    for p in pods:
        if not p.terminating:
            groups.setdefault(
                (p.labels.get(LABEL_COMPONENT, ""), p.labels.get(LABEL_ORDINAL, "")), []
            ).append(p)
    remove: list[P] = []
    add: list[P] = []
    for (role, _ordinal), members in groups.items():
        size = sizes.get(role)
        if size is None or len(members) != size:
            continue  # a departed role, or surplus or incomplete: touch nothing
        sel = select_members(
            shape=shape_of(role),
            size=size,
            members=[MemberPod(name=p.name, uid=p.uid, labels=p.labels) for p in members],
        )
        if not sel.ok:
            continue
        for p in members:
            if p.uid in protected:
                continue
            is_ready = ready(p)
            if p.labels.get(LABEL_ELIGIBLE) == "true":
                if p.name not in sel.measured or is_ready != "True":
                    remove.append(p)
            elif p.name in sel.measured and not label_refusal(
                ready=is_ready,
                group=in_group(size=size, member_index=p.labels.get(LABEL_MEMBER_INDEX)),
                probe=None,
            ):
                add.append(p)
    return LabelRepair(remove=tuple(remove), add=tuple(add))
