"""The router-less quiet window of a member with the exact count, kept in one exec
(``activities.withdrawal.WithdrawPolls._window_in_one``, issue 18 item 4): one exec waits
for the count to read 0 and keeps the whole window; its poll slot is lent meanwhile; the
verdict rests on router Pods and Services listed after it; where one exec cannot keep it,
the window is read at its two ends as before."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from activities import RetirementActivities, polling
from activities.fairslots import FairSlots, WorkerSlots
from activities.oneshot import EXEC_TIMEOUT_S, MAX_WAIT_S, WAIT_SCRIPT
from activities.withdrawal import AFTER_EXEC_S
from kube.api import ExecResult
from retirement.models import Observation, PhaseInput, RouterlessPolicy, Target
from retirement.names import LABEL_ROUTER
from retirement.phases import Verdict
from tests.helpers.activity_env import recording_env
from tests.helpers.admission import MD, admitted, sibling, victim
from tests.helpers.fake_kube import FakeKube, member_pod, oneshot_stdout

FLAG = ["--enable-server-load-tracking"]
#: The least budget a 2 s window is kept in one exec with, and a little more.
ENOUGH = 2.0 + EXEC_TIMEOUT_S + AFTER_EXEC_S + 0.3


def window(*, load: tuple[int, int] = (0, 0), moved: bool = False, apart: float = 2.0) -> str:
    """What the ``quiet`` one-shot prints for a whole window: its count at both reads, the
    counters moved between them or not, the reads ``apart`` seconds apart."""
    first = oneshot_stdout(counters=(5, 7), exact=load[0])
    second = oneshot_stdout(counters=(6 if moved else 5, 7), exact=load[1])
    return f"#waited\t0.100\n{first}#apart\t{apart:.3f}\n{second}"


class Engine:
    """Answers the member's ``quiet`` execs in order (the last repeats) with their printed
    output, or an int for a plain read's count; a read of a window's ends answers the
    count ``reads``, a wait for idle ends busy while that is above 0.  Records each exec's
    kind and argv."""

    def __init__(self, *answers: str | int | ExecResult, reads: int = 0) -> None:
        self.answers = list(answers)
        self.reads = reads
        self.seen: list[str] = []
        self.argv: list[list[str]] = []
        self.during: list[Any] = []  # what ``probe`` saw during each exec
        self.probe: Any = None

    def __call__(self, argv: list[str]) -> ExecResult:
        kind = "wait" if argv[2] == WAIT_SCRIPT else argv[6]
        self.seen.append(kind)
        self.argv.append(argv)
        if self.probe is not None:
            self.during.append(self.probe())
        if kind == "wait":
            said = f"#busy\t{self.reads}" if self.reads else "#idle\t0.000"
            return ExecResult(stdout=said + "\n", exit_code=0)
        if kind != "quiet":
            n = 2 if kind == "exact2" else 1
            out = oneshot_stdout(counters=(5, 7), exact=self.reads) * n
            return ExecResult(stdout=out, exit_code=0)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, ExecResult):
            return answer
        assert isinstance(answer, str), answer
        return ExecResult(stdout=answer, exit_code=0)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The plain waits asked for (with their back-pressure stretch), recorded, not slept."""
    asked: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _details: asked.append(s))
    return asked


def withdraw(
    kube: FakeKube,
    target: Target,
    *,
    window_s: float = 2.0,
    seconds: float = 30.0,
    slots: WorkerSlots | None = None,
    beats: list[Any] | None = None,
) -> Observation:
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=1.0,
        routerless_policy=RouterlessPolicy.QUIET_WINDOW,
        quiet_window_s=window_s,
    )
    env = recording_env([] if beats is None else beats)
    obs: Observation = env.run(RetirementActivities(kube, slots=slots).withdraw, inp)
    return obs


