"""``drain`` under ``ActivityEnvironment`` against the fake Kubernetes layer, whose
``exec_pod`` answers what the in-container one-shot would print: two consecutive idle
reads with unchanged counters VERIFY, anything else holds (UNKNOWN) until the deadline, a
replaced or gone member FAILS; each poll heartbeats the drain rule's progress, and a
retried attempt resumes from the last heartbeat."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import httpx
import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from activities import RetirementActivities, polling
from activities import drain as drain_module
from activities.metrics import drain_exec_reads
from activities.oneshot import EXEC_TIMEOUT_S, SCRIPT
from activities.sampling import OUTPUT_CAP
from kube.api import ExecResult
from kube.errors import Forbidden, Unavailable
from kube.objects import Pod
from retirement.drain import DrainProgress, observe_round, resume
from retirement.models import (
    DrainHeartbeat,
    Observation,
    PhaseInput,
    Target,
)
from retirement.names import LABEL_ELIGIBLE, LABEL_ROUTER
from retirement.phases import Verdict
from retirement.readings import SERIES, SGLANG_STEP_COUNTER, Sample, series_for
from tests.helpers.activity_env import recording_env
from tests.helpers.admission import admitted, victim
from tests.helpers.fake_kube import FakeKube, member_pod, oneshot_stdout

NS = "default"
MD = "llm"
IDLE = ExecResult(stdout=oneshot_stdout(counters=(5, 7)), exit_code=0)


def busy(n: float, counters: tuple[float, float] = (5, 7)) -> ExecResult:
    return ExecResult(stdout=oneshot_stdout(in_flight=n, counters=counters), exit_code=0)


def idle(counters: tuple[float, float]) -> ExecResult:
    return ExecResult(stdout=oneshot_stdout(counters=counters), exit_code=0)


single = victim


def drain(
    kube: FakeKube,
    target: Target,
    *,
    seconds: float = 5.0,
    heartbeats: list[Any] | None = None,
    on_beat: Callable[[int], None] | None = None,
    resume: list[Any] | None = None,
    interval: float = 0.01,
    queued_s: float = 0.0,
) -> Observation:
    """Run the drain activity (by default with a 10 ms poll interval) until ``seconds``
    from now; ``heartbeats`` gets each round's heartbeat, and ``on_beat`` is called with
    the number of rounds heartbeated so far.  ``queued_s``: how long the attempt waited in
    the task queue before it started (scheduled to started, as the server stamps them)."""
    beats: list[Any] = [] if heartbeats is None else heartbeats
    env = recording_env(beats, on_beat=on_beat, resume=resume)
    if queued_s:
        started = datetime.now(UTC)
        env.info = replace(
            env.info,
            current_attempt_scheduled_time=started - timedelta(seconds=queued_s),
            started_time=started,
        )
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=interval,
    )
    obs: Observation = env.run(RetirementActivities(kube).drain, inp)
    return obs


def as_the_worker_would_decode(details: Any) -> Any:
    """A heartbeat detail as a retried attempt sees it: through the project's data
    converter and back, with no type hint (a plain JSON value)."""
    converter = pydantic_data_converter.payload_converter
    [decoded] = converter.from_payloads(converter.to_payloads([details]))
    return decoded


#: What a drain may call: the reads and execs, and the withdrawal's read-only re-check.
READS = {
    "read_pod",
    "exec_pod",
    "list_services",
    "list_endpoint_slices",
    "list_namespace_endpoint_slices",
    "list_pods",
}


def assert_no_writes(kube: FakeKube) -> None:
    methods = {c.method for c in kube.calls}
    assert methods <= READS, methods


# ---------------------------------------------------------------- VERIFIED


def test_two_idle_reads_with_unchanged_counters_verify() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 2
    assert obs.reason == "idle on two consecutive complete reads, counters unchanged"
    assert obs.readings == {"llm-1": "in_flight=0 counters=5,7"}
    assert [type(b) for b in beats] == [DrainHeartbeat, DrainHeartbeat]
    assert [b.progress.rounds for b in beats] == [1, 2]
    assert beats[0].progress.previous_idle["llm-1"].counters == (5.0, 7.0)
    assert_no_writes(kube)


def test_the_exec_runs_the_fixed_oneshot_in_main_bounded() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    drain(kube, target)
    call = kube.called("exec_pod")[0]
    assert call.args["argv"] == [
        "python3",
        "-ISc",
        SCRIPT,
        "8000",
        "http",
        "/metrics",
        "plain",
        *SERIES["vLLM"].all,
    ]
    assert call.args["container"] == "main"
    assert call.args["timeout_s"] == EXEC_TIMEOUT_S
    assert call.args["output_cap"] == OUTPUT_CAP


def test_an_sglang_member_is_read_with_the_sglang_series() -> None:
    kube, target = admitted(engine="SGLang")
    out = oneshot_stdout("SGLang", version=target.engine_version, counters=(3, 4, 9))
    kube.script_exec("llm-1", ExecResult(stdout=out))
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    series = series_for("SGLang", target.engine_version)
    assert series is not None and SGLANG_STEP_COUNTER in series.counters
    assert kube.called("exec_pod")[0].args["argv"][7:] == list(series.all)


def test_a_busy_member_holds_until_it_is_idle_twice() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", busy(3), busy(1), IDLE)
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 4
    assert [b.readings["llm-1"] for b in beats[:2]] == [
        "in_flight=3 counters=5,7",
        "in_flight=1 counters=5,7",
    ]


def test_counters_that_move_between_idle_reads_hold() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle((5, 7)), idle((6, 9)), idle((6, 9)))
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 3
    assert beats[1].progress.rounds == 2  # the second read was idle but counters moved


def test_a_leader_served_group_reads_only_its_leader() -> None:
    pods = [
        member_pod("llm-1-0", deployment=MD, ordinal=1, member=0, uid="a", ip="198.18.1.20"),
        member_pod("llm-1-1", deployment=MD, ordinal=1, member=1, uid="b", ip="198.18.1.21"),
    ]
    kube, target = admitted(*pods, size=2)
    kube.script_exec("llm-1-0", IDLE)
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert {c.args["name"] for c in kube.called("exec_pod")} == {"llm-1-0"}


def test_an_external_dp_group_needs_every_rank_idle() -> None:
    pods = [
        member_pod("llm-1-0", deployment=MD, ordinal=1, member=0, uid="a", ip="198.18.1.20"),
        member_pod("llm-1-1", deployment=MD, ordinal=1, member=1, uid="b", ip="198.18.1.21"),
    ]
    kube, target = admitted(*pods, size=2, extra_args=["--data-parallel-external-lb"])
    assert target.measured == ("llm-1-0", "llm-1-1")
    kube.script_exec("llm-1-0", IDLE)
    kube.script_exec("llm-1-1", busy(1))
    obs = drain(kube, target, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == "llm-1-1: 1 in flight"


# ---------------------------------------------------------------- UNKNOWN


def test_a_member_still_busy_at_the_deadline_reads_unknown() -> None:
    # A 1 s budget: with 0.1 s, one poll on a loaded CI machine once took it all (polls=1).
    kube, target = admitted()
    kube.script_exec("llm-1", busy(2))
    started = time.monotonic()
    obs = drain(kube, target, seconds=1.0)
    assert time.monotonic() - started < 5
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == "llm-1: 2 in flight"
    assert obs.polls >= 2


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ExecResult(error="exec failed: ApiException"), "exec failed: ApiException"),
        (ExecResult(error="exec timed out after 5 s"), "exec timed out after 5 s"),
        (ExecResult(stdout=oneshot_stdout(), exit_code=1), "one-shot exited 1"),
        (ExecResult(stdout="#error\tGET failed: URLError\n"), "read failed: GET failed: URLError"),
        (
            ExecResult(stdout=oneshot_stdout().replace("\t0.0\n", "\tnan\n", 1)),
            "series vllm:num_requests_running has an invalid value 'nan'",
        ),
        (
            ExecResult(stdout=oneshot_stdout().replace("#end\n", "")),
            "output incomplete (no #end)",
        ),
        (ExecResult(stdout="x" * (OUTPUT_CAP + 1)), "exec output over its cap"),
    ],
    ids=["exec-error", "exec-timeout", "exit-code", "oneshot-error", "nan", "no-end", "huge"],
)
def test_a_read_that_is_not_complete_is_never_idle(answer: ExecResult, reason: str) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", answer)
    obs = drain(kube, target, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings == {"llm-1": f"UNKNOWN: {reason}"}
    assert_no_writes(kube)


def test_a_restarted_container_reads_unknown_without_an_exec() -> None:
    kube, target = admitted()
    restarted = single(eligible=False, container_id="containerd://main-2", restart_count=1)
    kube.add_pod(restarted)  # same name and UID: the Pod is the member, its container is not
    kube.script_exec("llm-1", IDLE)
    obs = drain(kube, target, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == "llm-1: container main restarted since admission"
    assert kube.called("exec_pod") == []


def test_a_container_that_changes_during_the_read_reads_unknown() -> None:
    kube, target = admitted()

    def restart_mid_read(argv: list[str]) -> ExecResult:
        kube.add_pod(single(eligible=False, container_id="containerd://main-2", restart_count=1))
        return IDLE

    kube.script_exec("llm-1", restart_mid_read)
    obs = drain(kube, target, seconds=0.0)  # one poll
    assert obs.verdict is Verdict.UNKNOWN and obs.polls == 1
    assert obs.readings["llm-1"] == "UNKNOWN: container main changed during the read"


def test_metrics_that_cannot_be_read_safely_are_refused_without_an_exec() -> None:
    kube, target = admitted()
    bad = target.model_copy(
        update={"members": [target.members[0].model_copy(update={"metrics_path": "/m?x=$(id)"})]}
    )
    obs = drain(kube, bad, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["llm-1"].startswith("UNKNOWN: read refused: prometheus.io/path")
    assert kube.called("exec_pod") == []


@pytest.mark.parametrize(
    "error", [Unavailable("read Pod", status=503), Forbidden("read Pod", status=403)]
)
def test_a_failed_pod_read_is_unknown_and_the_next_poll_goes_on(error: Exception) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    assert isinstance(error, Unavailable | Forbidden)
    kube.fail("read_pod", error)
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    status = error.status
    assert beats[0].readings == {"llm-1": f"UNKNOWN: read Pod failed: HTTP {status}"}
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 3
    assert_no_writes(kube)


# ---------------------------------------------------------------- FAILED


@pytest.mark.parametrize(
    ("how", "reason"),
    [("replaced", "member llm-1 was replaced (UID uid-new)"), ("gone", "member llm-1 is gone")],
)
def test_a_lost_member_fails_the_drain_and_is_not_read(how: str, reason: str) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    if how == "replaced":
        kube.add_pod(single(uid="uid-new"))
    else:
        kube.remove_pod("llm-1")
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.FAILED
    assert obs.reason == reason
    assert obs.polls == 1 and len(beats) == 1
    assert kube.called("exec_pod") == []
    assert_no_writes(kube)


def test_a_member_replaced_during_the_read_fails() -> None:
    kube, target = admitted()

    def replaced_mid_read(argv: list[str]) -> ExecResult:
        kube.add_pod(single(uid="uid-new"))
        return IDLE

    kube.script_exec("llm-1", replaced_mid_read)
    obs = drain(kube, target)
    assert obs.verdict is Verdict.FAILED
    assert obs.reason == "member llm-1 was replaced (UID uid-new)"


# ---------------------------------------------------------------- resumed attempts


def test_a_retried_drain_resumes_the_rule_from_the_last_heartbeat() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    first: list[Any] = []
    obs = drain(kube, target, seconds=0.0, heartbeats=first)  # one idle read: the deadline
    assert obs.verdict is Verdict.UNKNOWN and obs.reason == "first idle read"

    beats: list[Any] = []
    obs = drain(  # resumed within two poll intervals of the previous idle read
        kube,
        target,
        heartbeats=beats,
        resume=[as_the_worker_would_decode(first[-1])],
        interval=1.0,
    )
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 1  # the previous attempt's idle read is the first of the two
    assert beats[0].progress.rounds == 2


def test_a_resumed_drain_still_checks_the_counters() -> None:
    kube, target = admitted()
    answer = [idle((5, 7))]
    kube.script_exec("llm-1", lambda argv: answer[0])
    first: list[Any] = []
    drain(kube, target, seconds=0.0, heartbeats=first)
    answer[0] = idle((8, 9))  # work was done between the attempts
    beats: list[Any] = []
    obs = drain(
        kube,
        target,
        heartbeats=beats,
        resume=[as_the_worker_would_decode(first[-1])],
        interval=0.5,
    )
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2
    assert beats[0].progress.previous_idle["llm-1"].counters == (8.0, 9.0)


@pytest.mark.parametrize(
    "details",
    [
        ["not a heartbeat"],
        [{"progress": {"rounds": "many"}}],
        [json.loads('{"unexpected": 1}')],
        [],
    ],
    ids=["string", "wrong-type", "unknown-field", "none"],
)
def test_unreadable_heartbeat_details_start_the_rule_afresh(details: list[Any]) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats, resume=details)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2
    assert beats[0].progress.rounds == 1


def test_a_resumed_drain_discards_an_idle_read_older_than_two_poll_intervals() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    first: list[Any] = []
    drain(kube, target, seconds=0.0, heartbeats=first)
    stale = as_the_worker_would_decode(first[-1])
    stale["progress"]["previous_idle_at"] = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats, resume=[stale], interval=0.05)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 2  # the old read is not the first of the two
    assert beats[0].progress.rounds == 2  # the count goes on; the comparison starts afresh
    assert beats[0].progress.previous_idle_at > datetime.now(UTC) - timedelta(seconds=5)


def test_a_resumed_drain_discards_an_idle_read_of_unknown_age() -> None:
    """Heartbeat details that do not say when the idle read was taken (an earlier build's)
    cannot prove the read is recent: it is discarded, never compared against."""
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    first: list[Any] = []
    drain(kube, target, seconds=0.0, heartbeats=first)
    undated = as_the_worker_would_decode(first[-1])
    undated["progress"].pop("previous_idle_at", None)
    obs = drain(kube, target, resume=[undated], interval=0.05)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 2


def test_a_resumed_drain_discards_an_idle_read_from_the_future() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    first: list[Any] = []
    drain(kube, target, seconds=0.0, heartbeats=first)
    skewed = as_the_worker_would_decode(first[-1])
    skewed["progress"]["previous_idle_at"] = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    obs = drain(kube, target, resume=[skewed], interval=0.05)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2


def test_the_rule_keeps_a_recent_read_and_drops_a_stale_one() -> None:
    now = datetime.now(UTC)
    read = {"m": Sample(complete=True, in_flight=0, counters=(1.0, 2.0))}
    recent = DrainProgress(
        rounds=3, previous_idle=read, previous_idle_at=now - timedelta(seconds=1)
    )
    assert resume(recent, now=now, poll_interval_s=1.0) == recent
    old = recent.model_copy(update={"previous_idle_at": now - timedelta(seconds=2.5)})
    assert resume(old, now=now, poll_interval_s=1.0) == DrainProgress(rounds=3)
    undated = recent.model_copy(update={"previous_idle_at": None})
    assert resume(undated, now=now, poll_interval_s=1.0) == DrainProgress(rounds=3)


# ---------------------------------------------------------------- withdrawal still holds


def test_a_drain_does_not_verify_once_the_label_is_back() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)

    def relabelled(n: int) -> None:
        if n == 1:
            kube.set_label("llm-1", LABEL_ELIGIBLE, "true")

    # The deadline leaves room for two polls on a loaded machine (the second one FAILS).
    obs = drain(kube, target, seconds=5.0, on_beat=relabelled)
    assert obs.verdict is Verdict.FAILED
    assert obs.polls == 2
    assert obs.reason == (f"label re-added by someone else: llm-1 has {LABEL_ELIGIBLE}='true'")
    assert obs.readings["label/llm-1"] == "re-added ('true')"
    assert kube.pod_labels("llm-1")[LABEL_ELIGIBLE] == "true"  # the drain changes nothing
    assert_no_writes(kube)


def test_the_label_back_on_a_member_that_is_not_measured_fails_the_drain() -> None:
    pods = [
        member_pod("llm-1-0", deployment=MD, ordinal=1, member=0, uid="a", ip="198.18.1.20"),
        member_pod("llm-1-1", deployment=MD, ordinal=1, member=1, uid="b", ip="198.18.1.21"),
    ]
    kube, target = admitted(*pods, size=2)
    assert target.measured == ("llm-1-0",)
    kube.script_exec("llm-1-0", IDLE)
    kube.set_label("llm-1-1", LABEL_ELIGIBLE, "true")
    obs = drain(kube, target)
    assert obs.verdict is Verdict.FAILED and obs.polls == 1
    assert obs.reason.startswith("label re-added by someone else: llm-1-1 has")


def test_every_round_reads_the_label_of_every_member() -> None:
    pods = [
        member_pod("llm-1-0", deployment=MD, ordinal=1, member=0, uid="a", ip="198.18.1.20"),
        member_pod("llm-1-1", deployment=MD, ordinal=1, member=1, uid="b", ip="198.18.1.21"),
    ]
    kube, target = admitted(*pods, size=2)
    kube.script_exec("llm-1-0", busy(1), IDLE)
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 3
    follower_reads = [c for c in kube.called("read_pod") if c.args["name"] == "llm-1-1"]
    assert len(follower_reads) == 3  # one per round, though it is never exec'd into
    assert {c.args["name"] for c in kube.called("exec_pod")} == {"llm-1-0"}


def test_a_member_gone_that_is_not_measured_fails_the_drain() -> None:
    pods = [
        member_pod("llm-1-0", deployment=MD, ordinal=1, member=0, uid="a", ip="198.18.1.20"),
        member_pod("llm-1-1", deployment=MD, ordinal=1, member=1, uid="b", ip="198.18.1.21"),
    ]
    kube, target = admitted(*pods, size=2)
    kube.script_exec("llm-1-0", IDLE)
    kube.remove_pod("llm-1-1")
    obs = drain(kube, target)
    assert obs.verdict is Verdict.FAILED and obs.reason == "member llm-1-1 is gone"


class SixthPodReadFails(FakeKube):
    """Round 2's re-check of the label (the sixth Pod read: before, after, label per
    round) meets an API server that is away."""

    def read_pod(self, *, namespace: str, name: str) -> Pod:
        if len(self.called("read_pod")) == 5:
            self.fail("read_pod", Unavailable("read Pod", status=503))
        return super().read_pod(namespace=namespace, name=name)


def test_a_failed_label_read_holds_and_the_next_round_goes_on() -> None:
    kube, target = admitted(kube=SixthPodReadFails())
    kube.script_exec("llm-1", IDLE)
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 4
    assert beats[1].readings == {"llm-1": "in_flight=0 counters=5,7"}  # idle, yet:
    assert beats[1].progress.previous_idle is None  # not confirmed: not an idle round


def test_a_drain_does_not_verify_while_a_service_lists_the_member_again() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    kube.add_service("llm", selector={"app.kubernetes.io/instance": MD})
    kube.set_endpoints("llm", [])

    def relisted(n: int) -> None:
        if n == 1:
            kube.set_endpoints("llm", [target.members[0].ip])

    # The deadline leaves room for a second poll on a loaded machine.
    obs = drain(kube, target, seconds=1.0, on_beat=relisted)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == "withdrawal not confirmed: service/llm still lists 198.18.1.11"
    assert obs.readings == {
        "llm-1": "in_flight=0 counters=5,7",
        "service/llm": "still lists 198.18.1.11",
    }
    assert_no_writes(kube)


def test_a_slice_listing_the_member_by_its_uid_holds_the_drain() -> None:
    """The same evidence as withdrawal: an EndpointSlice naming the member as its
    ``targetRef`` (whatever address it carries) still sends it work."""
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    kube.add_service("other", selector={"app": "x"})
    kube.set_endpoints("other", ["198.18.9.9"], target_uids=["uid-1"])
    obs = drain(kube, target, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason.startswith("withdrawal not confirmed: service/other still lists")


def test_the_per_replica_headless_service_does_not_hold_the_drain() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    kube.add_service("llm-1", selector={"app.kubernetes.io/instance": MD}, headless=True)
    kube.set_endpoints("llm-1", [target.members[0].ip])
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2


def test_idle_reads_around_a_lapse_of_the_withdrawal_do_not_count() -> None:
    """Idle, then a Service lists the member, then idle: the reads before the lapse are
    not the first of the two; two idle reads after it, each confirmed, are needed."""
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    kube.add_service("llm", selector={"app.kubernetes.io/instance": MD})
    kube.set_endpoints("llm", [])
    beats: list[Any] = []

    def lapse(n: int) -> None:
        if n == 1:
            kube.set_endpoints("llm", [target.members[0].ip])
        elif n == 2:
            kube.set_endpoints("llm", [])

    obs = drain(kube, target, heartbeats=beats, on_beat=lapse)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls == 4
    assert [b.progress.previous_idle is None for b in beats] == [False, True, False, False]


def test_each_round_confirms_the_withdrawal_after_its_reads() -> None:
    """The last confirmation is no older than the second idle read: in every round, the
    Services (and routers, and labels) are read after the member's one-shot."""
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    kube.add_service("llm", selector={"app.kubernetes.io/instance": MD})
    kube.set_endpoints("llm", [])
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2
    methods = [c.method for c in kube.calls]
    assert methods.count("list_services") == 2 and methods.count("list_pods") == 2
    last_exec = len(methods) - 1 - methods[::-1].index("exec_pod")
    after = set(methods[last_exec:])
    assert {"read_pod", "list_services", "list_pods"} <= after
    assert after & {"list_endpoint_slices", "list_namespace_endpoint_slices"}


