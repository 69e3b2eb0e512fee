"""What the watcher exports per deployment, and that a series goes when its cause does:

- ``retire_watcher_retirement_held{deployment}``: 1 for each running retirement whose
  ``RetirementOutcome`` search attribute reads ``Aborted`` in the watcher's visibility
  listing (``watcher.running``), set at each refresh; a retirement that ends, is
  terminated or is retried stops being exported at the next refresh (the series is
  removed, never left at 1; the workflow-side gauge it replaces never cleared on a
  terminate and stayed at 1 on whichever worker had run the last task);
- ``retire_watcher_deployment_failing{deployment}``: 1 while the deployment's last
  reconcile failed (its back-off between attempts included), removed by the first one that
  succeeds, so an alert ``for: 10m`` fires for one broken deployment (a rate of errors
  could not: the back-off keeps it under any useful threshold).

Through the controller (``watcher.controller``) over FakeKube and FakeTemporal, whose
visibility listing carries the outcome search attribute as the workflow upserts it
(``tests/helpers/fake_temporal.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio.client import WorkflowExecutionStatus
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCStatusCode

from retirement.models import workflow_id_for
from retirement.phases import Outcome, Phase
from tests.helpers.fake_temporal import FakeListed, rpc_error
from tests.helpers.running_controller import Running, running, until
from tests.helpers.watcher_world import (
    NS,
    World,
    add_md,
    add_replicas,
    make_world,
    request,
)
from watcher.metrics import WatcherMetrics
from watcher.running import RunningSet, holds
from workflows.mirror import SA_OUTCOME

HELD = "retire_watcher_retirement_held"
FAILING = "retire_watcher_deployment_failing"


def sample(w: World, name: str, deployment: str) -> float | None:
    return w.metrics.registry.get_sample_value(name, {"deployment": deployment})


def held_retirement(w: World, deployment: str) -> str:
    """A deployment of two replicas that wants one, its retirement of ordinal 1 held."""
    add_md(w, deployment, replicas=1)
    add_replicas(w, range(2), deployment=deployment)
    w.temporal.running(
        request(1, deployment=deployment), phase=Phase.ABORTED, outcome=Outcome.ABORTED
    )
    return workflow_id_for(namespace=NS, deployment=deployment)


async def test_a_held_retirement_is_exported_until_it_ends_or_is_terminated_or_retried(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    aa, bb, cc = (held_retirement(w, d) for d in ("aa", "bb", "cc"))
    add_md(w, "dd", replicas=1)
    add_replicas(w, range(2), deployment="dd")
    w.temporal.running(request(1, deployment="dd"), phase=Phase.DRAINING)  # not held
    await running(w)
    await until(lambda: sample(w, HELD, f"{NS}/cc") == 1, "the held retirements exported")
    assert {d: sample(w, HELD, f"{NS}/{d}") for d in ("aa", "bb", "cc", "dd")} == {
        "aa": 1,
        "bb": 1,
        "cc": 1,
        "dd": None,
    }

    w.temporal.close(aa, WorkflowExecutionStatus.TERMINATED)  # terminated: no last write
    await until(lambda: sample(w, HELD, f"{NS}/aa") is None, "a terminated hold dropped")
    w.temporal.close(bb, outcome=Outcome.CAPACITY_RETAINED)  # cancel-intent: it ended
    await until(lambda: sample(w, HELD, f"{NS}/bb") is None, "an ended hold dropped")
    w.temporal.set_state(cc, outcome=Outcome.RUNNING, phase=Phase.WITHDRAWING)  # a retry
    await until(lambda: sample(w, HELD, f"{NS}/cc") is None, "a retried hold dropped")
    w.temporal.set_state(cc, outcome=Outcome.ABORTED, phase=Phase.ABORTED)  # held again
    await until(lambda: sample(w, HELD, f"{NS}/cc") == 1, "held again, exported again")
    assert sample(w, HELD, f"{NS}/aa") is None and sample(w, HELD, f"{NS}/bb") is None


async def test_a_failing_deployment_is_exported_until_its_reconcile_succeeds(
    running: Callable[..., Awaitable[Running]],
) -> None:
    w = make_world()
    for d in ("aa", "bb"):
        add_md(w, d, replicas=1)
        add_replicas(w, range(1), deployment=d)
    add_md(w, "broken", replicas=0)
    add_replicas(w, [0], deployment="broken")
    w.temporal.fail("start_workflow", rpc_error(RPCStatusCode.PERMISSION_DENIED), times=10**6)
    ctl = (await running(w)).controller
    ctl.queue.base_delay_s = 0.02
    await until(lambda: len(w.temporal.called("start_workflow")) >= 3, "tried three times")
    # Between attempts (its back-off) as at each: 1, and only for the broken deployment.
    assert sample(w, FAILING, f"{NS}/broken") == 1
    assert sample(w, FAILING, f"{NS}/aa") is None and sample(w, FAILING, f"{NS}/bb") is None
    w.temporal._failures.clear()
    await until(lambda: sample(w, FAILING, f"{NS}/broken") is None, "the series removed")


def test_the_visibility_listing_says_which_running_retirements_hold() -> None:
    def listed(wid: str, outcome: Outcome | None) -> FakeListed:
        pairs = [] if outcome is None else [SearchAttributePair(SA_OUTCOME, outcome.value)]
        return FakeListed(wid, "r", TypedSearchAttributes(pairs))

    assert holds(listed("retirement/a/b", Outcome.ABORTED))
    assert not holds(listed("retirement/a/b", Outcome.RUNNING))
    assert not holds(listed("retirement/a/b", None))  # never upserted: not held
    assert not holds(object())  # an entry without search attributes
    running = RunningSet(namespaces=frozenset({"a"}))
    running.replace(
        ["retirement/a/x", "retirement/a/y", "retirement/b/z"],
        held=["retirement/a/x", "retirement/b/z", "retirement/a/gone"],
    )
    assert running.held == {("a", "x")}  # in scope, and listed as running
    running.not_running(("a", "x"))
    assert running.held == set()


def test_held_and_failing_series_are_removed_not_left_at_a_value() -> None:
    m = WatcherMetrics()
    m.show_held(["a/x", "a/y"])
    m.show_held(["a/y"])
    assert m.registry.get_sample_value(HELD, {"deployment": "a/x"}) is None
    assert m.registry.get_sample_value(HELD, {"deployment": "a/y"}) == 1
    m.show_held([])
    assert m.registry.get_sample_value(HELD, {"deployment": "a/y"}) is None
    m.reconciled("a/x", failed=False)  # never failed: nothing to remove
    m.reconciled("a/x", failed=True)
    m.reconciled("a/x", failed=True)
    assert m.registry.get_sample_value(FAILING, {"deployment": "a/x"}) == 1
    m.reconciled("a/x", failed=False)
    assert m.registry.get_sample_value(FAILING, {"deployment": "a/x"}) is None


__all__ = ["running"]  # the fixture, shared
