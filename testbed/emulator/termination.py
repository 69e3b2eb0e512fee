"""How an emulated engine container ends when its Pod is deleted with a grace period: the
kubelet's sequence (preStop hook, SIGTERM, SIGKILL at the end of the grace period) and
each engine's own handling of SIGTERM, as the real ones do it.

Why: a preStop sleep plus a grace period is what platform teams run today to scale down
without failed requests; the bed can only compare the product with it if the emulator
ends the way the real engine does. The facts, from the sources read (December 2026):

The kubelet (``pkg/kubelet/kuberuntime/kuberuntime_container.go``, ``killContainer``):
the grace period is the Pod's ``deletionGracePeriodSeconds``; when it is above 0 the
preStop hook runs first, for at most the grace period, and its time is taken from the
grace period; then SIGTERM, and SIGKILL when the rest runs out, but never less than 2 s
after SIGTERM (``minimumGracePeriodInSeconds``). Meanwhile the Pod stays in the API with
its ``deletionTimestamp`` (EndpointSlices mark it terminating, routers watching it see
it), and is removed once its containers have stopped. A Pod deleted with grace 0 is
removed from the API at once; the bed's emulator is then stopped at once (the kubelet
would give the process 2 s after SIGTERM; not emulated).

vLLM (vllm-project/vllm: ``vllm/entrypoints/openai/api_server.py`` at 0001948b, whose
``run_server_worker`` shuts the engine down with ``vllm_config.shutdown_timeout`` before it
awaits the HTTP server's shutdown; ``vllm/entrypoints/launcher.py`` at 02828a12, whose
SIGTERM handler cancels the uvicorn server task; PR #34730, re-landed as #36666 in March
2026, which added ``--shutdown-timeout``; the ``ServiceUnavailableMiddleware`` of
``vllm/entrypoints/serve/middleware.py`` as stored in the public index): on SIGTERM the
API server stops taking requests (new ones get 503 ``{"error": "Server is unavailable.
Please try again later."}``; ``/metrics`` and ``/live`` stay up) and then:

- ``--shutdown-timeout 0``, the default: every in-flight request is aborted at once and
  the process exits (the listening socket closes: later connections are refused);
- ``--shutdown-timeout N``: in-flight requests run on for up to N s, then the rest are
  aborted and the process exits. Nothing waits longer than that; SIGKILL ends it sooner.

Before #36666 a SIGTERM cancelled the uvicorn server task and shut the engine down, which
also aborted every in-flight request at once; the default behaviour did not change. (The
exact 503 body is the middleware's as read; PR #36666's description says only that new
requests are rejected.)

SGLang (sgl-project/sglang ``python/sglang/srt/managers/tokenizer_manager.py``,
``SignalHandler.sigterm_handler`` and ``TokenizerManager.sigterm_watchdog``, and
``python/sglang/srt/entrypoints/http_server.py``, ``health_generate``, in the versions
stored in the public index; the watchdog and the 503 are the same in every version read):
SIGTERM only sets ``gracefully_exit``. The HTTP server keeps listening and keeps taking
and serving new requests; ``/health`` and ``/health_generate`` answer 503. A watchdog
that sleeps in 5 s steps notices the flag at its next step, then checks every 5 s and
exits (killing its process tree) at the first check with no request in flight, with no
time limit of its own: only SIGKILL bounds it. With ``SGL_FORCE_SHUTDOWN`` set, or after
a failed health check, it exits at its first check whatever is in flight.

A request cut by an exit or by SIGKILL ends as the emulator's stop cuts it: the
connection closes without a complete answer. (The real vLLM may first write an error
event or status; the client sees a failed request either way.)
"""

from __future__ import annotations

import math
import threading
import time
from enum import StrEnum
from typing import Protocol

from testbed.emulator.spec import EngineKind

__all__ = [
    "KUBELET_MIN_SIGTERM_SECONDS",
    "SGLANG_WATCHDOG_SECONDS",
    "Exit",
    "Phase",
    "Terminable",
    "engine_shutdown",
    "kubelet_termination",
    "next_tick",
]

KUBELET_MIN_SIGTERM_SECONDS = 2.0
"""The kubelet's ``minimumGracePeriodInSeconds``: SIGKILL never comes sooner after SIGTERM."""