def test_a_failed_service_list_holds() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    kube.fail("list_services", Unavailable("list Services", status=503))
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 3
    assert beats[0].progress.previous_idle is None


def test_the_rule_never_counts_a_round_whose_withdrawal_was_not_confirmed() -> None:
    read = {"m": Sample(complete=True, in_flight=0, counters=(1.0, 2.0))}
    p, v, _ = observe_round(DrainProgress(), measured=("m",), samples=read)
    assert v is Verdict.UNKNOWN and p.previous_idle is not None
    p, v, why = observe_round(p, measured=("m",), samples=read, not_withdrawn="service x")
    assert v is Verdict.UNKNOWN and why == "withdrawal not confirmed: service x"
    assert p.previous_idle is None
    p, v, why = observe_round(p, measured=("m",), samples=read)
    assert v is Verdict.UNKNOWN and why == "first idle read"
    p, v, _ = observe_round(p, measured=("m",), samples=read)
    assert v is Verdict.VERIFIED and p.rounds == 4


# ---------------------------------------------------------------- routers, read again

ROUTER_IP = "198.18.1.2"


def router_pod(kind: str = "vllm-router") -> dict[str, Any]:
    """A router Pod of the deployment (its workers are answered by ``routers``)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "router-0",
            "namespace": NS,
            "uid": "uid-router-0",
            "labels": {"app.kubernetes.io/instance": MD, LABEL_ROUTER: kind},
        },
        "spec": {
            "containers": [{"name": "router", "ports": [{"name": "http", "containerPort": 30000}]}]
        },
        "status": {"podIP": ROUTER_IP},
    }


class Routers:
    """What the vllm-router answers (through a MockTransport: no network)."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.status = 200
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.status, json={"urls": list(self.urls)})


