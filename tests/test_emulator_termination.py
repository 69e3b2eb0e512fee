"""The emulated engine ends as the real one does when its Pod is deleted with a grace
period (testbed.emulator.termination): the kubelet's preStop, SIGTERM, SIGKILL, and each
engine's own SIGTERM handling; and the stand-in operator's emulated kubelet
(testbed.standin_termination) starts that and removes the Pod after. Offline: the
emulator is driven directly on 127.0.0.1."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from retirement.names import ENGINE_CONTAINER
from testbed.emulator import EmulatorHub, EngineEmulator, EngineKind, termination
from testbed.emulator.termination import Exit, Phase, kubelet_termination, next_tick
from testbed.standin_termination import EmulatedKubelet, PodTermination, prestop_sleep_seconds
from tests.helpers import eventually
from tests.helpers.emulators import emulators

LOOPBACK = "127.0.0.1"
WAIT = 10.0  # a bound on how long a state change may take to show (not a figure)
LONG = 30.0  # a request that cannot finish while a test runs


@pytest.fixture
def make() -> Iterator[Callable[..., EngineEmulator]]:
    """Started emulators on 127.0.0.1 (free ports); all stopped afterwards."""
    with emulators(prefix="pod", request_seconds=0.1) as start:
        yield start


@pytest.fixture
def fast_watchdog(monkeypatch: pytest.MonkeyPatch) -> float:
    """SGLang's watchdog steps every 0.05 s instead of 5 s (the rule is the same)."""
    monkeypatch.setattr(termination, "SGLANG_WATCHDOG_SECONDS", 0.05)
    return 0.05


def url(emu: EngineEmulator, path: str) -> str:
    """A URL on the emulator's Pod address."""
    return f"http://{LOOPBACK}:{emu.serve_port}{path}"


