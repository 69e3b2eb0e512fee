"""Which members answer for a replica: every member of an External-DP replica, the leader
only of a leader-served replica, the one member at size one (SPEC section 5).

The rule itself is ``answers`` (a member's shape and member index in, whether it answers
out); ``select_members`` applies it to a whole replica, once the group is known to be well
formed, and ``select_surplus`` to the surplus members of one (SPEC section 3), each read as
what its own index makes it: a duplicate or extra member of a single-member or External-DP
replica answers, and of a leader-served one only a duplicate leader (index 0) does.  Its
eligibility label plays no part: a member without it may still have requests in flight.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from retirement.names import LABEL_MEMBER_INDEX
from retirement.shape.rules import Shape, ShapeReading
from retirement.text import is_decimal


@dataclass(frozen=True)
class MemberPod:
    """What member selection needs to know of one Pod of a replica."""

    name: str
    uid: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Selection:
    """The members that answer for a replica, or why none can be chosen."""

    measured: tuple[str, ...] = ()  # Pod names
    refusal: str = ""

    @property
    def ok(self) -> bool:
        """Whether a selection was made."""
        return not self.refusal


def member_index(pod: MemberPod) -> int | None:
    """The ``member-index`` label as a number, or None if absent or not a number."""
    raw = pod.labels.get(LABEL_MEMBER_INDEX)
    if raw is None or not is_decimal(raw):
        return None
    return int(raw)


def answers(shape: Shape, index: int | None) -> bool | None:
    """Whether a member with member index ``index`` answers for a replica of ``shape``: the
    one member at size one, every member (each DP rank) of an External-DP replica, the
    leader (index 0) only of a leader-served one.  None when it cannot be decided: a
    leader-served member with no valid index may be the leader; an unsupported shape has
    no member that answers by this rule."""
    if shape in (Shape.SINGLE, Shape.EXTERNAL_DP):
        return True
    if shape is Shape.LEADER_SERVED:
        return None if index is None else index == 0
    return None


def select_members(*, shape: ShapeReading, size: int, members: Sequence[MemberPod]) -> Selection:
    """Which members of one replica answer (are measured, are eligible), per its shape."""
    if not shape.supported:
        return Selection(refusal=f"shape {shape.shape}: {shape.reason}")
    if len(members) != size:
        return Selection(refusal=f"declared size {size} != {len(members)} member Pods")
    if shape.shape is Shape.SINGLE:
        return Selection(measured=(members[0].name,))
    indexes: dict[int, list[str]] = {}
    for pod in members:
        idx = member_index(pod)
        if idx is None:
            return Selection(refusal=f"member {pod.name} has no valid {LABEL_MEMBER_INDEX} label")
        if idx >= size:
            return Selection(refusal=f"member {pod.name} has index {idx} beyond size {size}")
        indexes.setdefault(idx, []).append(pod.name)
    leaders = indexes.get(0, [])
    if not leaders:
        return Selection(refusal="leadership missing: no member has index 0")
    if len(leaders) > 1:
        return Selection(refusal=f"leadership duplicated: {', '.join(sorted(leaders))}")
    duplicated = sorted(i for i, names in indexes.items() if len(names) > 1)
    if duplicated:
        return Selection(refusal=f"member index duplicated: {duplicated}")
    return Selection(
        measured=tuple(indexes[i][0] for i in sorted(indexes) if answers(shape.shape, i))
    )


def select_surplus(*, shape: ShapeReading, surplus: Sequence[MemberPod]) -> Selection:
    """Which of the ``surplus`` members of one replica answer, by ``answers``: each is read
    as what its own member index makes it (at size one the index plays no part).

    The caller passes the members that may serve (whose engine ever started); a member
    that never ran answers nothing.  Refused, with the reason: an unsupported shape; a
    member whose answer cannot be decided (a leader-served member with no valid index may
    be the leader); members of which none answers (followers with no surplus leader: one
    may be working for the replica's kept leader, which goes on serving, so no read can
    show that it stopped)."""
    if not shape.supported:
        return Selection(refusal=f"shape {shape.shape}: {shape.reason}")
    measured: list[str] = []
    quiet: list[str] = []
    for pod in surplus:
        said = answers(shape.shape, member_index(pod))
        if said is None:
            return Selection(
                refusal=f"surplus member {pod.name} has no valid {LABEL_MEMBER_INDEX} label: "
                "whether it leads the replica cannot be decided"
            )
        (measured if said else quiet).append(pod.name)
    if quiet and not measured:
        who = "member " + quiet[0] if len(quiet) == 1 else "members " + ", ".join(quiet)
        verb = "does" if len(quiet) == 1 else "do"
        it = "it" if len(quiet) == 1 else "they"
        return Selection(
            refusal=f"surplus {who} {verb} not answer for the replica (shape {shape.shape}: only "
            "the leader, member-index 0, answers) and no surplus member that answers has "
            f"started: no read can show that {it} stopped working for the replica's leader"
        )
    return Selection(measured=tuple(measured))