@pytest.fixture
def routers(monkeypatch: pytest.MonkeyPatch) -> Routers:
    """Make the HTTP client the drain opens answer through ``Routers``."""
    answers = Routers()
    real = drain_module.http_client

    def make(**kwargs: Any) -> httpx.Client:
        return real(**{**kwargs, "transport": httpx.MockTransport(answers.handle)})

    monkeypatch.setattr(drain_module, "http_client", make)
    return answers


def test_a_router_that_selects_no_target_confirms_the_withdrawal(routers: Routers) -> None:
    kube, target = admitted(router="vllm-router")
    kube.add_pod(router_pod())
    routers.urls = ["http://198.18.1.10:8000"]
    kube.script_exec("llm-1", IDLE)
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 2
    assert [(r.method, r.url.path) for r in routers.requests] == [("GET", "/list_workers")] * 2


def test_a_drain_does_not_verify_while_a_router_selects_the_member_again(
    routers: Routers,
) -> None:
    kube, target = admitted(router="vllm-router")
    kube.add_pod(router_pod())
    kube.script_exec("llm-1", IDLE)

    def reselected(n: int) -> None:
        if n == 1:
            routers.urls = ["http://198.18.1.11:8000"]

    obs = drain(kube, target, seconds=0.1, on_beat=reselected)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == (
        "withdrawal not confirmed: router/router-0 still selects http://198.18.1.11:8000"
    )
    assert {r.method for r in routers.requests} == {"GET"}  # read-only: no removal call
    assert_no_writes(kube)


