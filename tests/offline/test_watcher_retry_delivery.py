"""The watcher's delivery of the ``retirement-retry`` annotation (``watcher.retry_annotation``
answered, applied by ``watcher.reconcile``) against the fake Kubernetes layer and the
in-memory Temporal: invalid (a Warning Event, nothing else), ignored (no running
retirement of its replica), a replayed token, delivered through the retry update, then
cleared, bound to the version read; answered from Temporal, not the cached running set."""

from __future__ import annotations

import pytest

from retirement.models import (
    RetryRequest,
)
from retirement.names import ANNOTATION_RETRY
from retirement.phases import Phase
from tests.helpers.fake_temporal import TemporalCall
from tests.helpers.watcher_world import (
    MD,
    MD_UID,
    NS,
    WID,
    World,
    add_md,
    add_replicas,
    cache_without_refresh,
    held,
    make_world,
    request,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def w() -> World:
    return make_world()


async def test_a_retry_token_is_delivered_then_the_annotation_cleared(w: World) -> None:
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: "server:2:t1"})
    add_replicas(w, range(3))
    held(w)
    await w.pass_()
    (update,) = w.updates()
    assert (update.workflow_id, update.name, update.arg) == (WID, "retry", RetryRequest(token="t1"))
    (event,) = w.events()
    assert event["reason"] == "RetryDelivered" and event["type"] == "Normal"
    assert event["message"] == "token t1: Accept"
    assert event["involvedObject"]["uid"] == MD_UID
    assert ANNOTATION_RETRY not in w.annotations()
    assert w.temporal.latest(WID).state.retry_token == "t1"
    assert w.starts() == []  # a running (held) retirement keeps the slot
    await w.pass_()
    assert len(w.updates()) == 1  # the annotation is gone: nothing more


async def test_a_retry_to_a_running_retirement_is_answered_not_aborted(w: World) -> None:
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: "server:2:t1"})
    add_replicas(w, range(3))
    w.temporal.running(request(2), phase=Phase.DRAINING)
    await w.pass_()
    assert [u.arg.token for u in w.updates()] == ["t1"]
    assert [e["message"] for e in w.events("RetryDelivered")] == ["token t1: NotAborted"]
    assert ANNOTATION_RETRY not in w.annotations()


@pytest.mark.parametrize("value", ["server:2", "Server:2:t1", "server:x:t1", "server:2:-t", ""])
async def test_an_invalid_retry_annotation_gets_a_warning_and_nothing_else(
    w: World, value: str
) -> None:
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: value})
    add_replicas(w, range(3))
    held(w)
    await w.pass_(times=2)
    (event,) = w.events()
    assert event["reason"] == "RetryAnnotationInvalid" and event["type"] == "Warning"
    assert event["message"].startswith(f"{ANNOTATION_RETRY}: ")
    assert w.updates() == []
    assert w.annotations()[ANNOTATION_RETRY] == value  # left for a person to correct
    assert w.kube.called("patch_deployment") == []


@pytest.mark.parametrize(
    ("value", "running"),
    [
        ("server:2:t1", None),  # nothing runs
        ("server:1:t1", 2),  # another ordinal runs
        ("other:2:t1", 2),  # another role runs
    ],
)
async def test_a_retry_for_no_running_retirement_is_ignored_and_cleared(
    w: World, value: str, running: int | None
) -> None:
    add_md(w, replicas=3, annotations={ANNOTATION_RETRY: value})
    add_replicas(w, range(3))
    if running is not None:
        held(w, running)
    await w.pass_()
    (event,) = w.events()
    assert event["reason"] == "RetryAnnotationIgnored" and event["type"] == "Normal"
    role_name, ordinal, _ = value.split(":")
    assert event["message"] == f"no retirement of {role_name}:{ordinal} is running"
    assert w.updates() == []
    assert ANNOTATION_RETRY not in w.annotations()


@pytest.mark.parametrize("where", ["deployment status", "workflow state"])
async def test_a_replayed_retry_token_is_not_delivered(w: World, where: str) -> None:
    status = {"retirement": {"lastConsumedRetryToken": "t1"}}
    add_md(
        w,
        replicas=2,
        annotations={ANNOTATION_RETRY: "server:2:t1"},
        status=status if where == "deployment status" else None,
    )
    add_replicas(w, range(3))
    held(w, last_consumed_retry_token="t1" if where == "workflow state" else None)
    await w.pass_()
    assert w.updates() == []
    assert w.events() == []
    assert ANNOTATION_RETRY not in w.annotations()


