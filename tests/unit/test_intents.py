"""Intent derivation: examples, and a property over generated spec/Pod states — every
surplus member is eventually named exactly once, and nothing inside the spec ever is; and
the members of every surplus shed are measured by the member-selection rule (or refused
with the reason), never by their eligibility label."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.intents import Intent, PodView, RoleSpec, derive_intents
from retirement.models import IntentKind
from retirement.names import LABEL_COMPONENT, LABEL_ELIGIBLE, LABEL_MEMBER_INDEX, LABEL_ORDINAL
from retirement.shape import (
    MemberPod,
    Selection,
    Shape,
    ShapeReading,
    answers,
    read_shape,
    select_surplus,
)


def pod(role: str, ordinal: int, member: int | None = None, suffix: str = "") -> PodView:
    labels = {LABEL_COMPONENT: role, LABEL_ORDINAL: str(ordinal)}
    name = f"{role}-{ordinal}"
    if member is not None:
        labels[LABEL_MEMBER_INDEX] = str(member)
        name += f"-{member}"
    return PodView(name=name + suffix, labels=labels)


def test_count_trim_highest_first_then_departed_then_surplus() -> None:
    roles = [RoleSpec("server", replicas=1, size=2)]
    pods = [pod("server", o, m) for o in range(3) for m in range(2)]
    pods += [pod("old", 0), pod("old", 1), pod("server", 0, 2), pod("server", 0, 1, "-dup")]
    assert derive_intents(roles, pods) == [
        Intent(IntentKind.COUNT_TRIM, "server", 2),
        Intent(IntentKind.COUNT_TRIM, "server", 1),
        Intent(IntentKind.DEPARTED_ROLE, "old", 1),
        Intent(IntentKind.DEPARTED_ROLE, "old", 0),
        Intent(IntentKind.SURPLUS_SHED, "server", 0, ("server-0-1-dup", "server-0-2")),
    ]


def test_terminating_and_unlabelled_pods_are_ignored() -> None:
    roles = [RoleSpec("server", replicas=1)]
    gone = PodView(name="x", labels=pod("server", 5).labels, terminating=True)
    assert derive_intents(roles, [pod("server", 0), gone, PodView(name="stray")]) == []


ROLE_NAMES = st.sampled_from(["a", "b", "c"])


@st.composite
def states(draw: st.DrawFn) -> tuple[list[RoleSpec], list[PodView]]:
    roles = [
        RoleSpec(n, replicas=draw(st.integers(0, 3)), size=draw(st.integers(1, 3)))
        for n in draw(st.lists(ROLE_NAMES, unique=True, max_size=3))
    ]
    pods = []
    for i in range(draw(st.integers(0, 14))):
        role = draw(ROLE_NAMES)
        member = draw(st.one_of(st.none(), st.integers(0, 3)))
        pods.append(pod(role, draw(st.integers(0, 4)), member, suffix=f"~{i}"))
    return roles, pods


def in_spec(roles: list[RoleSpec], kept: dict[tuple[str, int, int], str], p: PodView) -> bool:
    role = next((r for r in roles if r.name == p.role), None)
    if role is None or p.ordinal is None or p.ordinal >= role.replicas:
        return False
    index = 0 if role.size == 1 else p.member
    return (
        index is not None
        and index < role.size
        and kept.get((role.name, p.ordinal, index)) == p.name
    )


@settings(max_examples=300)
@given(states())
def test_every_surplus_member_is_named_exactly_once_and_nothing_in_spec(
    state: tuple[list[RoleSpec], list[PodView]],
) -> None:
    roles, pods = state
    # The members the spec keeps: per (role, ordinal, index) the first name.
    kept: dict[tuple[str, int, int], str] = {}
    for p in sorted(pods, key=lambda p: p.name):
        role = next((r for r in roles if r.name == p.role), None)
        if role is None or p.ordinal is None or p.ordinal >= role.replicas:
            continue
        index = 0 if role.size == 1 else p.member
        if index is not None and index < role.size:
            kept.setdefault((role.name, p.ordinal, index), p.name)
    live = list(pods)
    named: list[str] = []
    for _ in range(len(pods) + 1):  # each retirement removes at least one Pod
        intents = derive_intents(roles, live)
        if not intents:
            break
        first = intents[0]
        if first.kind is IntentKind.SURPLUS_SHED:
            gone = set(first.members)
        else:
            gone = {p.name for p in live if p.role == first.role and p.ordinal == first.ordinal}
        assert gone
        named += sorted(gone)
        live = [p for p in live if p.name not in gone]
    assert not derive_intents(roles, live)  # converged
    assert len(named) == len(set(named))  # named exactly once
    by_name = {p.name: p for p in pods}
    assert not [n for n in named if in_spec(roles, kept, by_name[n])]
    assert all(in_spec(roles, kept, p) for p in live)  # what is left is the spec


# ---------------------------------------------------------------- surplus members measured


def shape_of(size: int, external: bool) -> ShapeReading:
    args = ["--data-parallel-external-lb"] if external else []
    return read_shape(engine="vLLM", role_kind="Server", size=size, extra_args=args, command=None)


def as_members(pods: list[PodView], names: tuple[str, ...], *, label: bool) -> list[MemberPod]:
    """The named Pods as member selection reads them, with or without the eligibility
    label."""
    by_name = {p.name: p for p in pods}
    return [
        MemberPod(
            name=n,
            uid=f"uid-{n}",
            labels={**by_name[n].labels, **({LABEL_ELIGIBLE: "true"} if label else {})},
        )
        for n in names
    ]


def test_surplus_members_are_measured_by_the_member_selection_rule() -> None:
    """Issue 9: a duplicate at size one answers, labelled or not; of a leader-served
    replica a duplicate leader answers and its follower does not; a follower alone, or a
    member whose leadership cannot be read, is refused with the reason."""
    single = [pod("s", 0, suffix="-a"), pod("s", 0, suffix="-b")]
    [shed] = derive_intents([RoleSpec("s", replicas=1)], single)
    assert shed.members == ("s-0-b",)
    for label in (False, True):
        got = select_surplus(
            shape=shape_of(1, False), surplus=as_members(single, shed.members, label=label)
        )
        assert got == Selection(measured=("s-0-b",))
    group = [pod("g", 0, m, suffix=s) for s in ("-a", "-b") for m in (0, 1)]
    [shed] = derive_intents([RoleSpec("g", replicas=1, size=2)], group)
    assert shed.members == ("g-0-0-b", "g-0-1-b")
    got = select_surplus(
        shape=shape_of(2, False), surplus=as_members(group, shed.members, label=False)
    )
    assert got == Selection(measured=("g-0-0-b",))
    follower = select_surplus(
        shape=shape_of(2, False), surplus=as_members(group, ("g-0-1-b",), label=True)
    )
    assert not follower.ok and "does not answer for the replica" in follower.refusal
    ranks = select_surplus(
        shape=shape_of(2, True), surplus=as_members(group, shed.members, label=False)
    )
    assert ranks == Selection(measured=("g-0-0-b", "g-0-1-b"))
    unindexed = [*group, PodView(name="g-0-x", labels=pod("g", 0).labels)]
    lead = select_surplus(
        shape=shape_of(2, False), surplus=as_members(unindexed, ("g-0-x",), label=False)
    )
    assert "whether it leads the replica cannot be decided" in lead.refusal
    assert select_surplus(
        shape=shape_of(2, True), surplus=as_members(unindexed, ("g-0-x",), label=False)
    ).ok


@settings(max_examples=300)
@given(states(), st.booleans())
def test_a_surplus_shed_is_measured_by_the_rule_or_refused_never_left_unmeasured(
    state: tuple[list[RoleSpec], list[PodView]], external: bool
) -> None:
    """Over every derived surplus shed (all its members started): the selection measures
    exactly the members the rule says answer, whatever their eligibility label, and never
    admits a shed with nothing to measure (the drain would read "no member to measure"
    until its budget, then abort and hold); a refusal only where the rule cannot decide or
    no member answers, which only a leader-served replica can give."""
    roles, pods = state
    for intent in derive_intents(roles, pods):
        if intent.kind is not IntentKind.SURPLUS_SHED:
            continue
        size = next(r.size for r in roles if r.name == intent.role)
        shape = shape_of(size, external)
        plain = select_surplus(shape=shape, surplus=as_members(pods, intent.members, label=False))
        labelled = select_surplus(shape=shape, surplus=as_members(pods, intent.members, label=True))
        assert plain == labelled  # the label plays no part
        if not plain.ok:
            assert shape.shape is Shape.LEADER_SERVED and plain.refusal
            continue
        assert plain.measured  # never admitted with nothing to measure
        by_name = {p.name: p for p in pods}
        assert set(plain.measured) == {
            n for n in intent.members if answers(shape.shape, by_name[n].member)
        }


def test_a_surplus_shed_keeps_the_member_that_ran_and_sheds_the_pending_one() -> None:
    """Wedge 3 on the bed: a Pending duplicate named before the serving member (by name
    it would have been kept, and the serving member shed, drained and deleted)."""
    roles = [RoleSpec(name="server", replicas=1, size=1)]
    serving = pod("server", 0, suffix="-serving")
    pending = PodView(name="a-dup", labels=pod("server", 0).labels, engine_started=False)
    (shed,) = derive_intents(roles, [serving, pending])
    assert shed.kind is IntentKind.SURPLUS_SHED and shed.members == ("a-dup",)
    # Two that both ran: the first by name stays, as before.
    other = PodView(name="a-other", labels=pod("server", 0).labels)
    (shed,) = derive_intents(roles, [serving, other])
    assert shed.members == (serving.name,)