SGLANG_WATCHDOG_SECONDS = 5.0
"""The step of SGLang's ``sigterm_watchdog`` (``await asyncio.sleep(5)``)."""

_POLL_SECONDS = 0.02
"""How often vLLM's drain looks at the in-flight count (its real one waits on an event)."""


class Phase(StrEnum):
    """Where a container is in its termination."""

    RUNNING = "running"  # no termination started
    PRESTOP = "prestop"  # the preStop hook runs; the engine does not know yet
    SIGTERM = "sigterm"  # the engine received SIGTERM and handles it
    EXITED = "exited"  # the process is gone


class Exit(StrEnum):
    """How the process ended."""

    CLEAN = "clean"  # by itself, after SIGTERM
    KILLED = "killed"  # SIGKILL at the end of the grace period


class Terminable(Protocol):
    """What the termination needs from one emulated engine (one process lifetime)."""

    @property
    def engine(self) -> EngineKind:
        """Which engine it imitates."""

    @property
    def in_flight(self) -> int:
        """Requests taken and not yet finished."""

    @property
    def healthy(self) -> bool:
        """Whether its health check passes (SGLang exits at once when it fails)."""

    @property
    def shutdown_timeout(self) -> float:
        """vLLM's ``--shutdown-timeout``."""

    @property
    def force_shutdown(self) -> bool:
        """SGLang's ``SGL_FORCE_SHUTDOWN``."""

    @property
    def started_at(self) -> float:
        """``time.monotonic()`` when this process started (SGLang's watchdog steps from it)."""

    def sigterm(self, life: threading.Event) -> bool:
        """Deliver SIGTERM to the process ``life`` stands for; False if it is not that one."""

    def exit(self, life: threading.Event, how: Exit) -> None:
        """End the process ``life`` stands for (no-op when it already ended)."""

    def set_phase(self, life: threading.Event, phase: Phase) -> None:
        """Record where the termination is."""


def next_tick(started_at: float, now: float, step: float) -> float:
    """The first watchdog step strictly after ``now`` of a loop that started at
    ``started_at`` and sleeps ``step`` at a time."""
    if step <= 0 or not math.isfinite(step):
        raise ValueError("step must be a finite number > 0")
    done = max(0, math.floor((now - started_at) / step) + 1)
    return started_at + done * step


def engine_shutdown(engine: Terminable, life: threading.Event) -> None:
    """The engine's own SIGTERM handling, from SIGTERM until it exits by itself (or until
    ``life`` is set: the process ended otherwise, by SIGKILL)."""
    if engine.engine is EngineKind.VLLM:
        deadline = time.monotonic() + max(0.0, engine.shutdown_timeout)
        while engine.in_flight > 0 and time.monotonic() < deadline:
            if life.wait(min(_POLL_SECONDS, max(0.0, deadline - time.monotonic()))):
                return
        engine.exit(life, Exit.CLEAN)
        return
    step = SGLANG_WATCHDOG_SECONDS
    if life.wait(max(0.0, next_tick(engine.started_at, time.monotonic(), step) - time.monotonic())):
        return
    while engine.in_flight > 0 and not engine.force_shutdown and engine.healthy:
        if life.wait(step):
            return
    engine.exit(life, Exit.CLEAN)


def kubelet_termination(
    engine: Terminable, life: threading.Event, *, prestop_seconds: float, grace_seconds: float
) -> None:
    """The kubelet's termination of the container: the preStop hook (only with a grace
    period above 0, for at most the grace period), SIGTERM, SIGKILL when the rest of the
    grace period (at least 2 s) runs out. Returns when the process has ended."""
    began = time.monotonic()
    hook = min(prestop_seconds, grace_seconds) if grace_seconds > 0 else 0.0
    if hook > 0:
        engine.set_phase(life, Phase.PRESTOP)
        if life.wait(hook):
            return
    left = max(grace_seconds - (time.monotonic() - began), KUBELET_MIN_SIGTERM_SECONDS)
    if not engine.sigterm(life):
        return
    if life.wait(left):
        return
    engine.exit(life, Exit.KILLED)