def get(emu: EngineEmulator, path: str) -> httpx.Response:
    """One GET without proxies."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        return c.get(url(emu, path))


class Call:
    """One request in a thread; keeps whether it got a complete answer."""

    def __init__(self, emu: EngineEmulator, seconds: float, *, stream: bool = False) -> None:
        self.status: int | None = None
        self.complete = False
        self.error: BaseException | None = None
        if emu.engine is EngineKind.VLLM:
            path = "/v1/completions"
            body: dict[str, Any] = {"model": "emulated", "prompt": "a b", "max_tokens": 8}
        else:
            path = "/generate"
            body = {"text": "a b", "sampling_params": {"max_new_tokens": 8}}
        body |= {"emulate_seconds": seconds, "stream": stream}

        def run() -> None:
            try:
                with (
                    httpx.Client(trust_env=False, timeout=LONG + 10) as c,
                    c.stream("POST", url(emu, path), json=body) as r,
                ):
                    self.status = r.status_code
                    text = r.read().decode()
                    self.complete = r.status_code == 200 and (
                        "[DONE]" in text if stream else text.endswith("}")
                    )
            except httpx.HTTPError as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> Call:
        self.thread.join(WAIT + LONG)
        assert not self.thread.is_alive(), "request did not end"
        return self


def in_flight(emu: EngineEmulator, n: int) -> None:
    """Wait until ``n`` requests are in flight."""
    eventually(lambda: emu.in_flight == n, what=f"{n} in flight", timeout=WAIT, interval=0.01)


def ended(emu: EngineEmulator) -> None:
    """Wait until the emulated process has exited."""
    assert emu.ended.wait(WAIT + LONG), "the process did not exit"


def refused(emu: EngineEmulator) -> bool:
    """Whether a new connection to the Pod address is refused (the process is gone)."""
    try:
        get(emu, "/health")
    except httpx.ConnectError:
        return True
    return False


# --------------------------------------------------------------------------------------
# vLLM


def test_vllm_sigterm_aborts_every_request_in_flight_and_exits(
    make: Callable[..., EngineEmulator],
) -> None:
    """--shutdown-timeout 0 (the default): in-flight requests are aborted at once."""
    emu = make(EngineKind.VLLM)
    plain, streamed = Call(emu, LONG), Call(emu, LONG, stream=True)
    in_flight(emu, 2)
    assert emu.sigterm()
    ended(emu)
    plain.join()
    streamed.join()
    assert not plain.complete and not streamed.complete
    assert emu.aborted == 2 and emu.completed == 0
    assert emu.phase is Phase.EXITED and emu.exit_reason is Exit.CLEAN
    assert refused(emu)


def test_vllm_with_a_shutdown_timeout_refuses_new_requests_and_drains(
    make: Callable[..., EngineEmulator],
) -> None:
    """--shutdown-timeout N: 503 for every new request (health too, not /metrics); the
    in-flight ones finish; then the process exits by itself."""
    emu = make(EngineKind.VLLM, shutdown_timeout=LONG)
    running = Call(emu, 2.0, stream=True)
    in_flight(emu, 1)
    assert emu.sigterm()
    late = Call(emu, 0.1).join()
    assert late.status == 503 and not late.complete
    assert get(emu, "/health").status_code == 503
    answer = get(emu, "/v1/models")
    assert answer.status_code == 503
    assert answer.json() == {"error": "Server is unavailable. Please try again later."}
    assert get(emu, "/metrics").status_code == 200
    assert running.join().complete
    ended(emu)
    assert emu.completed == 1 and emu.aborted == 0
    assert emu.exit_reason is Exit.CLEAN and refused(emu)


def test_vllm_shutdown_timeout_bounds_the_drain(make: Callable[..., EngineEmulator]) -> None:
    """What is still in flight when the shutdown timeout runs out is aborted."""
    emu = make(EngineKind.VLLM, shutdown_timeout=0.3)
    stuck = Call(emu, LONG)
    in_flight(emu, 1)
    assert emu.sigterm()
    ended(emu)
    assert not stuck.join().complete
    assert emu.aborted == 1 and emu.exit_reason is Exit.CLEAN


# --------------------------------------------------------------------------------------
# SGLang


def test_sglang_sigterm_keeps_serving_and_exits_when_nothing_is_in_flight(
    make: Callable[..., EngineEmulator], fast_watchdog: float
) -> None:
    """SIGTERM only fails the health check: new requests are still taken and served, and
    the watchdog exits at its first check with nothing in flight."""
    emu = make(EngineKind.SGLANG)
    first = Call(emu, 1.5, stream=True)
    in_flight(emu, 1)
    assert emu.sigterm()
    assert get(emu, "/health").status_code == 503
    assert get(emu, "/health_generate").status_code == 503
    late = Call(emu, 0.2).join()
    assert late.status == 200 and late.complete
    assert get(emu, "/get_model_info").status_code == 200
    assert first.join().complete
    ended(emu)
    assert emu.completed == 2 and emu.aborted == 0
    assert emu.exit_reason is Exit.CLEAN and refused(emu)


def test_sglang_force_shutdown_exits_whatever_is_in_flight(
    make: Callable[..., EngineEmulator], fast_watchdog: float
) -> None:
    """SGL_FORCE_SHUTDOWN: the first watchdog check exits, cutting what runs."""
    emu = make(EngineKind.SGLANG, force_shutdown=True)
    stuck = Call(emu, LONG)
    in_flight(emu, 1)
    assert emu.sigterm()
    ended(emu)
    assert not stuck.join().complete and emu.aborted == 1
    assert emu.exit_reason is Exit.CLEAN


def test_sglang_exits_at_once_after_a_failed_health_check(
    make: Callable[..., EngineEmulator], fast_watchdog: float
) -> None:
    """A failed health check makes the watchdog exit without waiting for requests."""
    emu = make(EngineKind.SGLANG)
    stuck = Call(emu, LONG)
    in_flight(emu, 1)
    emu.set_healthy(False)
    assert emu.sigterm()
    ended(emu)
    assert not stuck.join().complete and emu.aborted == 1


def test_sglang_watchdog_steps_from_its_start() -> None:
    """The watchdog notices SIGTERM at its next whole step after the process started."""
    assert next_tick(100.0, 100.0, 5.0) == 105.0
    assert next_tick(100.0, 104.9, 5.0) == 105.0
    assert next_tick(100.0, 105.0, 5.0) == 110.0
    assert next_tick(100.0, 99.0, 5.0) == 100.0
    with pytest.raises(ValueError):
        next_tick(0.0, 1.0, 0.0)


# --------------------------------------------------------------------------------------
# the kubelet: preStop, SIGTERM, SIGKILL


def test_prestop_leaves_the_engine_serving_then_sigterm_ends_it(
    make: Callable[..., EngineEmulator],
) -> None:
    """During the preStop hook the engine knows nothing: it takes and serves requests and
    its health passes; then SIGTERM (vLLM: exit at once)."""
    emu = make(EngineKind.VLLM)
    assert emu.terminate(prestop_seconds=3.0, grace_seconds=LONG)
    assert not emu.terminate(prestop_seconds=3.0, grace_seconds=LONG), "one termination only"
    eventually(lambda: emu.phase is Phase.PRESTOP, what="preStop", timeout=WAIT, interval=0.01)
    assert get(emu, "/health").status_code == 200
    served = Call(emu, 0.1).join()
    assert served.complete
    ended(emu)
    assert emu.exit_reason is Exit.CLEAN and emu.completed == 1


def test_sigkill_at_the_end_of_the_grace_period(
    make: Callable[..., EngineEmulator], fast_watchdog: float
) -> None:
    """An SGLang engine with a request that outlasts the grace period is killed."""
    emu = make(EngineKind.SGLANG)
    stuck = Call(emu, LONG, stream=True)
    in_flight(emu, 1)
    assert emu.terminate(prestop_seconds=0.0, grace_seconds=0.1)
    ended(emu)
    assert emu.exit_reason is Exit.KILLED
    assert not stuck.join().complete and emu.aborted == 1
    assert refused(emu)


@dataclass
class Recorder:
    """A stand-in engine that records what the kubelet does to it and exits on SIGTERM."""

    engine: EngineKind = EngineKind.VLLM
    in_flight: int = 0
    healthy: bool = True
    shutdown_timeout: float = 0.0
    force_shutdown: bool = False
    started_at: float = 0.0
    calls: list[str] = field(default_factory=list)

    def sigterm(self, life: threading.Event) -> bool:
        self.calls.append("sigterm")
        life.set()
        return True

    def exit(self, life: threading.Event, how: Exit) -> None:
        self.calls.append(f"exit:{how}")

    def set_phase(self, life: threading.Event, phase: Phase) -> None:
        self.calls.append(f"phase:{phase}")


def test_kubelet_runs_no_prestop_hook_without_a_grace_period() -> None:
    """With grace 0 the kubelet goes straight to SIGTERM; with a grace period the hook
    runs first."""
    now = Recorder()
    kubelet_termination(now, threading.Event(), prestop_seconds=5.0, grace_seconds=0.0)
    assert now.calls == ["sigterm"]
    hooked = Recorder()
    kubelet_termination(hooked, threading.Event(), prestop_seconds=0.05, grace_seconds=LONG)
    assert hooked.calls == ["phase:prestop", "sigterm"]


def test_a_late_sigkill_does_not_reach_a_restarted_process(
    make: Callable[..., EngineEmulator],
) -> None:
    """Termination threads act on the process they began with, never on a later one."""
    emu = make(EngineKind.SGLANG)
    old = emu.ended
    emu.restart()
    emu.exit(old, Exit.KILLED)
    assert not emu.sigterm(old)
    assert emu.is_running and emu.phase is Phase.RUNNING
    assert get(emu, "/health").status_code == 200


# --------------------------------------------------------------------------------------
# the hub


def test_hub_terminates_a_pod() -> None:
    """POST /pods/{name}/terminate validates its body and starts the termination; the
    Pod's status shows how it ended."""
    hub = EmulatorHub(LOOPBACK, 0)
    thread = hub.start_background()
    base = f"http://{LOOPBACK}:{hub.control_port}"
    try:
        with httpx.Client(trust_env=False, timeout=5.0) as c:
            made = c.post(
                f"{base}/pods",
                json={
                    "name": "p",
                    "engine": "vLLM",
                    "serve_host": LOOPBACK,
                    "serve_port": 0,
                    "metrics_port": 0,
                    "shutdown_timeout": 1.5,
                },
            )
            assert made.status_code == 201
            assert made.json()["termination"]["shutdown_timeout"] == 1.5
            assert c.post(f"{base}/pods/p/terminate", json={}).status_code == 400
            bad = c.post(f"{base}/pods/p/terminate", json={"grace_seconds": 1, "x": 1})
            assert bad.status_code == 400
            ok = c.post(f"{base}/pods/p/terminate", json={"grace_seconds": 30})
            assert ok.status_code == 200
            done = eventually(
                lambda: c.get(f"{base}/pods/p").json(),
                what="pod exited",
                timeout=WAIT,
                accept=lambda s: s["state"] == "stopped",
            )
            assert done["termination"] == {
                "phase": "exited",
                "exit": "clean",
                "shutdown_timeout": 1.5,
                "force_shutdown": False,
            }
    finally:
        hub.shutdown()
        thread.join(5)


