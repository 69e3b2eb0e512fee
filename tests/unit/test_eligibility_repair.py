"""The decision half of the watcher's label repair (``retirement.eligibility.label_repair``),
property-tested: over any Pods of a deployment (declared and departed roles, replicas of
the declared size or not, Ready or not, labelled or not, group members, terminating,
protected), the label is put only on a Ready, measured, unprotected single member that
lacks it, taken only off an unprotected labelled member that is not Ready or not measured,
and nothing of an undecidable replica is touched.  A few examples pin the outcomes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.eligibility import LabelRepair, in_group, label_repair
from retirement.names import LABEL_COMPONENT, LABEL_ELIGIBLE, LABEL_MEMBER_INDEX, LABEL_ORDINAL
from retirement.shape import MemberPod, ShapeReading, read_shape, select_members

ENGINE = "vLLM"  # Server at size 1: Single; above: LeaderServed (the leader answers)


@dataclass(frozen=True)
class FakePod:
    name: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False
    ready: str = "True"


def shape_of(sizes: Mapping[str, int]) -> Callable[[str], ShapeReading]:
    def read(role: str) -> ShapeReading:
        return read_shape(
            engine=ENGINE, role_kind="Server", size=sizes[role], extra_args=(), command=None, env=()
        )

    return read


def decide(
    pods: list[FakePod], sizes: Mapping[str, int], protected: frozenset[str] = frozenset()
) -> LabelRepair[FakePod]:
    return label_repair(
        pods,
        ready=lambda p: p.ready,
        sizes=sizes,
        shape_of=shape_of(sizes),
        protected=protected,
    )


@st.composite
def deployments(draw: st.DrawFn) -> tuple[list[FakePod], dict[str, int], frozenset[str]]:
    sizes = draw(st.dictionaries(st.sampled_from(["a", "b"]), st.integers(1, 3), max_size=2))
    pods: list[FakePod] = []
    for i in range(draw(st.integers(0, 8))):
        labels = {
            LABEL_COMPONENT: draw(st.sampled_from(["a", "b", "gone"])),
            LABEL_ORDINAL: draw(st.sampled_from(["0", "1"])),
        }
        index = draw(st.sampled_from([None, "0", "1", "2", "x"]))
        if index is not None:
            labels[LABEL_MEMBER_INDEX] = index
        eligible = draw(st.sampled_from([None, "true", "false"]))
        if eligible is not None:
            labels[LABEL_ELIGIBLE] = eligible
        pods.append(
            FakePod(
                name=f"p{i}",
                uid=f"u{i}",
                labels=labels,
                terminating=draw(st.booleans()),
                ready=draw(st.sampled_from(["True", "False", "Unknown"])),
            )
        )
    protected = frozenset(draw(st.sets(st.sampled_from([p.uid for p in pods]))) if pods else set())
    return pods, sizes, protected


def replica_of(p: FakePod) -> tuple[str, str]:
    return p.labels.get(LABEL_COMPONENT, ""), p.labels.get(LABEL_ORDINAL, "")


def measured(pods: list[FakePod], sizes: Mapping[str, int], p: FakePod) -> bool | None:
    """Whether ``p`` is measured in its replica; None when the replica is undecidable."""
    role, _ = replica_of(p)
    members = [q for q in pods if not q.terminating and replica_of(q) == replica_of(p)]
    if role not in sizes or len(members) != sizes[role]:
        return None
    sel = select_members(
        shape=shape_of(sizes)(role),
        size=sizes[role],
        members=[MemberPod(name=q.name, uid=q.uid, labels=q.labels) for q in members],
    )
    return (p.name in sel.measured) if sel.ok else None


@settings(max_examples=300, deadline=None)
@given(deployments())
def test_the_repair_changes_only_what_the_rule_allows(
    case: tuple[list[FakePod], dict[str, int], frozenset[str]],
) -> None:
    pods, sizes, protected = case
    repair = decide(pods, sizes, protected)
    removed, added = {p.uid for p in repair.remove}, {p.uid for p in repair.add}
    assert not removed & added
    for p in pods:
        touched = p.uid in removed | added
        if p.terminating or p.uid in protected or measured(pods, sizes, p) is None:
            assert not touched, p  # ignored, protected or undecidable: left alone
            continue
        labelled = p.labels.get(LABEL_ELIGIBLE) == "true"
        is_measured = measured(pods, sizes, p)
        group = in_group(
            size=sizes[replica_of(p)[0]], member_index=p.labels.get(LABEL_MEMBER_INDEX)
        )
        # Off exactly when labelled and it should not serve.
        assert (p.uid in removed) == (labelled and (not is_measured or p.ready != "True")), p
        # On exactly when unlabelled, measured, Ready and a single member (no probe).
        assert (p.uid in added) == (
            not labelled and bool(is_measured) and p.ready == "True" and not group
        ), p


@settings(max_examples=100, deadline=None)
@given(deployments())
def test_the_decision_keeps_the_order_of_the_pods(
    case: tuple[list[FakePod], dict[str, int], frozenset[str]],
) -> None:
    pods, sizes, protected = case
    repair = decide(pods, sizes, protected)
    for changed in (repair.remove, repair.add):
        positions = [pods.index(p) for p in changed]
        order = list(dict.fromkeys(replica_of(p) for p in pods if not p.terminating))
        grouped = sorted(positions, key=lambda i: order.index(replica_of(pods[i])))
        assert positions == grouped  # replica by replica, as the Pods were listed


def single(
    name: str, *, ordinal: str = "0", labels: Mapping[str, str] = {}, ready: str = "True"
) -> FakePod:
    """A member of a size-one replica of role "a", its UID its name."""
    merged = {LABEL_COMPONENT: "a", LABEL_ORDINAL: ordinal, **labels}
    return FakePod(name=name, uid=name, labels=merged, ready=ready)


def test_an_orphan_gets_the_label_and_an_unready_member_loses_it() -> None:
    orphan = single("orphan")
    unready = single("unready", ordinal="1", labels={LABEL_ELIGIBLE: "true"}, ready="False")
    repair = decide([orphan, unready], {"a": 1})
    assert repair.add == (orphan,) and repair.remove == (unready,)


def test_a_leader_served_replica_labels_its_leader_only_and_never_a_group_member() -> None:
    leader = FakePod("l", "l", {LABEL_COMPONENT: "a", LABEL_ORDINAL: "0", LABEL_MEMBER_INDEX: "0"})
    worker = FakePod(
        "w",
        "w",
        {LABEL_COMPONENT: "a", LABEL_ORDINAL: "0", LABEL_MEMBER_INDEX: "1", LABEL_ELIGIBLE: "true"},
    )
    repair = decide([leader, worker], {"a": 2})
    assert repair.add == ()  # the leader is a group member: only the restore labels it
    assert repair.remove == (worker,)  # a worker does not serve


def test_protected_departed_and_incomplete_replicas_are_left_alone() -> None:
    protected = single("p")
    departed = FakePod("d", "d", {LABEL_COMPONENT: "gone", LABEL_ORDINAL: "0"})
    incomplete = FakePod("i", "i", {LABEL_COMPONENT: "b", LABEL_ORDINAL: "0"})
    repair = decide([protected, departed, incomplete], {"a": 1, "b": 2}, frozenset({"p"}))
    assert repair.add == () and repair.remove == ()