async def test_a_token_consumed_by_an_earlier_retirement_is_a_replay_for_the_next(
    w: World,
) -> None:
    """A GitOps tool re-applies an old ``retirement-retry`` annotation: the token a
    previous retirement of that role:ordinal consumed (``status.retryTokens``) is a
    replay for the retirement that holds now, and a new retirement starts knowing it."""
    status = {"retryTokens": {"server:2": "t-old"}}
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: "server:2:t-old"}, status=status)
    add_replicas(w, range(3))
    held(w, last_consumed_retry_token=None)  # this retirement never consumed a token
    await w.pass_()
    assert w.updates() == []
    assert ANNOTATION_RETRY not in w.annotations()


async def test_a_new_retirement_starts_with_the_role_ordinals_consumed_token(
    w: World,
) -> None:
    add_md(w, replicas=2, status={"retryTokens": {"server:2": "t-old", "server:9": 7}})
    add_replicas(w, range(3))
    await w.pass_()
    [req] = w.starts()
    assert (req.ordinal, req.last_consumed_retry_token) == (2, "t-old")


async def test_the_annotation_clear_is_bound_to_the_version_read(w: World) -> None:
    """Another writer changes the deployment while the token is delivered: the clear is a
    Conflict (never a blind overwrite), the pass goes on, and the next pass sees the
    consumed token as a replay and clears it."""
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: "server:2:t1"})
    add_replicas(w, range(3))
    add_md(w, "other", replicas=0)
    add_replicas(w, [0], deployment="other")
    held(w)

    def other_writer(_: TemporalCall) -> None:
        w.kube.patch_deployment(namespace=NS, name=MD, patch={"metadata": {"labels": {"x": "y"}}})

    w.temporal.on("execute_update", other_writer)
    await w.pass_()
    assert len(w.updates()) == 1
    assert w.annotations()[ANNOTATION_RETRY] == "server:2:t1"
    assert w.annotations(name="other") == {}
    assert [r.deployment for r in w.starts()] == ["other"]  # the pass went on
    # The workflow consumed the token (continue-as-new carries it).
    w.temporal.set_state(WID, last_consumed_retry_token="t1", retry_token=None)
    await w.pass_()
    assert len(w.updates()) == 1
    assert ANNOTATION_RETRY not in w.annotations()


async def test_a_retry_annotation_read_before_the_first_visibility_query_is_delivered(
    w: World,
) -> None:
    """The running set is empty until the first visibility query: a retry annotation
    reconciled before it is answered from Temporal itself (describe, then the state), so
    the held retirement takes the token instead of the annotation being ignored and
    cleared (found: a watcher started or failed over dropped every pending annotation)."""
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: "server:2:t1"})
    add_replicas(w, range(3))
    held(w)
    cache_without_refresh(w)
    assert w.rec.running.refreshes == 0 and not w.rec.running.may_run((NS, MD))
    await w.rec.reconcile_key((NS, MD))
    assert w.events("RetryAnnotationIgnored") == []
    (update,) = w.updates()
    assert (update.workflow_id, update.name, update.arg) == (WID, "retry", RetryRequest(token="t1"))
    assert [e["message"] for e in w.events("RetryDelivered")] == ["token t1: Accept"]
    assert w.temporal.latest(WID).state.retry_token == "t1"
    assert ANNOTATION_RETRY not in w.annotations()
    assert w.starts() == []  # the held retirement was read: it keeps the slot
    assert w.temporal.called("list_workflows") == []


async def test_an_invalid_retry_annotation_asks_temporal_nothing(w: World) -> None:
    add_md(w, replicas=2, annotations={ANNOTATION_RETRY: "server:two:t1"})
    add_replicas(w, range(2))
    cache_without_refresh(w)
    await w.rec.reconcile_key((NS, MD))
    assert [e["reason"] for e in w.events()] == ["RetryAnnotationInvalid"]
    assert w.temporal.calls == []
