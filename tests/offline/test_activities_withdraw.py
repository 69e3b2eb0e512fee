"""``withdraw`` under ``ActivityEnvironment`` against the fake Kubernetes layer, on
router-less deployments (routers are observed over HTTP, which
``tests/offline/test_router_observers.py`` covers): ordinary Services must stop listing
every target address, and then the router-less policy decides: ``hold`` never verifies,
``quiet-window`` verifies once the measured members' work counters stood still for the
window.  Each poll heartbeats ``WithdrawProgress``; a retried attempt carries the
removals it asked for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError

from activities import RetirementActivities, polling
from kube.api import ExecResult
from kube.errors import Forbidden, KubeError, Unavailable
from retirement.models import (
    Observation,
    PhaseInput,
    RouterlessPolicy,
    Target,
    WithdrawProgress,
)
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict
from tests.helpers.activity_env import recording_env
from tests.helpers.admission import admitted as admit
from tests.helpers.admission import sibling, victim
from tests.helpers.fake_kube import FakeKube, oneshot_stdout

NS = "default"
MD = "llm"
IP = "198.18.1.11"
QUIET = RouterlessPolicy.QUIET_WINDOW
HOLD = RouterlessPolicy.HOLD
READS = {
    "list_services",
    "list_endpoint_slices",
    "list_namespace_endpoint_slices",
    "list_pods",
    "read_pod",
    "exec_pod",
}


def idle(counters: tuple[float, float] = (5, 7)) -> ExecResult:
    return ExecResult(stdout=oneshot_stdout(counters=counters), exit_code=0)


single = victim


def admitted(
    router: str | None = None, *, args: list[str] | None = None
) -> tuple[FakeKube, Target]:
    """Replica 1 of ``llm`` admitted and disqualified beside replica 0; ``args``: its
    Pod's engine arguments."""
    return admit(victim(args=args or []), sibling(), router=router)


def withdraw(
    kube: FakeKube,
    target: Target,
    *,
    policy: RouterlessPolicy = QUIET,
    window: float = 0.03,
    seconds: float = 5.0,
    heartbeats: list[Any] | None = None,
    on_beat: Any = None,
    resume: list[Any] | None = None,
) -> Observation:
    beats: list[Any] = [] if heartbeats is None else heartbeats
    env = recording_env(beats, on_beat=on_beat, resume=resume)
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=0.01,
        routerless_policy=policy,
        quiet_window_s=window,
    )
    obs: Observation = env.run(RetirementActivities(kube).withdraw, inp)
    return obs


def assert_read_only(kube: FakeKube) -> None:
    methods = {c.method for c in kube.calls}
    assert methods <= READS, methods


# ---------------------------------------------------------------- router-less: hold


def test_the_hold_policy_never_verifies_and_reads_no_member() -> None:
    kube, target = admitted()
    beats: list[Any] = []
    obs = withdraw(kube, target, policy=HOLD, seconds=0.3, heartbeats=beats)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == (
        "router-less: nothing reports that client connections went quiet (policy hold)"
    )
    assert obs.polls >= 2
    assert all(isinstance(b, WithdrawProgress) for b in beats)
    # Every poll heartbeats its progress, in order (waits between polls may repeat it).
    seen = [b.polls for b in beats]
    assert seen == sorted(seen) and sorted(set(seen)) == list(range(1, obs.polls + 1))
    assert next(b.last for b in beats if b.polls == obs.polls) == obs
    assert kube.called("exec_pod") == []
    assert_read_only(kube)


# ---------------------------------------------------------------- router-less: quiet window


