"""The watcher as a controller (``watcher.controller``) over FakeKube, fed by list+watch
through ``tests/helpers/fake_source``: only the deployment an event touched is reconciled,
the watch events themselves feed the cache (no re-list), readiness follows the informers
and Temporal, a refused intent comes back when its back-off ends, and the work queue,
fleet cache and informer keep their contracts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from kube.errors import Expired
from kube.objects import Pod
from kube.watching import WatchEvent
from retirement.models import workflow_id_for
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome, Phase
from tests.helpers.fake_kube import member_pod
from tests.helpers.fake_temporal import rpc_error
from tests.helpers.running_controller import Running, running, until
from tests.helpers.watcher_world import (
    MD,
    NS,
    WID,
    Clock,
    add_md,
    add_replicas,
    make_world,
    request,
)
from watcher.fleet import Fleet, decode_deployment
from watcher.informer import Changed, Delta, Informer, Listed
from watcher.reconcile import WatcherSettings
from watcher.running import QUERY, WORKFLOW_TYPE, RunningSet, deployment_of
from watcher.workqueue import WorkQueue
from workflows.retirement import RetirementWorkflow

__all__ = ["running"]  # the fixture, shared


# ---------------------------------------------------------------- the controller


async def test_an_event_reconciles_only_the_deployment_it_touched(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    for name in ("aa", "bb", MD):
        add_md(w, name, replicas=2)
        add_replicas(w, range(2), deployment=name)
    r = await running(w)
    await until(lambda: r.health.ready, "ready")
    await until(lambda: r.reconciled() >= 3, "the first reconcile of each")
    await asyncio.sleep(0.2)
    before, lists = r.reconciled(), len(r.source.lists)
    # The Pod's address changes (the reconcile reads its Pod views).
    w.kube.edit_pod(
        f"{MD}-server-1", lambda body: body["status"].update(podIP="198.18.1.99"), namespace=NS
    )
    await until(lambda: r.reconciled() == before + 1, "one reconcile")
    await asyncio.sleep(0.2)
    assert r.reconciled() == before + 1  # only the touched deployment
    assert len(r.source.lists) == lists  # the watch event fed the cache: no re-list
    assert w.kube.called("list_pods") == [] and w.kube.called("list_deployments") == []
    # Nothing runs and nothing is to retire: no Temporal call but the visibility refresh.
    assert {c.method for c in w.temporal.calls} == {"list_workflows"}


async def test_a_scale_down_seen_by_the_watch_starts_the_retirement(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    add_md(w, replicas=2)
    add_replicas(w, range(2))
    r = await running(w)
    await until(lambda: r.health.ready, "ready")
    w.kube.patch_deployment(
        namespace=NS, name=MD, patch={"spec": {"roles": [{"name": "server", "replicas": 1}]}}
    )
    await until(lambda: [q.ordinal for q in w.starts()] == [1], "the start")
    await asyncio.sleep(0.2)
    assert len(w.starts()) == 1


async def test_a_deleted_deployment_gets_cancel_intent_from_its_delete_event(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    w.temporal.running(request(1), outcome=Outcome.ABORTED, phase=Phase.ABORTED)
    r = await running(w)
    await until(lambda: r.health.ready, "ready")
    w.kube.remove_deployment(MD, namespace=NS)
    await until(lambda: w.signals(), "cancel-intent")
    (sig,) = w.signals()
    assert sig.name == "cancel_intent" and "was deleted" in sig.arg.reason


async def test_a_refused_intent_comes_back_when_its_back_off_ends(
    running: Callable[..., Awaitable[Running]],
) -> None:
    """Nothing changes after a refusal: the queue's delayed add brings the deployment
    back when the back-off ends (here 0.2 s), not a resync."""
    clock = Clock()
    w = make_world(settings=WatcherSettings(refusal_backoff_s=0.2), clock=clock)
    clock.now = 0.0
    add_md(w, replicas=1)
    add_replicas(w, range(2))

    def refused() -> None:
        w.temporal.close(WID, outcome=Outcome.REFUSED, reason="no")

    await running(w)
    await until(lambda: len(w.starts()) == 1, "the first start")
    refused()
    await until(lambda: w.rec.refusals, "the refusal remembered (read when it left the list)")
    await asyncio.sleep(0.3)
    assert len(w.starts()) == 1  # backing off: the fake clock has not moved
    clock.now += 0.2  # the back-off ends; the delayed add already waits in the queue
    await until(lambda: len(w.starts()) == 2, "tried again", timeout=3)


async def test_a_refused_replica_whose_other_labels_change_is_tried_again_at_once(
    running: Callable[..., Awaitable[Running]],
) -> None:
    """A change of labels the reconcile does not otherwise read reaches a deployment with
    a remembered refusal (the refusal depends on them): the back-off ends at once, as it
    does on any change of what the refusal depended on.  Without a refusal the same kind
    of change is cached without a reconcile (``tests/offline/test_watcher_changes.py``)."""
    clock = Clock()
    w = make_world(clock=clock)  # the clock never moves: the back-off never ends by itself
    add_md(w, replicas=1)
    add_replicas(w, range(2))
    r = await running(w)
    await until(lambda: len(w.starts()) == 1, "the first start")
    w.temporal.close(WID, outcome=Outcome.REFUSED, reason="no")
    await until(lambda: w.rec.refusals, "the refusal remembered")
    await until(lambda: not r.controller.queue.in_flight((NS, MD)), "the reconcile ended")
    w.kube.set_label(f"{MD}-server-1", "example.com/churn", "1")
    await until(lambda: len(w.starts()) == 2, "tried again")


async def test_readiness_needs_the_informers_and_temporal(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    add_md(w, replicas=1)
    add_replicas(w, range(1))
    w.temporal.fail("list_workflows", rpc_error(), times=1_000_000)
    r = await running(w)
    await until(lambda: r.reconciled() >= 1, "a reconcile")
    await asyncio.sleep(0.2)
    assert not r.health.ready  # Temporal's visibility never answered
    w.temporal._failures.clear()
    await until(lambda: r.health.ready, "ready")


async def test_an_informer_that_cannot_list_keeps_the_watcher_unready_until_it_can(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    add_md(w, replicas=1)
    add_replicas(w, range(1))
    r = await running(w)
    r.source.fail_lists(3)
    # Three failed lists back off 0.5 + 1 + 2 s before the fourth: the bound leaves room for a
    # loaded machine (the full offline suite once took longer than 10 s here).
    await until(lambda: r.health.ready, "ready once the listings succeed", timeout=30)
    # Ready comes first (caches synced, running retirements read); the reconcilers start then.
    await until(lambda: r.reconciled() >= 1, "a reconcile after the listings succeed")


async def test_a_failing_deployment_is_requeued_with_a_back_off(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    add_md(w, "aa", replicas=0)
    add_replicas(w, [0], deployment="aa")
    w.temporal.fail("start_workflow", rpc_error(), times=2)
    r = await running(w)
    await until(lambda: len(w.starts()) == 3, "tried until Temporal answers", timeout=10)
    assert r.controller.queue.failures(("default", "aa")) == 0  # forgotten after success


# ---------------------------------------------------------------- the work queue


async def test_the_queue_deduplicates_and_never_hands_out_a_key_twice_at_once() -> None:
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    first = await q.get()
    assert first == "a"
    q.add("a")  # changed while in flight: queued again only when done
    assert await q.get() == "b"
    assert len(q) == 0
    q.done("a")
    assert await q.get() == "a"
    q.done("a")
    q.done("b")
    assert len(q) == 0


async def test_the_queue_rate_limits_failures_and_delays_adds() -> None:
    now = [0.0]
    q = WorkQueue(base_delay_s=1.0, max_delay_s=4.0, clock=lambda: now[0])
    assert [q.add_rate_limited("a") for _ in range(4)] == [1.0, 2.0, 4.0, 4.0]
    q.forget("a")
    assert q.failures("a") == 0
    q.add_after("b", 5.0)
    assert len(q) == 0
    now[0] = 5.0
    got = await asyncio.wait_for(q.get(), 1)
    assert got == "a"  # the first delayed add was due at 1 s
    q.close()
    assert await q.get() is None


async def test_the_queue_hands_each_key_to_one_waiting_worker_and_wakes_all_on_close() -> None:
    q = WorkQueue()
    getters = [asyncio.create_task(q.get()) for _ in range(4)]
    for _ in range(5):
        await asyncio.sleep(0)
    q.add("a")
    q.add("b")
    for _ in range(5):
        await asyncio.sleep(0)
    assert sorted(g.result() for g in getters if g.done()) == ["a", "b"]
    waiting = [g for g in getters if not g.done()]
    assert len(waiting) == 2
    q.add_after("c", 0.01)  # a delayed key while every worker waits: one of them takes it
    await until(lambda: any(g.done() for g in waiting), "the delayed key handed out")
    assert [g.result() for g in waiting if g.done()] == ["c"]
    q.close()
    assert [await g for g in waiting if not g.done()] == [None]


# ---------------------------------------------------------------- the fleet cache


def pod(name: str, deployment: str, namespace: str = NS) -> Pod:
    return Pod.from_raw(member_pod(name, deployment=deployment, namespace=namespace, uid=name))


def test_a_pod_is_filed_under_its_deployment_and_moves_with_its_label() -> None:
    f = Fleet()
    assert f.put_pod(pod("p", "a")) == {(NS, "a")}
    assert f.put_pod(pod("p", "b")) == {(NS, "a"), (NS, "b")}
    assert f.pods_of((NS, "a")) == [] and [p.name for p in f.pods_of((NS, "b"))] == ["p"]
    assert f.drop_pod(NS, "p") == {(NS, "b")}
    assert f.known() == set()


def test_a_listing_replaces_only_its_namespace() -> None:
    f = Fleet()
    f.put_pod(pod("p", "a"))
    f.put_pod(pod("q", "a", namespace="other"))
    touched = f.replace_pods([pod("r", "c")], namespace=NS)
    assert touched == {(NS, "a"), (NS, "c")}
    assert [p.name for p in f.pods_of(("other", "a"))] == ["q"]


# ---------------------------------------------------------------- the informer


class ScriptedSource:
    """A source whose watches are scripted: each call of ``watch`` takes the next script
    (a list of events, or an exception to raise)."""

    def __init__(self, scripts: list[list[WatchEvent] | Exception]) -> None:
        self.scripts, self.lists, self.watched_from = scripts, 0, []
        self.stop = threading.Event()

    def list(self, resource: Any, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        self.lists += 1
        return [member_pod("p0", deployment=MD, uid="u0")], f"{self.lists}00"

    def watch(self, resource: Any, namespace: str | None, resource_version: str) -> Any:
        self.watched_from.append(resource_version)
        if not self.scripts:
            self.stop.set()
            return iter(())
        script = self.scripts.pop(0)
        if isinstance(script, Exception):
            raise script
        return iter(script)


def event(kind: str, name: str, rv: str) -> WatchEvent:
    body = member_pod(name, deployment=MD, uid=name)
    body["metadata"]["resourceVersion"] = rv
    return WatchEvent(kind, body)


def test_the_informer_resumes_each_watch_from_the_last_version_and_relists_on_410() -> None:
    bookmark = WatchEvent("BOOKMARK", {"metadata": {"resourceVersion": "107"}})
    src = ScriptedSource(
        [
            [event("ADDED", "p1", "101"), event("MODIFIED", "p1", "102")],
            [bookmark],
            [event("DELETED", "p1", "108")],
            Expired("watch pods", status=410, reason="Gone"),
            [],
        ]
    )
    got: list[Delta] = []
    inf = Informer(source=src, resource="pods", namespace=None, deliver=got.append)
    inf.run(src.stop)
    assert src.watched_from == ["100", "102", "107", "108", "200", "200"]
    assert src.lists == 2  # the first listing, and once after 410 only
    kinds = [
        ("list", len(d.pods)) if isinstance(d, Listed) else (d.key[1], d.gone)
        for d in got
        if isinstance(d, Listed | Changed)
    ]
    assert kinds == [("list", 1), ("p1", False), ("p1", False), ("p1", True), ("list", 1)]
    assert inf.synced.is_set() and inf.healthy


# ---------------------------------------------------------------- the running set


def test_the_running_set_keeps_an_ended_retirement_until_it_was_read() -> None:
    rs = RunningSet(namespaces=frozenset({NS}))
    wid = workflow_id_for(namespace=NS, deployment=MD)
    assert rs.replace([wid, "retirement/elsewhere/x", "other/id"]) == {(NS, MD)}
    assert rs.replace([]) == {(NS, MD)}
    assert rs.may_run((NS, MD))  # ended, not yet read
    rs.not_running((NS, MD))
    assert not rs.may_run((NS, MD))
    assert deployment_of("retirement/a/b") == ("a", "b") and deployment_of("x/a/b") is None
    assert RetirementWorkflow.__name__.removesuffix("Workflow") == WORKFLOW_TYPE
    assert WORKFLOW_TYPE in QUERY


def test_a_pod_label_change_is_delivered_as_a_change_of_that_pod() -> None:
    body = member_pod("p", deployment=MD, uid="u")
    body["metadata"]["labels"][LABEL_ELIGIBLE] = "true"
    src = ScriptedSource([[WatchEvent("MODIFIED", body)]])
    got: list[Delta] = []
    Informer(source=src, resource="pods", namespace=NS, deliver=got.append).run(src.stop)
    changed = [d for d in got if isinstance(d, Changed)]
    assert [(c.key, c.pod is not None and c.pod.labels.get(LABEL_ELIGIBLE)) for c in changed] == [
        ((NS, "p"), "true")
    ]


# ---------------------------------------------------------------- a restarted watcher


async def test_a_restarted_watcher_never_relabels_a_running_retirements_member() -> None:
    """A watcher restarted mid-drain reconciles before its first visibility query: the
    running set is empty, so it tries to start the intent and Temporal refuses (one runs).
    It must not then treat the disqualified member as an orphan and label it (the drain
    would read "label re-added by someone else" and abort): nothing is labelled until the
    running retirement has been read.  Found on the bed (the watcher SIGKILL test)."""
    w = make_world()
    add_md(w, replicas=1)
    add_replicas(w, [0])
    (draining,) = add_replicas(w, [1], eligible=False)  # disqualified by the retirement
    w.temporal.running(request(1), phase=Phase.DRAINING)
    entries = [d for d in map(decode_deployment, w.kube.deployments.values()) if d]
    w.rec.fleet.replace_deployments(entries)
    w.rec.fleet.replace_pods(Pod.from_raw(p) for p in w.kube.pods.values())
    again = await w.rec.reconcile_key((NS, MD))
    assert w.eligible(draining) is None
    assert w.kube.called("patch_pod") == []
    assert again == 0.0  # looked at again at once: now Temporal is asked what runs
    await w.rec.reconcile_key((NS, MD))
    assert w.eligible(draining) is None
    assert [c.name for c in w.temporal.called("query")] == ["state"]


async def test_the_workers_reconcile_only_after_the_first_visibility_query_answered(
    running: Callable[..., Awaitable[Running]],
) -> None:
    """A started (or failed-over) watcher reads which retirements run before it reconciles
    anything: with an empty running set its first reconciles took every running retirement
    for absent (retry annotations ignored and cleared, the intent started again and
    refused).  The first two visibility queries fail here: nothing is reconciled until one
    answers, then the held retirement is read, not started again."""
    w = make_world()
    add_md(w, replicas=1)
    add_replicas(w, [0])
    add_replicas(w, [1], eligible=False)
    w.temporal.running(request(1), outcome=Outcome.ABORTED, phase=Phase.ABORTED)
    w.temporal.fail("list_workflows", rpc_error(), times=2)
    reconciles_at_list: list[float] = []
    w.temporal.on(
        "list_workflows",
        lambda _: reconciles_at_list.append(w.metric("retire_watcher_reconcile_seconds_count")),
    )
    r = await running(w)
    await until(lambda: w.temporal.called("query"), "the held retirement read")
    await until(lambda: r.health.ready, "ready")
    assert reconciles_at_list[:3] == [0, 0, 0]  # two failed queries, then the one answered
    assert w.starts() == []  # never started again behind the held one
    assert w.metric("retire_watcher_starts_refused_total", reason="already-running") == 0


async def test_a_deleted_deployment_leaves_no_pending_series() -> None:
    """The gauges of a deleted deployment go with it (an alert on pending intents would
    otherwise fire for a deployment that no longer exists)."""
    w = make_world()
    add_md(w, replicas=1)
    add_replicas(w, range(3))
    await w.pass_()
    assert w.metric("retire_watcher_intents_pending", deployment=f"{NS}/{MD}") == 1
    w.kube.remove_deployment(MD, namespace=NS)
    await w.pass_()
    assert (
        w.metrics.registry.get_sample_value(
            "retire_watcher_intents_pending", {"deployment": f"{NS}/{MD}"}
        )
        is None
    )


def test_the_cache_keeps_no_container_specs() -> None:
    """A tenant's Pod may carry ~1.5 MB of command line and environment; the watcher reads
    none of it, so its cache keeps none of it (the security review's M2): 200 such Pods
    cost the cache what 200 plain ones do."""
    import tracemalloc

    from watcher.fleet import decode_pod

    def pod(i: int, fat: bool) -> dict[str, Any]:
        c: dict[str, Any] = {"name": "main", "image": "i"}
        if fat:
            c["args"] = ["x" * 1000] * 200
            c["env"] = [{"name": f"E{j}", "value": "y" * 1000} for j in range(200)]
        return {
            "metadata": {"name": f"p{i}", "namespace": "ns", "uid": f"u{i}", "labels": {}},
            "spec": {"containers": [c]},
            "status": {"containerStatuses": [{"name": "main", "containerID": "c"}]},
        }

    def held(fat: bool) -> int:
        """What the views keep once the watch's bodies are gone."""
        import gc
        import json

        wire = [json.dumps(pod(i, fat)) for i in range(200)]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        views = [decode_pod(json.loads(w)) for w in wire]  # each body dropped after decode
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert all(v is not None and v.containers == () for v in views)
        assert all(v is not None and v.engine_started for v in views)  # statuses are kept
        return after - before

    plain, fat = held(False), held(True)
    assert fat < plain + 200 * 1024, (plain, fat)  # not 200 x 400 KB
