"""A role's shape, read from its declared command line, and which members answer for it.

The same derivation decides which members are measured during a drain and which members
are eligible to serve (SPEC section 5): every member of an External-DP replica, the leader
only of a leader-served replica, the one member at size one.  Anything that cannot be
decided is a refusal naming the shape, never a guess.

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
from enum import StrEnum

from retirement.names import LABEL_MEMBER_INDEX
from retirement.text import is_decimal


class Shape(StrEnum):
    """How a replica's members serve."""

    SINGLE = "Single"  # one member, it serves
    LEADER_SERVED = "LeaderServed"  # several members, the leader (member 0) serves
    EXTERNAL_DP = "ExternalDP"  # several members, each DP rank serves
    DISAGGREGATED = "Disaggregated"  # prefill/decode: not supported
    UNMANAGED = "Unmanaged"  # the role replaced its command line
    UNDECIDABLE = "Undecidable"


@dataclass(frozen=True)
class ShapeReading:
    """A role's shape and, where it is not a supported shape, why."""

    shape: Shape
    reason: str = ""

    @property
    def supported(self) -> bool:
        """Whether a retirement may be admitted for this shape."""
        return self.shape in (Shape.SINGLE, Shape.LEADER_SERVED, Shape.EXTERNAL_DP)


def parse_flags(args: Sequence[str]) -> dict[str, list[str]]:
    """``--flag value`` / ``--flag=value`` / ``--flag`` into ``{flag: [values...]}``.

    A bare flag maps to ``[""]``.  Non-flag words that follow a flag are its value; a word
    before any flag is ignored (it is not a flag this module reads).
    """
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for raw in args:
        word = str(raw)
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            flags.setdefault(name, [])
            if eq:
                flags[name].append(value)
                current = None
            else:
                current = name
        elif current is not None:
            flags[current].append(word)
            current = None
    for values in flags.values():
        if not values:
            values.append("")
    return flags


def _one(flags: Mapping[str, list[str]], name: str) -> str | None:
    values = flags.get(name)
    if values is None:
        return None
    return values[-1]


def read_shape(
    *,
    engine: str,
    role_kind: str,
    size: int,
    extra_args: Sequence[str],
    command: Sequence[str] | None,
) -> ShapeReading:
    """Read a role's shape from its engine, kind, size and ``extraArgs``."""
    if command:
        return ShapeReading(
            Shape.UNMANAGED, "the role replaced its command line; its shape cannot be read"
        )
    if size < 1:
        return ShapeReading(Shape.UNDECIDABLE, f"size {size} is not a member count")
    kind = role_kind or "Server"
    if kind not in ("Server", "Prefill", "Decode"):
        return ShapeReading(Shape.UNDECIDABLE, f"unknown role kind {kind!r}")
    flags = parse_flags(extra_args)
    if engine == "vLLM":
        return _read_vllm(kind, size, flags)
    if engine == "SGLang":
        return _read_sglang(kind, size, flags)
    return ShapeReading(Shape.UNDECIDABLE, f"unknown engine {engine!r}")


def _read_vllm(kind: str, size: int, flags: Mapping[str, list[str]]) -> ShapeReading:
    if kind != "Server":
        return ShapeReading(
            Shape.DISAGGREGATED, f"role kind {kind} is a prefill/decode (disaggregated) member"
        )
    external = "--data-parallel-external-lb" in flags or "--data-parallel-rank" in flags
    hybrid = "--data-parallel-hybrid-lb" in flags
    if external and hybrid:
        return ShapeReading(
            Shape.UNDECIDABLE,
            "--data-parallel-external-lb/--data-parallel-rank "
            "and --data-parallel-hybrid-lb disagree",
        )
    if "--kv-transfer-config" in flags:
        return ShapeReading(
            Shape.UNDECIDABLE, "role kind Server and --kv-transfer-config (disaggregation) disagree"
        )
    if size == 1:
        return ShapeReading(Shape.SINGLE)
    if external:
        return ShapeReading(Shape.EXTERNAL_DP)
    if hybrid:
        return ShapeReading(
            Shape.UNDECIDABLE, "--data-parallel-hybrid-lb across members is not a supported shape"
        )
    return ShapeReading(Shape.LEADER_SERVED)


def _read_sglang(kind: str, size: int, flags: Mapping[str, list[str]]) -> ShapeReading:
    mode = _one(flags, "--disaggregation-mode")
    if mode in ("prefill", "decode"):
        if kind == "Server":
            return ShapeReading(
                Shape.UNDECIDABLE, f"role kind Server and --disaggregation-mode {mode} disagree"
            )
        return ShapeReading(
            Shape.DISAGGREGATED,
            f"--disaggregation-mode {mode} is a prefill/decode (disaggregated) member",
        )
    if mode not in (None, "null"):
        return ShapeReading(Shape.UNDECIDABLE, f"unknown --disaggregation-mode {mode!r}")
    if kind != "Server":
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"role kind {kind} and a command line without --disaggregation-mode disagree",
        )
    nnodes = _one(flags, "--nnodes")
    if nnodes is not None:
        if not is_decimal(nnodes) or int(nnodes) < 1:
            return ShapeReading(Shape.UNDECIDABLE, f"--nnodes {nnodes!r} is not a count")
        if int(nnodes) != size:
            return ShapeReading(Shape.UNDECIDABLE, f"--nnodes {nnodes} and size {size} disagree")
    dp = _one(flags, "--dp-size") or _one(flags, "--data-parallel-size")
    if dp is not None and (not is_decimal(dp) or int(dp) < 1):
        return ShapeReading(Shape.UNDECIDABLE, f"--dp-size {dp!r} is not a count")
    # SGLang's data parallelism is coordinated behind one HTTP server: leader-served.
    return ShapeReading(Shape.SINGLE if size == 1 else Shape.LEADER_SERVED)


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