def test_one_exec_keeps_the_whole_window(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(window())
    kube.script_exec("llm-1", engine)
    obs = withdraw(kube, target, window_s=2.0, seconds=30.0)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert obs.polls == 1 and engine.seen == ["quiet"] and sleeps == []
    [call] = kube.called("exec_pod")
    wait_s, window_s = float(call.args["argv"][7]), float(call.args["argv"][8])
    # It may wait for what the budget leaves after the window, an exec's bound and what
    # follows the exec.
    most = 30.0 - 2.0 - EXEC_TIMEOUT_S - AFTER_EXEC_S
    assert window_s == 2.0 and most - 1.0 < wait_s <= most
    assert call.args["timeout_s"] == pytest.approx(wait_s + window_s + EXEC_TIMEOUT_S)
    assert obs.readings["routers"] == "router-less: counters quiet for 2 s"


def test_the_wait_is_bounded_by_what_one_exec_may_wait(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(window())
    kube.script_exec("llm-1", engine)
    assert withdraw(kube, target, seconds=200.0).verdict is Verdict.VERIFIED
    assert float(engine.argv[0][7]) == MAX_WAIT_S


@pytest.mark.parametrize(
    "first", ["#busy\t3\n", window(load=(0, 1)), window(moved=True), window(apart=1.5)]
)
def test_a_window_that_did_not_hold_is_kept_again_by_the_next_poll(
    sleeps: list[float], first: str
) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(first, window())
    kube.script_exec("llm-1", engine)
    obs = withdraw(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2
    assert engine.seen == ["quiet", "quiet"]
    # Not strained: the next poll comes at the plain spacing, the exec's own time (its
    # wait and window, a lent slot) not counted as load.
    assert len(sleeps) == 1 and sleeps[0] <= 1.0


@pytest.mark.parametrize(
    ("first", "why"),
    [
        ("#busy\t3\n", "holds 3 request(s)"),
        (window(moved=True), "counters moved"),
        (ExecResult(stdout="", exit_code=None, error="exec timed out"), "exec timed out"),
        (window(load=(0, 1)), "holds 1 request(s)"),
        (window(apart=1.5), "read 1.5 s apart, under the 2 s window"),
        (window().replace("#apart", "#apart\t#"), "malformed"),
    ],
)
def test_what_a_window_that_did_not_hold_says(
    sleeps: list[float], first: str | ExecResult, why: str
) -> None:
    """The first poll's reading (the second keeps a window)."""
    kube, target = admitted(victim(args=FLAG), sibling())
    kube.script_exec("llm-1", Engine(first, window()))
    beats: list[Any] = []
    assert withdraw(kube, target, beats=beats).verdict is Verdict.VERIFIED
    assert beats[0].last.verdict is Verdict.UNKNOWN
    assert why in beats[0].last.readings["routers"], beats[0]


def test_a_window_that_could_not_be_read_backs_off_and_reads_the_ends_after(
    sleeps: list[float],
) -> None:
    """The long exec may be what fails (a proxy dropping quiet streams): the rest of the
    attempt reads the window's ends, each a short exec."""
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(ExecResult(stdout="", exit_code=None, error="exec timed out"))
    kube.script_exec("llm-1", engine)
    assert withdraw(kube, target, window_s=0.01).verdict is Verdict.VERIFIED
    assert engine.seen[0] == "quiet" and set(engine.seen[1:]) == {"exact"}, engine.seen
    assert sleeps[0] == 2.0  # doubled from 1 s


def test_the_time_the_slot_was_lent_is_no_sign_of_load(
    monkeypatch: pytest.MonkeyPatch, sleeps: list[float]
) -> None:
    """A poll that took long is followed by a wait as long (back-pressure), but a window's
    exec is a deliberate wait: after one that took 1.5 s and did not hold, the next poll
    follows at the plain spacing (1 s), not 1.5 s later."""
    monkeypatch.setattr(polling, "backpressure", polling.backpressure)  # the real one
    kube, target = admitted(victim(args=FLAG), sibling())
    answers = iter([window(moved=True), window()])

    def slow(argv: list[str]) -> ExecResult:
        time.sleep(1.5)
        return ExecResult(stdout=next(answers), exit_code=0)

    kube.script_exec("llm-1", slow)
    assert withdraw(kube, target).verdict is Verdict.VERIFIED
    assert len(sleeps) == 1 and sleeps[0] <= 1.0, sleeps


def test_a_member_replaced_during_the_window_reads_unknown_and_keeps_the_slot_bound(
    sleeps: list[float],
) -> None:
    """The identity read after the exec finds another Pod: UNKNOWN, never a crash; the poll
    slot was taken back before the lists that follow (they run inside the bound)."""
    kube, target = admitted(victim(args=FLAG), sibling())
    slots = WorkerSlots(execs=FairSlots(4), polls=FairSlots(1), waits=FairSlots(4))
    held_at_lists: list[dict[str, int]] = []
    list_services = kube.list_services

    def probed(**kw: Any) -> Any:
        held_at_lists.append(slots.polls.holding())
        return list_services(**kw)

    kube.list_services = probed  # type: ignore[method-assign]

    def replaced(argv: list[str]) -> ExecResult:
        kube.remove_pod("llm-1")
        kube.add_pod(victim(args=FLAG, uid="uid-other"))
        return ExecResult(stdout=window(), exit_code=0)

    kube.script_exec("llm-1", replaced)
    beats: list[Any] = []
    obs = withdraw(kube, target, seconds=ENOUGH, slots=slots, beats=beats)
    assert obs.verdict is Verdict.UNKNOWN
    assert beats[0].last.readings["routers"].startswith("router-less: member "), beats[0]
    assert held_at_lists[0] == {"default": 1}, held_at_lists


def test_a_container_that_restarted_meanwhile_reads_unknown(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())

    def restarted(argv: list[str]) -> ExecResult:
        kube.edit_pod(
            "llm-1",
            lambda p: p["status"]["containerStatuses"][0].update(restartCount=1),
        )
        return ExecResult(stdout=window(), exit_code=0)

    kube.script_exec("llm-1", restarted)
    beats: list[Any] = []
    obs = withdraw(kube, target, seconds=ENOUGH, beats=beats)
    assert obs.verdict is Verdict.UNKNOWN
    assert "container main changed during the read" in beats[0].last.readings["routers"]


def test_a_member_gone_is_no_crash(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    kube.remove_pod("llm-1")
    obs = withdraw(kube, target, seconds=ENOUGH)
    assert obs.verdict is not Verdict.VERIFIED
    assert kube.called("exec_pod") == []


def test_a_router_pod_that_appeared_during_the_window_is_not_overlooked(
    sleeps: list[float],
) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())

    def then_a_router(argv: list[str]) -> ExecResult:
        body = member_pod("router-0", deployment=MD, uid="uid-r", ip="198.18.1.50")
        body["metadata"]["labels"][LABEL_ROUTER] = "sglang"
        kube.add_pod(body)
        return ExecResult(stdout=window(), exit_code=0)

    kube.script_exec("llm-1", then_a_router)
    beats: list[Any] = []
    obs = withdraw(kube, target, seconds=ENOUGH, beats=beats)
    assert obs.verdict is Verdict.UNKNOWN
    assert beats[0].last.readings["routers"] == "a router Pod appeared in the window"


def test_the_poll_slot_is_lent_during_the_window(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    slots = WorkerSlots(execs=FairSlots(4), polls=FairSlots(1), waits=FairSlots(4))
    engine = Engine(window())

    def another_poll() -> bool:  # gets the one slot during the exec, and gives it back
        got = slots.polls.acquire(0.0, "other")
        if got:
            slots.polls.release("other")
        return got

    engine.probe = another_poll
    kube.script_exec("llm-1", engine)
    obs = withdraw(kube, target, slots=slots)
    assert obs.verdict is Verdict.VERIFIED and engine.during == [True]
    assert slots.polls.acquire(0.0, "x")  # taken back after the window, released at the end


def test_no_free_wait_slot_reads_the_window_at_its_ends(sleeps: list[float]) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    slots = WorkerSlots(execs=FairSlots(4), polls=FairSlots(4), waits=FairSlots(1))
    assert slots.waits.acquire(0.0, "other")
    engine = Engine(window())
    kube.script_exec("llm-1", engine)
    obs = withdraw(kube, target, window_s=0.01, slots=slots)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert len(engine.seen) >= 2 and set(engine.seen) == {"exact"}


@pytest.mark.parametrize("seconds", [2.0 + EXEC_TIMEOUT_S - 1.0])
def test_too_little_budget_for_a_window_reads_it_at_its_ends(
    sleeps: list[float], seconds: float
) -> None:
    kube, target = admitted(victim(args=FLAG), sibling())
    engine = Engine(window())
    kube.script_exec("llm-1", engine)
    withdraw(kube, target, seconds=seconds)
    assert engine.seen and set(engine.seen) == {"exact"}


def test_a_member_without_the_exact_count_reads_the_window_at_its_ends(
    sleeps: list[float],
) -> None:
    kube, target = admitted(victim(), sibling())
    kube.script_exec("llm-1", ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0))
    withdraw(kube, target, window_s=0.01)
    modes = {c.args["argv"][6] for c in kube.called("exec_pod")}
    assert modes == {"plain"}