# --------------------------------------------------------------------------------------
# the stand-in operator's emulated kubelet (testbed.standin_termination)


def member(prestop: client.V1LifecycleHandler | None, grace: int | None = 30) -> client.V1Pod:
    """A terminating member Pod with this preStop hook and deletion grace period."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="llm-server-1", namespace="ns", uid="u-1", deletion_grace_period_seconds=grace
        ),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(name="sidecar", image="x"),
                client.V1Container(
                    name=ENGINE_CONTAINER,
                    image="x",
                    lifecycle=None if prestop is None else client.V1Lifecycle(pre_stop=prestop),
                ),
            ]
        ),
    )


def exec_hook(*argv: str) -> client.V1LifecycleHandler:
    """A preStop hook that runs ``argv``."""
    return client.V1LifecycleHandler(_exec=client.V1ExecAction(command=list(argv)))


def test_prestop_sleep_is_read_from_the_main_container() -> None:
    sleep = client.V1LifecycleHandler(sleep=client.V1SleepAction(seconds=5))
    assert prestop_sleep_seconds(member(sleep)) == 5.0
    assert prestop_sleep_seconds(member(exec_hook("sleep", "7"))) == 7.0
    assert prestop_sleep_seconds(member(exec_hook("/bin/sleep", "3"))) == 3.0
    assert prestop_sleep_seconds(member(exec_hook("/bin/sh", "-c", "sleep 4"))) == 4.0
    assert prestop_sleep_seconds(member(exec_hook("curl", "-X", "POST", "x"))) == 0.0
    assert prestop_sleep_seconds(member(None)) == 0.0


def test_pod_termination_puts_the_hook_and_grace_on_the_pod() -> None:
    pod = member(None, grace=None)
    pod.spec.termination_grace_period_seconds = 0
    PodTermination(prestop_seconds=5, grace_seconds=30).apply(pod)
    assert pod.spec.termination_grace_period_seconds == 30
    assert prestop_sleep_seconds(pod) == 5.0
    assert pod.spec.containers[0].lifecycle is None  # only the engine container


@dataclass
class FakeCore:
    """Records Pod deletions; answers with ``status`` when set."""

    deleted: list[tuple[str, str, int | None, str | None]] = field(default_factory=list)
    status: int | None = None

    def delete_namespaced_pod(
        self, name: str, namespace: str, *, grace_period_seconds: int, body: Any
    ) -> None:
        if self.status is not None:
            raise ApiException(status=self.status)
        self.deleted.append((name, namespace, body.grace_period_seconds, body.preconditions.uid))


def test_emulated_kubelet_starts_the_termination_then_removes_the_exited_pod() -> None:
    calls: list[tuple[str, str, dict[str, Any] | None]] = []
    state = {"state": "running", "termination": {"phase": "prestop", "exit": None}}

    def hub(method: str, path: str, body: dict[str, Any] | None) -> Any:
        calls.append((method, path, body))
        return state

    core = FakeCore()
    kubelet = EmulatedKubelet()
    pod = member(client.V1LifecycleHandler(sleep=client.V1SleepAction(seconds=5)))
    kubelet.observe(core, hub, pod, "llm-server-1.u-1")  # type: ignore[arg-type]
    assert calls == [
        ("POST", "/pods/llm-server-1.u-1/terminate", {"prestop_seconds": 5.0, "grace_seconds": 30})
    ]
    kubelet.observe(core, hub, pod, "llm-server-1.u-1")  # type: ignore[arg-type]
    assert core.deleted == [], "still running: the Pod stays"
    state.update(state="stopped", termination={"phase": "exited", "exit": "clean"})
    kubelet.observe(core, hub, pod, "llm-server-1.u-1")  # type: ignore[arg-type]
    assert core.deleted == [("llm-server-1", "ns", 0, "u-1")]
    kubelet.observe(core, hub, pod, "llm-server-1.u-1")  # type: ignore[arg-type]
    assert len(core.deleted) == 1 and len(calls) == 3, "done with that Pod"


def test_emulated_kubelet_shrugs_off_a_pod_already_gone_and_a_hub_error() -> None:
    def gone_hub(method: str, path: str, body: dict[str, Any] | None) -> Any:
        if method == "POST":
            raise OSError("hub unreachable")
        return {"state": "stopped"}

    kubelet = EmulatedKubelet()
    pod = member(None)
    kubelet.observe(FakeCore(), gone_hub, pod, "h")  # type: ignore[arg-type]
    assert "u-1" not in kubelet._started, "a failed start is tried again"

    def hub(method: str, path: str, body: dict[str, Any] | None) -> Any:
        return {"state": "stopped"}

    core = FakeCore(status=404)
    kubelet.observe(core, hub, pod, "h")  # type: ignore[arg-type]
    kubelet.observe(core, hub, pod, "h")  # type: ignore[arg-type]
    assert "u-1" in kubelet._removed