def test_a_router_without_a_fresh_answer_holds(routers: Routers) -> None:
    kube, target = admitted(router="vllm-router")
    kube.add_pod(router_pod())
    routers.status = 503
    kube.script_exec("llm-1", IDLE)
    obs = drain(kube, target, seconds=0.1)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["router/router-0"].startswith("gave no fresh answer: HTTPStatusError")


def test_a_declared_router_with_no_router_pod_holds(routers: Routers) -> None:
    kube, target = admitted(router="vllm-router")
    kube.script_exec("llm-1", IDLE)
    obs = drain(kube, target, seconds=0.1)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == (
        "withdrawal not confirmed: routers router vllm-router declared but no router Pod found"
    )


def test_a_replica_that_never_started_drains_at_once_saying_so() -> None:
    """SPEC section 3: nothing ever ran in it, so nothing is in flight; no exec is tried."""
    kube, target = admitted(single(container_id=None, ready="False"))
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert "never started" in " ".join(obs.readings.values()) + obs.reason
    assert kube.called("exec_pod") == []


def test_a_never_started_member_that_starts_meanwhile_fails_the_drain() -> None:
    kube, target = admitted(single(container_id=None, ready="False"))
    kube.add_pod(single(container_id="containerd://late", ready="True"))  # it started
    obs = drain(kube, target)
    assert obs.verdict is Verdict.FAILED and "started since admission" in obs.reason


