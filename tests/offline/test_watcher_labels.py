"""The watcher's eligibility-label repair (decided by ``retirement.eligibility``, applied
by ``watcher.labels``) against the fake Kubernetes layer: orphans repaired and unready
members unlabelled, the members of a running retirement protected, group members never
labelled, undecidable groups untouched, and every write bound to the value read."""

from __future__ import annotations

from typing import Any

import pytest

from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome
from tests.helpers import model_deployment, role
from tests.helpers.fake_kube import member_pod
from tests.helpers.fake_temporal import TemporalCall
from tests.helpers.watcher_world import (
    MD,
    MD_UID,
    NS,
    WID,
    World,
    add_md,
    add_replicas,
    make_world,
    request,
    target_of,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def w() -> World:
    return make_world()


async def test_orphans_are_repaired_and_unready_members_lose_the_label(w: World) -> None:
    add_md(w, replicas=3)
    orphan, unready, unknown, retiring = add_replicas(w, range(4), eligible=False)
    w.kube.set_label(unready, LABEL_ELIGIBLE, "true")
    w.kube.pods[(NS, unready)]["status"]["conditions"][0]["status"] = "False"
    w.kube.set_label(unknown, LABEL_ELIGIBLE, "true")
    del w.kube.pods[(NS, unknown)]["status"]["conditions"]
    w.temporal.running(request(3))  # "retiring" is ordinal 3
    await w.pass_()
    assert w.eligible(orphan) == "true"
    assert w.eligible(unready) is None
    assert w.eligible(unknown) is None
    assert w.eligible(retiring) is None  # the running retirement's member is not touched
    assert w.metric("retire_watcher_eligibility_changes_total", value="true") == 1
    assert w.metric("retire_watcher_eligibility_changes_total", value="removed") == 2
    await w.pass_()
    assert len(w.kube.called("patch_pod")) == 3  # level-based: nothing more to do


@pytest.mark.parametrize("outcome", [Outcome.RUNNING, Outcome.ABORTED])
async def test_members_of_the_running_retirement_are_protected(w: World, outcome: Outcome) -> None:
    """By role and ordinal before admission, by admitted UID after it."""
    add_md(w, replicas=1)
    names = add_replicas(w, range(3), eligible=False)
    req = request(2)
    target = target_of(req, {names[1]: f"uid-{MD}-server-1"})  # a UID the target bound
    w.temporal.running(req, outcome=outcome, target=target)
    await w.pass_()
    assert w.eligible(names[0]) == "true"
    assert w.eligible(names[1]) is None
    assert w.eligible(names[2]) is None
    assert [c.args["name"] for c in w.kube.called("patch_pod")] == [names[0]]


async def test_a_just_started_retirement_is_protected_in_the_same_pass(w: World) -> None:
    add_md(w, replicas=1)
    names = add_replicas(w, range(2), eligible=False)
    await w.pass_()
    assert [r.ordinal for r in w.starts()] == [1]
    assert w.eligible(names[0]) == "true"
    assert w.eligible(names[1]) is None


async def test_leader_served_groups_label_the_leader_only(w: World) -> None:
    add_md(w, replicas=1, size=2)
    for i in range(2):
        w.kube.add_pod(member_pod(f"{MD}-0-{i}", deployment=MD, ordinal=0, member=i, uid=f"u{i}"))
    await w.pass_()
    assert w.eligible(f"{MD}-0-0") == "true"
    assert w.eligible(f"{MD}-0-1") is None


async def test_the_watcher_never_labels_a_group_member(w: World) -> None:
    """Wedge 5 of the fleet issue: one rule for putting the label on
    (``retirement.eligibility``).  A group member needs the identity probe, which only the
    restore runs: a Ready, unlabelled member of an external-LB group (every rank serves)
    is left to the restore, not labelled by the watcher a second later."""
    add_md(w, replicas=1, size=2, extra_args=["--data-parallel-external-lb"])
    for i in range(2):
        w.kube.add_pod(
            member_pod(
                f"{MD}-0-{i}", deployment=MD, ordinal=0, member=i, uid=f"u{i}", eligible=False
            )
        )
    await w.pass_(times=2)
    assert w.eligible(f"{MD}-0-0") is None
    assert w.eligible(f"{MD}-0-1") is None
    assert w.kube.called("patch_pod") == []


async def test_a_group_member_the_restore_held_stays_unlabelled_after_it_ends(w: World) -> None:
    """A held retirement of a group ends (cancel-intent): its member the restore held
    (identity not proven) is not labelled by the watcher on PodReady alone."""
    add_md(w, replicas=2, size=2, extra_args=["--data-parallel-external-lb"])
    for i in range(2):
        w.kube.add_pod(
            member_pod(
                f"{MD}-1-{i}", deployment=MD, ordinal=1, member=i, uid=f"u{i}", eligible=False
            )
        )
    w.temporal.running(request(1), outcome=Outcome.ABORTED)
    await w.pass_()
    w.temporal.close(WID, outcome=Outcome.ABORTED)
    await w.pass_(times=2)
    assert [w.eligible(f"{MD}-1-{i}") for i in range(2)] == [None, None]
    assert w.kube.called("patch_pod") == []


async def test_a_group_member_that_should_not_serve_still_loses_the_label(w: World) -> None:
    add_md(w, replicas=1, size=2, extra_args=["--data-parallel-external-lb"])
    for i in range(2):
        w.kube.add_pod(member_pod(f"{MD}-0-{i}", deployment=MD, ordinal=0, member=i, uid=f"u{i}"))
    w.kube.pods[(NS, f"{MD}-0-1")]["status"]["conditions"][0]["status"] = "False"
    await w.pass_()
    assert w.eligible(f"{MD}-0-0") == "true"
    assert w.eligible(f"{MD}-0-1") is None


def untouchable(kind: str, w: World, *, first: bool) -> None:
    """A group the watcher cannot decide about, every member Ready: the first Pod has the
    label when ``first``, the others the opposite (nothing is to change either way)."""
    labels = iter([first])

    def pod(name: str, **kw: Any) -> None:
        eligible = next(labels, not first)
        w.kube.add_pod(member_pod(name, deployment=MD, eligible=eligible, **kw))

    if kind == "departed role":
        add_md(w, replicas=1)
        pod("a", role="old", ordinal=0, uid="ua")
    elif kind == "incomplete group":
        add_md(w, replicas=1, size=2)
        pod("a", ordinal=0, member=0, uid="ua")
    elif kind == "surplus group":
        add_md(w, replicas=1)
        pod("a", ordinal=0, uid="ua")
        pod("b", ordinal=0, uid="ub")
    elif kind == "disaggregated shape":
        add_md(w, replicas=0, extra_roles=[role("prefill", replicas=1, kind="Prefill")])
        pod("a", role="prefill", ordinal=0, uid="ua")
    elif kind == "replaced command line":
        body = model_deployment(MD, namespace=NS, uid=MD_UID, replicas=1)
        body["spec"]["roles"][0]["command"] = ["python3", "serve.py"]
        w.kube.add_deployment(body)
        pod("a", ordinal=0, uid="ua")
    elif kind == "leadership missing":
        add_md(w, replicas=1, size=2)
        pod("a", ordinal=0, uid="ua")
        pod("b", ordinal=0, uid="ub")
    elif kind == "terminating":
        add_md(w, replicas=1)
        body = member_pod("a", deployment=MD, ordinal=0, uid="ua", eligible=first)
        body["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
        w.kube.add_pod(body)
    else:
        raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind",
    [
        "departed role",
        "incomplete group",
        "surplus group",
        "disaggregated shape",
        "replaced command line",
        "leadership missing",
        "terminating",
    ],
)
@pytest.mark.parametrize("first", [True, False], ids=["labelled", "unlabelled"])
async def test_groups_that_cannot_be_decided_are_not_touched(
    w: World, kind: str, first: bool
) -> None:
    untouchable(kind, w, first=first)
    before = {name: w.eligible(name) for _, name in w.kube.pods}
    w.temporal.running(request(9))  # keeps the slot: no start interferes
    await w.pass_()
    assert w.kube.called("patch_pod") == []
    assert {name: w.eligible(name) for _, name in w.kube.pods} == before


async def test_a_label_changed_since_it_was_read_is_not_overwritten(w: World) -> None:
    """The patch ``test``s the value read: a change made meanwhile (here, between the Pod
    list and the patch) is left to the next pass."""
    add_md(w, replicas=1)
    (name,) = add_replicas(w, [0], eligible=False)
    w.temporal.running(request(9))
    w.temporal.on("describe", lambda _: w.kube.set_label(name, LABEL_ELIGIBLE, "false"))
    await w.pass_()
    assert len(w.kube.called("patch_pod")) == 1
    assert w.eligible(name) == "false"
    assert w.metric("retire_watcher_eligibility_changes_total", value="true") == 0
    w.temporal.hooks.clear()
    await w.pass_()
    assert w.eligible(name) == "true"


async def test_a_replaced_pod_is_not_relabelled(w: World) -> None:
    add_md(w, replicas=1)
    (name,) = add_replicas(w, [0], eligible=False)
    w.temporal.running(request(9))

    def replace(_: TemporalCall) -> None:
        w.kube.add_pod(member_pod(name, deployment=MD, ordinal=0, uid="uid-new", eligible=False))

    w.temporal.on("describe", replace)
    await w.pass_()
    assert w.eligible(name) is None
    assert w.kube.pods[(NS, name)]["metadata"]["uid"] == "uid-new"