def test_the_quiet_window_verifies_once_the_counters_stood_still_for_it() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    beats: list[Any] = []
    obs = withdraw(kube, target, window=0.03, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.reason == "no Service lists and no router selects a target"
    assert obs.readings["routers"].startswith("router-less: counters quiet for")
    assert beats[0].last.readings["routers"] == "router-less: quiet window started"
    assert obs.polls >= 2
    assert {c.args["name"] for c in kube.called("exec_pod")} == {"llm-1"}
    assert_read_only(kube)


def test_moving_counters_restart_the_quiet_window() -> None:
    kube, target = admitted()
    moved = iter(range(1000))
    kube.script_exec("llm-1", lambda argv: idle((next(moved), 0)))
    beats: list[Any] = []
    obs = withdraw(kube, target, window=0.01, seconds=0.1, heartbeats=beats)
    assert obs.verdict is Verdict.UNKNOWN
    assert {b.last.readings["routers"] for b in beats} == {"router-less: quiet window started"}


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (ExecResult(error="exec failed: ApiException"), "exec failed: ApiException"),
        (ExecResult(stdout="#error\tGET failed: URLError\n"), "read failed: GET failed"),
    ],
    ids=["exec-error", "oneshot-error"],
)
def test_a_read_that_fails_holds_the_quiet_window(answer: ExecResult, reason: str) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", answer)
    obs = withdraw(kube, target, window=0.01, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason.startswith(f"router-less: llm-1 {reason}")


def test_reads_that_fail_do_not_restart_the_quiet_window() -> None:
    """A window started by a read that worked survives reads that failed (no exec slot, an
    exec timed out: they saw nothing); the first read that works after them, with the
    counters unmoved and the window's length behind it, verifies.  Before, each failed
    read restarted the window: 200 retirements at once, their reads queueing for exec
    slots, aborted when the budget ran out with "quiet window started"."""
    kube, target = admitted()
    no_slot = ExecResult(
        error="no exec slot within 3 s (this worker runs 16 reads at once now, at most 16)"
    )
    timed_out = ExecResult(error="exec failed: timed out after 5 s")
    kube.script_exec("llm-1", idle(), no_slot, timed_out, no_slot, no_slot, idle())
    beats: list[Any] = []
    obs = withdraw(kube, target, window=0.05, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.readings["routers"].startswith("router-less: counters quiet for")
    assert len(kube.called("exec_pod")) == 6  # the first read that worked again verified
    started = [b.polls for b in beats if b.last.readings["routers"].endswith("window started")]
    assert set(started) == {1}


def test_counters_that_moved_behind_failed_reads_restart_the_quiet_window() -> None:
    kube, target = admitted()
    failed = ExecResult(error="exec failed: timed out after 5 s")
    kube.script_exec("llm-1", idle((5, 7)), failed, failed, failed, failed, idle((6, 9)))
    beats: list[Any] = []
    obs = withdraw(kube, target, window=0.05, heartbeats=beats)
    assert obs.verdict is Verdict.VERIFIED
    started = [b.polls for b in beats if b.last.readings["routers"].endswith("window started")]
    assert set(started) == {1, 6}  # the window began again at the read that saw work


@pytest.mark.parametrize("how", ["replaced", "gone"])
def test_a_lost_member_holds_the_quiet_window_and_is_not_read(how: str) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    if how == "replaced":
        kube.add_pod(single(uid="uid-new"))
        reason = "router-less: member llm-1 was replaced (UID uid-new)"
    else:
        kube.remove_pod("llm-1")
        reason = "router-less: member llm-1 is gone"
    obs = withdraw(kube, target, window=0.01, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == reason
    assert kube.called("exec_pod") == []


def test_an_unavailable_pod_read_holds_the_quiet_window() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    kube.fail("read_pod", Unavailable("read Pod", status=503), times=1000)
    obs = withdraw(kube, target, window=0.01, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == "router-less: llm-1 read Pod failed: HTTP 503"


# ---------------------------------------------------------------- Services


def test_an_ordinary_service_listing_the_target_holds_until_it_stops() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    kube.add_service("llm", selector={"app.kubernetes.io/instance": MD, LABEL_ELIGIBLE: "true"})
    kube.set_endpoints("llm", ["198.18.1.10", IP])
    beats: list[Any] = []

    def endpoints_catch_up(n: int) -> None:
        if n == 3:
            kube.set_endpoints("llm", ["198.18.1.10"])

    obs = withdraw(kube, target, heartbeats=beats, on_beat=endpoints_catch_up)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.polls >= 4
    first = beats[0].last
    assert first.verdict is Verdict.UNKNOWN
    assert first.readings["service/llm"] == f"still lists {IP}"
    assert f"service llm lists {IP}" in first.reason
    assert "service/llm" not in obs.readings


def _slice_listing(kube: FakeKube, case: str) -> str:
    """Make one EndpointSlice list the target as ``case`` says; the reading's key."""
    if case == "other-selector":  # selects another deployment, yet its slice lists the target
        kube.add_service("svc", selector={"app.kubernetes.io/instance": "other"})
        kube.set_endpoints("svc", [IP])
    elif case == "no-selector":  # endpoints managed by hand still route traffic
        kube.add_service("svc", selector={})
        kube.set_endpoints("svc", [IP])
    elif case == "headless-on-eligibility":  # headless, but selecting on eligibility
        kube.add_service("svc", selector={LABEL_ELIGIBLE: "true"}, headless=True)
        kube.set_endpoints("svc", [IP])
    elif case == "headless-no-selector":  # not a per-replica Service: it selects nothing
        kube.add_service("svc", selector={}, headless=True)
        kube.set_endpoints("svc", [IP])
    elif case == "target-ref-only":  # another address, but the member's Pod UID
        kube.add_service("svc", selector={"app.kubernetes.io/instance": MD})
        kube.set_endpoints("svc", ["198.18.9.9"], target_uids=["uid-1"])
    elif case == "second-pod-ip":  # the member's other address (dual stack)
        body = single()
        body["status"]["podIPs"] = [{"ip": IP}, {"ip": "fd00::11"}]
        kube.add_pod(body)
        kube.add_service("svc", selector={"app.kubernetes.io/instance": MD})
        kube.set_endpoints("svc", ["fd00::11"])
    elif case == "no-owning-service":
        kube.add_endpoint_slice("orphan", service=None, endpoints=[{"addresses": [IP]}])
        return "service/(no Service: EndpointSlice orphan)"
    else:  # "service-gone": the slice outlived its Service
        kube.add_endpoint_slice("gone-abc", service="gone", endpoints=[{"addresses": [IP]}])
        return "service/gone"
    return "service/svc"


@pytest.mark.parametrize(
    "case",
    [
        "other-selector",
        "no-selector",
        "headless-on-eligibility",
        "headless-no-selector",
        "target-ref-only",
        "second-pod-ip",
        "no-owning-service",
        "service-gone",
    ],
)
def test_every_other_endpoint_slice_listing_the_target_holds(case: str) -> None:
    """Defect 8 (issue 8): every EndpointSlice of the namespace counts, matched on any of
    the member's ``podIPs`` or its ``targetRef.uid``, but the per-replica headless ones."""
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    # Beside it, what is never waited for: the per-replica headless Service (it does not
    # select on eligibility and keeps listing the member by design), and a slice that
    # lists only another Pod.
    kube.add_service("llm-server-1", selector={"app.kubernetes.io/instance": MD}, headless=True)
    kube.set_endpoints("llm-server-1", [IP], target_uids=["uid-1"])
    kube.add_service("kept", selector={"app.kubernetes.io/instance": MD, LABEL_ELIGIBLE: "true"})
    kube.set_endpoints("kept", ["198.18.1.10"], target_uids=["uid-0"])
    key = _slice_listing(kube, case)
    obs = withdraw(kube, target, seconds=0.05)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings[key].startswith("still lists")
    services = {k for k in obs.readings if k.startswith("service/")}
    assert services == {key}


def test_a_declared_router_without_a_router_pod_holds() -> None:
    kube, target = admitted(router="sglang-gateway")
    obs = withdraw(kube, target, seconds=0.03)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.reason == "router sglang-gateway declared but no router Pod found"
    assert kube.called("exec_pod") == []


# ---------------------------------------------------------------- resumed attempts


def test_a_retried_withdrawal_carries_the_removals_it_asked_for() -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    earlier = WithdrawProgress(
        polls=4,
        removal_requested=["uid-router|http://198.18.1.11:8000"],
        last=Observation(verdict=Verdict.UNKNOWN, reason="still selects"),
    )
    converter = pydantic_data_converter.payload_converter
    [decoded] = converter.from_payloads(converter.to_payloads([earlier]))
    assert isinstance(decoded, dict)  # what a retried attempt really gets
    beats: list[Any] = []
    obs = withdraw(kube, target, heartbeats=beats, resume=[decoded])
    assert obs.verdict is Verdict.VERIFIED
    assert all(b.removal_requested == ["uid-router|http://198.18.1.11:8000"] for b in beats)


@pytest.mark.parametrize("details", [[None], ["garbage"], [{"polls": "x"}]])
def test_unreadable_withdrawal_details_start_afresh(details: list[Any]) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    beats: list[Any] = []
    obs = withdraw(kube, target, heartbeats=beats, resume=details)
    assert obs.verdict is Verdict.VERIFIED
    assert beats[0].removal_requested == [] and beats[0].polls == 1


# ---------------------------------------------------------------- Kubernetes errors


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("list_services", Unavailable("list Services", status=503)),
        ("list_services", Forbidden("list Services", status=403)),
        (
            "list_namespace_endpoint_slices",
            Unavailable("list EndpointSlices", reason="TimeoutError"),
        ),
        ("list_pods", Forbidden("list Pods", status=403)),
    ],
    ids=["services-unavailable", "services-forbidden", "slices-unavailable", "pods-forbidden"],
)
def test_a_failed_list_leaves_withdraw_as_its_application_error(
    method: str, error: KubeError
) -> None:
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    kube.add_service("llm", selector={"app.kubernetes.io/instance": MD})
    kube.set_endpoints("llm", [IP])
    kube.fail(method, error)
    with pytest.raises(ApplicationError) as info:
        withdraw(kube, target)
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not error.retryable
    assert_read_only(kube)


def test_quiet_window_reads_that_fail_back_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """Failed router-less reads (execs timing out while 50 retirements start at once, seen
    in the worker benchmark) are followed 2, 4, 8 poll intervals later, not at once; the
    first read that works brings the interval back."""
    waits: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _details: waits.append(s))
    # The planned spacing alone: a poll slower than its 10 ms interval (a loaded machine)
    # would stretch the wait by the back-pressure rule, tested on its own elsewhere.
    monkeypatch.setattr(polling, "backpressure", lambda wait_s, _took_s: wait_s)
    kube, target = admitted()
    failed = ExecResult(error="exec failed: timed out after 5 s")
    kube.script_exec("llm-1", failed, failed, failed, idle(), idle())
    obs = withdraw(kube, target, window=0.0, seconds=5.0)
    assert obs.verdict is Verdict.VERIFIED
    assert [round(w, 3) for w in waits] == [0.02, 0.04, 0.08, 0.01]


def test_the_quiet_window_never_ends_while_the_front_end_holds_a_request() -> None:
    """Counters that stand still say no request finished; the engine's own count says
    whether one is still held (a long generation, its last bytes still streaming)."""
    kube, target = admitted(args=["--enable-server-load-tracking"])
    assert target.members[0].exact_load
    held = ExecResult(stdout=oneshot_stdout(counters=(5, 7), exact=1), exit_code=0)
    kube.script_exec("llm-1", held)
    beats: list[Any] = []
    obs = withdraw(kube, target, seconds=0.3, heartbeats=beats)
    assert obs.verdict is Verdict.UNKNOWN
    assert obs.readings["routers"] == "router-less: llm-1 holds 1 request(s) (GET /load)"
    free = ExecResult(stdout=oneshot_stdout(counters=(5, 7), exact=0), exit_code=0)
    kube.script_exec("llm-1", free)
    obs = withdraw(kube, target)
    assert obs.verdict is Verdict.VERIFIED


def test_a_quiet_window_shorter_than_the_poll_interval_is_read_again_when_it_can_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waits: list[float] = []
    monkeypatch.setattr(polling, "wait_heartbeating", lambda s, _details: waits.append(s))
    monkeypatch.setattr(polling, "backpressure", lambda wait_s, _took_s: wait_s)
    kube, target = admitted()
    kube.script_exec("llm-1", idle())
    beats: list[Any] = []
    env = recording_env(beats)
    inp = PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=5),
        poll_interval_s=1.0,
        routerless_policy=QUIET,
        quiet_window_s=0.5,
    )
    obs: Observation = env.run(RetirementActivities(kube).withdraw, inp)
    assert obs.verdict is Verdict.VERIFIED
    assert waits[0] == 0.5  # not the whole 1 s poll interval