# ---------------------------------------------------------------- read spacing (issue 9)


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits the drain asks for between rounds, recorded instead of slept (so a test
    can use the real 1 s poll interval and a 240 s budget and still take milliseconds)."""
    asked: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _details: asked.append(s))
    return asked


def test_busy_reads_are_spaced_out_and_idle_reads_follow_quickly(waits: list[float]) -> None:
    """A busy engine is read after 2, 4, 8, 8 s (the bound); once it reads idle the next
    read follows after the 1 s poll interval, and two consecutive idle reads with unchanged
    counters VERIFY, as before."""
    kube, target = admitted()
    kube.script_exec("llm-1", busy(20), busy(20), busy(20), busy(20), IDLE)
    obs = drain(kube, target, seconds=240.0, interval=1.0)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 6
    assert obs.reason == "idle on two consecutive complete reads, counters unchanged"
    assert waits == [2.0, 4.0, 8.0, 8.0, 1.0]
    assert len(kube.called("exec_pod")) == 6  # one exec per round: nothing skipped


def test_nearly_idle_reads_are_followed_quickly_failed_ones_back_off(waits: list[float]) -> None:
    """A failed exec (most often one that timed out under load) backs off like a busy
    read: more reads would only add to the load."""
    kube, target = admitted()
    failed = ExecResult(error="exec failed: ApiException")
    kube.script_exec("llm-1", busy(20), busy(20), busy(2), busy(20), failed, busy(1), IDLE)
    obs = drain(kube, target, seconds=240.0, interval=1.0)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 8
    assert waits == [2.0, 4.0, 1.0, 2.0, 4.0, 1.0, 1.0]


def test_moving_counters_still_need_two_idle_reads_after_a_busy_spell(waits: list[float]) -> None:
    """Spacing changes only the waits: idle reads whose counters moved are not the pair;
    the rule VERIFIES only on two consecutive idle reads with unchanged counters."""
    kube, target = admitted()
    kube.script_exec("llm-1", busy(20), busy(20), idle((6, 9)), idle((6, 10)), idle((6, 10)))
    beats: list[Any] = []
    obs = drain(kube, target, seconds=240.0, interval=1.0, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 5
    assert [b.progress.previous_idle is not None for b in beats] == [False, False, True, True, True]
    assert waits == [2.0, 4.0, 1.0, 1.0]


def test_the_spacing_shrinks_near_the_deadline(waits: list[float]) -> None:
    """Never more than a quarter of the time left: a busy engine read with 12 s left is
    read again within 3 s, so two idle reads still fit if it goes quiet."""
    kube, target = admitted()
    kube.script_exec("llm-1", busy(20), busy(20), busy(20), IDLE)
    obs = drain(kube, target, seconds=12.0, interval=1.0)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 5
    near_3 = pytest.approx(3.0, abs=0.05)
    assert waits == [2.0, near_3, near_3, 1.0]


def test_the_spacing_is_slept_for_real() -> None:
    """Without the recording stub: the busy rounds take longer than the idle ones."""
    kube, target = admitted()
    at: list[float] = []

    def timed(result: ExecResult) -> Callable[[list[str]], ExecResult]:
        def answer(argv: list[str]) -> ExecResult:
            at.append(time.monotonic())
            return result

        return answer

    kube.script_exec("llm-1", timed(busy(20)), timed(busy(20)), timed(busy(20)), timed(IDLE))
    obs = drain(kube, target, seconds=30.0, interval=0.05)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 5
    gaps = [b - a for a, b in pairwise(at)]
    assert gaps[0] >= 0.1 and gaps[1] >= 0.2 and gaps[2] >= 0.4  # 2, 4, 8 x 50 ms
    assert gaps[3] < gaps[2] / 2  # after the first idle read: the 50 ms interval


def test_every_drain_exec_is_counted() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", busy(20), IDLE)
    before = drain_exec_reads()
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert drain_exec_reads() - before == len(kube.called("exec_pod")) == 3


def test_a_refused_read_is_not_an_exec() -> None:
    kube, target = admitted()
    bad = target.model_copy(
        update={"members": [target.members[0].model_copy(update={"metrics_path": "/m?x=$(id)"})]}
    )
    before = drain_exec_reads()
    drain(kube, bad, seconds=0.0)
    assert drain_exec_reads() == before


# ---------------------------------------------------------------- queueing (issue 9)


def test_an_attempt_that_started_late_says_so_when_it_ends_unknown() -> None:
    """A saturated worker let the attempt wait 42 s in the task queue: the budget it ate is
    told in the reason the phase ends with."""
    kube, target = admitted()
    kube.script_exec("llm-1", busy(3))
    obs = drain(kube, target, seconds=0.05, queued_s=42.0)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == (
        "llm-1: 3 in flight; this attempt started 42 s after it was scheduled (worker busy)"
    )


def test_an_ordinary_dispatch_latency_is_not_told() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", busy(3))
    obs = drain(kube, target, seconds=0.05, queued_s=0.5)
    assert obs.reason == "llm-1: 3 in flight"


def test_a_verdict_reached_despite_a_late_start_is_not_annotated() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", IDLE)
    obs = drain(kube, target, queued_s=42.0)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.reason == "idle on two consecutive complete reads, counters unchanged"


# ---------------------------------------------------------------- the exact count


def exact(*counts: int, counters: tuple[float, float] = (5, 7)) -> Callable[[list[str]], Any]:
    """One exec of reads whose gauges are idle and whose front end holds ``counts[i]``
    requests at read i, as the one-shot prints them: mode ``exact`` one read, ``exact2``
    two (one count given: the same at both)."""

    def run(argv: list[str]) -> ExecResult:
        mode = argv[6]
        n = {"exact": 1, "exact2": 2}[mode]
        each = counts if len(counts) == n else counts[:1] * n
        out = "".join(oneshot_stdout(counters=counters, exact=c) for c in each)
        return ExecResult(stdout=out, exit_code=0)

    return run


def test_a_member_counting_exactly_is_read_with_its_count_twice_in_one_exec() -> None:
    """With the count, the proof's two reads are one exec (``exact2``: the one-shot reads,
    waits ``TWICE_SPACING_S``, reads again): an idle engine verifies on one exec."""
    kube, target = admitted(single(args=["--enable-server-load-tracking"]))
    [m] = target.members
    assert m.exact_load
    kube.script_exec("llm-1", exact(0))
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert [c.args["argv"][6] for c in kube.called("exec_pod")] == ["exact2"]
    assert obs.readings["llm-1"] == "in_flight=0 exact=0 counters=5,7"


def test_a_request_between_the_two_reads_of_one_exec_undoes_the_first() -> None:
    """Idle at the first read, one request at the second: not verified; the next exec's two
    idle reads are the proof."""
    kube, target = admitted(single(args=["--enable-server-load-tracking"]))
    kube.script_exec("llm-1", exact(0, 1), exact(0, 0))
    obs = drain(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert len(kube.called("exec_pod")) == 2


def test_a_double_read_cut_after_its_first_read_is_not_idle() -> None:
    """The one-shot printed its first read and stopped (an error, a timeout): the second
    read is UNKNOWN, and one idle read is never the proof."""
    kube, target = admitted(single(args=["--enable-server-load-tracking"]))
    cut = ExecResult(
        stdout=oneshot_stdout(counters=(5, 7), exact=0) + "#error\tGET failed: /load: timeout\n",
        exit_code=0,
    )
    kube.script_exec("llm-1", cut)
    obs = drain(kube, target, seconds=0.3)
    assert obs.verdict is Verdict.UNKNOWN
    assert "GET failed" in obs.reason, obs.reason


def test_a_request_in_the_front_end_keeps_the_drain_from_verifying() -> None:
    """vLLM's gauges miss a request still in its HTTP front end (rendering, tokenizing,
    its last streamed bytes), and the counters need not move: the gauge rule alone reads
    idle twice.  The exact count holds the drain until the front end is empty too."""
    kube, target = admitted(single(args=["--enable-server-load-tracking"]))
    kube.script_exec("llm-1", exact(1), exact(1, 0), exact(0))
    beats: list[Any] = []
    obs = drain(kube, target, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED and obs.polls == 3
    assert beats[0].readings["llm-1"] == "in_flight=0 exact=1 counters=5,7"
    # The same engine read by the gauge rule alone (no count asked for: the flag off)
    # verifies on its first two reads, the request still in its front end.
    kube, plain = admitted()
    kube.script_exec("llm-1", IDLE)
    assert drain(kube, plain).polls == 2


def test_a_member_without_the_flag_is_read_by_the_gauge_rule() -> None:
    kube, target = admitted()
    assert not target.members[0].exact_load
    kube.script_exec("llm-1", IDLE)
    assert drain(kube, target).verdict is Verdict.VERIFIED
    assert kube.called("exec_pod")[0].args["argv"][6] == "plain"
