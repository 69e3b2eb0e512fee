"""The pause after a busy poll waits in the member's container for its engine to go idle
(``activities.idle_wait``, issue 18 item 4): the next read follows as soon as the count
reads 0; the wait is never evidence; a wait that cannot be made, or ends on anything but
idle, leaves the plain spacing in place."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import RetirementActivities, polling
from activities.fairslots import FairSlots, WorkerSlots
from activities.oneshot import EXEC_TIMEOUT_S, WAIT_SCRIPT
from activities.sampling import WAIT_OUTPUT_CAP
from kube.api import ExecResult
from retirement.models import Observation, PhaseInput, RouterlessPolicy, Target
from retirement.phases import Verdict
from tests.helpers.activity_env import recording_env
from tests.helpers.admission import admitted, sibling, victim
from tests.helpers.fake_kube import FakeKube, oneshot_stdout

FLAG = ["--enable-server-load-tracking"]


class Engine:
    """Answers the member's execs in order: each entry is a read (the front end's count at
    both reads of an ``exact2`` exec, gauges idle) or a wait's printed line."""

    def __init__(self, *answers: int | str | ExecResult) -> None:
        self.answers = list(answers)
        self.seen: list[str] = []  # "read" or "wait", in order

    def __call__(self, argv: list[str]) -> ExecResult:
        kind = "wait" if argv[2] == WAIT_SCRIPT else "read"
        self.seen.append(kind)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, ExecResult):
            return answer
        if kind == "wait":
            assert isinstance(answer, str), f"a wait where a read was scripted: {answer!r}"
            return ExecResult(stdout=answer + "\n", exit_code=0)
        assert isinstance(answer, int), f"a read where a wait was scripted: {answer!r}"
        n = {"exact": 1, "exact2": 2}[argv[6]]
        out = "".join(oneshot_stdout(counters=(5, 7), exact=answer) for _ in range(n))
        return ExecResult(stdout=out, exit_code=0)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The plain waits asked for, recorded instead of slept; the planned spacing alone
    (no back-pressure stretch from a slow poll on a loaded machine)."""
    asked: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _details: asked.append(s))
    monkeypatch.setattr(polling, "backpressure", lambda wait_s, _took_s: wait_s)
    return asked


def drain(kube: FakeKube, target: Target, slots: WorkerSlots | None = None) -> Observation:
    inp = PhaseInput(
        target=target, deadline=datetime.now(UTC) + timedelta(seconds=240), poll_interval_s=1.0
    )
    obs: Observation = recording_env([]).run(RetirementActivities(kube, slots=slots).drain, inp)
    return obs


def withdraw(
    kube: FakeKube,
    target: Target,
    *,
    interval: float = 1.0,
    window: float = 0.0,
    slots: WorkerSlots | None = None,
) -> Observation:
    """The withdrawal activity of a router-less replica under the quiet-window policy (a
    zero window, or no wait slot free: the window is read at its ends, each end an exec;
    ``tests/offline/test_quiet_in_one_exec.py`` keeps it in one)."""
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=240),
        poll_interval_s=interval,
        routerless_policy=RouterlessPolicy.QUIET_WINDOW,
        quiet_window_s=window,
    )
    obs: Observation = recording_env([]).run(RetirementActivities(kube, slots=slots).withdraw, inp)
    return obs


def waits_of(kube: FakeKube) -> list[Any]:
    return [c.args for c in kube.called("exec_pod") if c.args["argv"][2] == WAIT_SCRIPT]


def test_after_a_busy_round_the_drain_waits_in_the_container_and_reads_at_once(
    sleeps: list[float],
) -> None:
    kube, target = admitted(victim(args=FLAG))
    engine = Engine(5, "#idle\t0.750", 0)
    kube.script_exec("llm-1", engine)
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2
    assert engine.seen == ["read", "wait", "read"]
    assert sleeps == []  # the next round followed the wait at once
    [wait] = waits_of(kube)
    assert wait["argv"][3:] == [str(target.members[0].metrics_port), "http", "2.000"]
    assert wait["timeout_s"] == 2.0 + EXEC_TIMEOUT_S
    assert wait["output_cap"] == WAIT_OUTPUT_CAP


def test_a_wait_that_saw_idle_is_no_evidence(sleeps: list[float]) -> None:
    """The wait read 0, the read after it a request again (one arrived in between): the
    drain goes on, and verifies only on two idle reads of its own.  The pause after that
    disagreement is plain (a count that keeps disagreeing with the reads must not turn
    into a read and a wait back to back, for ever); waiting resumes after it."""
    kube, target = admitted(victim(args=FLAG))
    engine = Engine(5, "#idle\t0.100", 3, 4, "#idle\t0.100", 0)
    kube.script_exec("llm-1", engine)
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 4
    assert engine.seen == ["read", "wait", "read", "read", "wait", "read"]
    assert sleeps == [4.0]
    assert [w["argv"][5] for w in waits_of(kube)] == ["2.000", "8.000"]  # spacing grows


def test_a_count_that_keeps_disagreeing_costs_no_more_than_one_wait_per_plain_spacing(
    sleeps: list[float],
) -> None:
    """The count reads 0 at once, every time, while the gauges stay busy."""
    kube, target = admitted(victim(args=FLAG))
    gauges = oneshot_stdout(in_flight=5, counters=(5, 7), exact=0)
    busy = ExecResult(stdout=gauges * 2, exit_code=0)
    answers: list[int | str | ExecResult] = [busy]
    for _ in range(4):  # a wait that reads 0 at once, a busy read, a plain pause, a read
        answers += ["#idle\t0.000", busy, busy]
    engine = Engine(*answers, "#idle\t0.000", 0)
    kube.script_exec("llm-1", engine)
    assert drain(kube, target).verdict is Verdict.VERIFIED
    assert engine.seen == ["read"] + ["wait", "read", "read"] * 4 + ["wait", "read"]
    assert len(sleeps) == 4, sleeps


@pytest.mark.parametrize(
    "ending",
    [
        "#busy\t4",
        "#error\tGET /load answered no count",
        "",
        ExecResult(error="exec failed: ApiException"),
        ExecResult(stdout="#idle\t0.1\n", exit_code=1),
        "#idle\t0.1\nmore",
    ],
)
def test_a_wait_that_ends_on_anything_but_idle_leaves_the_plain_spacing(
    sleeps: list[float], ending: str | ExecResult
) -> None:
    """What is left of the planned wait is still waited (a wait that fails at once never
    turns into a tight loop of execs)."""
    kube, target = admitted(victim(args=FLAG))
    kube.script_exec("llm-1", Engine(5, ending, 0))
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert len(sleeps) == 1 and 1.5 < sleeps[0] <= 2.0, sleeps


def test_no_free_wait_slot_is_a_plain_wait(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG))
    engine = Engine(5, 0)
    kube.script_exec("llm-1", engine)
    waits = FairSlots(1)
    assert waits.acquire(0.0, "someone-else")
    slots = WorkerSlots(execs=FairSlots(4), polls=FairSlots(4), waits=waits)
    obs = drain(kube, target, slots)
    assert obs.verdict is Verdict.VERIFIED
    assert engine.seen == ["read", "read"] and sleeps == [2.0]


def test_a_member_without_the_count_is_never_waited_on(sleeps: list[float]) -> None:
    kube, target = admitted()
    busy = ExecResult(stdout=oneshot_stdout(in_flight=5, counters=(5, 7)), exit_code=0)
    idle = ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0)
    kube.script_exec("llm-1", busy, idle)
    assert drain(kube, target).verdict is Verdict.VERIFIED
    assert waits_of(kube) == [] and sleeps[0] == 2.0


def test_a_nearly_idle_member_is_waited_on_too(sleeps: list[float]) -> None:
    """One request left: without the count the next read would come after one poll
    interval (it may end at any moment); the wait ends when it does, so it may be long."""
    kube, target = admitted(victim(args=FLAG))
    engine = Engine(1, "#busy\t1", 1, "#idle\t3.000", 0)
    kube.script_exec("llm-1", engine)
    assert drain(kube, target).verdict is Verdict.VERIFIED
    assert engine.seen == ["read", "wait", "read", "wait", "read"]
    assert [w["argv"][5] for w in waits_of(kube)] == ["2.000", "4.000"]
    # The scripted "#busy" came at once (a real one only after its 2 s): the rest of the
    # 1 s poll interval was waited after it; nothing after the wait that ended idle.
    assert len(sleeps) == 1 and sleeps[0] <= 1.0


def test_the_router_less_quiet_window_waits_for_a_member_holding_requests(
    sleeps: list[float],
) -> None:
    """The quiet window never starts while the front end holds a request; between polls
    it waits in the container, for longer each time the member is still busy."""
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(2, "#busy\t2", 2, "#idle\t1.200", 0, 0)
    kube.script_exec("llm-1", engine)
    obs = withdraw(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert engine.seen == ["read", "wait", "read", "wait", "read", "read"]
    assert [w["argv"][5] for w in waits_of(kube)] == ["2.000", "4.000"]


def test_the_quiet_window_pauses_plain_after_a_wait_the_read_disagreed_with(
    sleeps: list[float],
) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(2, "#idle\t0.000", 2, 2, "#idle\t0.000", 0, 0)
    kube.script_exec("llm-1", engine)
    obs = withdraw(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert engine.seen == ["read", "wait", "read", "read", "wait", "read", "read"]


def test_a_running_quiet_window_of_exact_members_is_read_again_when_it_can_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Counters are monotonic and the count exact: a read when the window can end proves
    what a read each poll interval would, so none is made in between (a default 10 s
    window cost ten reads; on a fleet that goes idle at once, each one an exec in the
    herd).  Real waits here, short: a 0.6 s window and a 0.1 s poll interval."""
    slept: list[float] = []

    def sleep(seconds: float, _details: Any) -> None:
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(polling, "wait_heartbeating", sleep)
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(0)
    kube.script_exec("llm-1", engine)
    # No wait slot free: the window is read at its ends.
    slots = WorkerSlots(execs=FairSlots(4), polls=FairSlots(4), waits=FairSlots(1))
    assert slots.waits.acquire(0.0, "other")
    obs = withdraw(kube, target, interval=0.1, window=0.6, slots=slots)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert engine.seen == ["read", "read"], engine.seen
    assert len(slept) == 1 and 0.5 < slept[0] <= 0.6, slept
