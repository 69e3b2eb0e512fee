"""Refused intents in the watcher's reconcile (``watcher.refusals``, ``watcher.starts``):
a refused intent is not started again every pass nor blocks the others, backs off
doubling up to the max and is tried at once when what it depended on changes; an intent
that cannot even be requested is refused with an Event and the next one starts."""

from __future__ import annotations

import pytest

from retirement.phases import Outcome
from tests.helpers.fake_kube import member_pod
from tests.helpers.watcher_world import (
    MD,
    MD_UID,
    NS,
    WID,
    Clock,
    World,
    add_md,
    add_replicas,
    make_world,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def w() -> World:
    return make_world()


async def test_a_refused_intent_neither_restarts_every_pass_nor_blocks_others(
    w: World,
) -> None:
    add_md(w, replicas=1)
    add_replicas(w, range(3))
    for _ in range(3):
        await w.pass_()
        w.temporal.close(WID, outcome=Outcome.REFUSED)  # admission refused it
    ordinals = [r.ordinal for r in w.starts()]
    assert ordinals.count(2) == 1, ordinals
    assert 1 in ordinals, ordinals


async def test_a_refusal_backs_off_doubling_and_ends_when_what_it_depended_on_changes() -> None:
    clock = Clock()
    w = make_world(clock=clock)
    add_md(w, replicas=1)
    add_replicas(w, range(2), container_id=None)  # never started: admission refuses

    async def refused_pass() -> None:
        await w.pass_()
        w.temporal.close(WID, outcome=Outcome.REFUSED, reasons=["admission refused: no ID"])

    await refused_pass()  # starts 1
    for _ in range(5):
        await refused_pass()  # reads the refusal once; nothing else to start
    assert [r.ordinal for r in w.starts()] == [1]
    assert len(w.temporal.called("result")) == 1  # an ended run is read once
    assert w.metric("retire_watcher_starts_refused_total", reason="admission") == 1
    assert w.metric("retire_watcher_intents_backing_off", deployment=f"{NS}/{MD}") == 1
    clock.now += 29
    await refused_pass()
    assert len(w.starts()) == 1
    clock.now += 1  # 30 s: tried again, refused again: now 60 s
    await refused_pass()
    await refused_pass()
    assert len(w.starts()) == 2
    clock.now += 59
    await refused_pass()
    assert len(w.starts()) == 2
    clock.now += 1
    await refused_pass()
    await refused_pass()
    assert len(w.starts()) == 3
    for _ in range(10):  # 120, 240, 480, then 600 s at most
        clock.now += 600
        await refused_pass()
        await refused_pass()
    assert len(w.starts()) == 13
    assert w.rec.refusals[(NS, MD, "server", 1)].backoff_s == 600
    assert w.rec.refusals[(NS, MD, "server", 1)].reason == "admission refused: no ID"
    # The Pod's container starts: what the refusal depended on changed, so it is tried now.
    w.kube.add_pod(member_pod(f"{MD}-server-1", deployment=MD, ordinal=1, uid=f"uid-{MD}-server-1"))
    await w.pass_()
    assert len(w.starts()) == 14
    w.temporal.close(WID, outcome=Outcome.COMPLETED)
    w.kube.remove_pod(f"{MD}-server-1")
    await w.pass_()
    assert w.rec.refusals == {}  # the intent is gone: so is its refusal


async def test_an_intent_that_cannot_be_requested_is_refused_and_the_next_one_starts(
    w: World,
) -> None:
    """A hostile ordinal label (beyond what a request may carry) is refused in the watcher
    with one Warning Event, and the deployment's other intents go on."""
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    w.kube.add_pod(member_pod("hostile", deployment=MD, ordinal=1_000_000, uid="uh"))
    await w.pass_(times=3)
    assert [r.ordinal for r in w.starts()] == [1]
    (event,) = w.events("IntentInvalid")
    assert event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == MD_UID
    assert event["message"].startswith("CountTrim server:1000000 cannot be requested: ordinal")
    assert w.metric("retire_watcher_starts_refused_total", reason="invalid-request") == 1
