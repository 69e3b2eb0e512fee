"""Intent derivation: examples, and a property over generated spec/Pod states — every
surplus member is eventually named exactly once, and nothing inside the spec ever is."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.intents import Intent, PodView, RoleSpec, derive_intents
from retirement.models import IntentKind
from retirement.names import LABEL_COMPONENT, LABEL_MEMBER_INDEX, LABEL_ORDINAL


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
