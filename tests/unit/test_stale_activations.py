"""``worker.stale_activations``: which activations are refused, on constructed activations
(the race itself runs on the dev server: tests/workflows/test_stale_activation_on_dev_server.py)."""

from __future__ import annotations

from typing import Any

from temporalio.bridge.proto.workflow_activation import (
    FireTimer,
    QueryWorkflow,
    RemoveFromCache,
    WorkflowActivation,
    WorkflowActivationJob,
)
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion

from worker.stale_activations import (
    REFUSED,
    Seen,
    _GuardedInstance,
    is_stale,
    refusal,
    seen_of,
)

T0 = 1_796_431_631_114_288_410


def activation(
    *, ts: int | None, length: int, replaying: bool = False, jobs: tuple[str, ...] = ("timer",)
) -> WorkflowActivation:
    act = WorkflowActivation(run_id="run", history_length=length, is_replaying=replaying)
    if ts is not None:
        act.timestamp.FromNanoseconds(ts)
    for kind in jobs:
        job = {
            "timer": WorkflowActivationJob(fire_timer=FireTimer(seq=1)),
            "query": WorkflowActivationJob(query_workflow=QueryWorkflow(query_id="q")),
            "evict": WorkflowActivationJob(remove_from_cache=RemoveFromCache(message="m")),
        }[kind]
        act.jobs.append(job)
    return act


LAST = Seen(timestamp_ns=T0, history_length=3)


def test_new_events_on_the_same_clock_are_stale() -> None:
    # What the race brings: history grew from 3 to 7 events, the clock stayed at T0.
    assert is_stale(LAST, activation(ts=T0, length=7))


def test_new_events_on_an_earlier_clock_are_stale() -> None:
    assert is_stale(LAST, activation(ts=T0 - 1, length=7))


def test_a_real_task_brings_a_later_clock() -> None:
    assert not is_stale(LAST, activation(ts=T0 + 1, length=7))


def test_a_later_clock_with_no_new_events_is_not_stale() -> None:
    assert not is_stale(LAST, activation(ts=T0 + 1, length=3))


def test_a_known_miss_after_a_discarded_update_task_is_left_alone() -> None:
    # Core keeps the discarded speculative task's clock but lowers the history length by
    # its two events: one new event then looks like none (see the module's docstring).
    after_update = Seen(timestamp_ns=T0, history_length=9)
    assert not is_stale(after_update, activation(ts=T0, length=9))


def test_no_new_events_is_not_stale() -> None:
    # Another activation of the same task (e.g. after a local activity resolved).
    assert not is_stale(LAST, activation(ts=T0, length=3))


def test_replays_queries_and_evictions_are_never_refused() -> None:
    assert not is_stale(LAST, activation(ts=T0, length=7, replaying=True))
    assert not is_stale(LAST, activation(ts=T0, length=7, jobs=("query",)))
    assert not is_stale(LAST, activation(ts=T0, length=7, jobs=("evict",)))
    assert is_stale(LAST, activation(ts=T0, length=7, jobs=("query", "timer")))


def test_the_first_activation_and_one_without_a_clock_are_not_judged() -> None:
    assert not is_stale(None, activation(ts=T0, length=7))
    assert not is_stale(LAST, activation(ts=None, length=7))
    assert seen_of(activation(ts=None, length=7)) is None


def test_the_refusal_is_a_failed_completion_of_the_run() -> None:
    c = refusal(activation(ts=T0, length=7))
    assert c.run_id == "run" and c.failed.failure.message == REFUSED


class _Recording:
    """An inner instance that records what it was given."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        self.seen.append(act.history_length)
        return WorkflowActivationCompletion(run_id=act.run_id)

    def get_info(self) -> Any:
        class Info:
            workflow_id = "wf"

        return Info()


def test_the_guarded_instance_refuses_without_running_the_workflow() -> None:
    inner = _Recording()
    guarded = _GuardedInstance(inner)  # type: ignore[arg-type]
    guarded.activate(activation(ts=T0, length=3, replaying=True, jobs=("timer",)))
    # A query's activation that ran ahead does not move the guard's clock on ...
    guarded.activate(activation(ts=T0, length=7, jobs=("query",)))
    # ... so the stale activation after it is still refused, and never reaches the workflow.
    refused = guarded.activate(activation(ts=T0, length=7))
    assert refused.failed.failure.message == REFUSED
    ok = guarded.activate(activation(ts=T0 + 5, length=10))
    assert not ok.HasField("failed")
    assert inner.seen == [3, 7, 10]
