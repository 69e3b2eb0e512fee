"""One emulated engine: one Pod's ``main`` container, with its lifecycle, its in-flight
accounting and its HTTP routes.

A request is admitted (in flight, in the front end), then enters the scheduler on the
least busy DP rank (counted as running), then ends completed or cut. vLLM counts prompt
tokens when a request is scheduled, SGLang when it finishes, as the real engines do.
A restart bumps a generation so that requests from before it no longer move the new
gauges and counters.

A Pod deleted with a grace period ends as :mod:`testbed.emulator.termination` says the
kubelet and the real engine end it (preStop hook, SIGTERM handled the engine's way,
SIGKILL); :meth:`EngineEmulator.terminate` starts that.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from testbed.emulator import intake, serving
from testbed.emulator.exposition import LATENCY_BUCKETS, Family, Rank
from testbed.emulator.metrics_sglang import sglang_families
from testbed.emulator.metrics_vllm import vllm_families
from testbed.emulator.spec import EngineKind, PodEngineSpec
from testbed.emulator.termination import Exit, Phase, engine_shutdown, kubelet_termination
from testbed.emulator.traps import (
    SLOW_METRICS_SECONDS,
    Traps,
    is_metrics_mode,
    trapped_gauges,
    trapped_metrics,
)
from testbed.emulator.wire import (
    Cut,
    Handler,
    Server,
    read_body,
    send_bytes,
    send_json,
)

__all__ = ["EngineEmulator"]

_UNAVAILABLE = {"error": "Server is unavailable. Please try again later."}
"""vLLM's answer to a request after SIGTERM (``ServiceUnavailableMiddleware``, 503)."""

_VLLM_OPEN_WHILE_SHUTTING_DOWN = frozenset({"/metrics", "/live"})
"""The routes vLLM keeps answering after SIGTERM (liveness and observability)."""

_GET_ROUTES = frozenset(
    {"/health", "/health_generate", "/ping", "/metrics", "/v1/models", "/get_model_info"}
    | {"/get_server_info", "/server_info", "/version"}
)
_POST_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/generate"})
"""The emulated routes by method: another method on one of them is 405, an unknown route
404 (FastAPI's defaults, :func:`intake.method_not_allowed`, :func:`intake.route_not_found`).
SGLang's ``/generate`` takes ``PUT`` as well (``@app.api_route("/generate", methods=["POST",
"PUT"])``, sglang/srt/entrypoints/http_server.py)."""


@dataclass
class _Ticket:
    """One request's handle on the emulator state."""

    generation: int
    halt: threading.Event
    hidden_seconds: float
    prompt_tokens: int
    generation_tokens: int
    duration: float
    rank: int = -1
    started_at: float = 0.0


class EngineEmulator:
    """One emulated engine (one Pod's ``main`` container).

    Serves on ``(serve_host, serve_port)`` and on ``("127.0.0.1", metrics_port)``:
    ``/health``, ``/metrics``, ``/v1/models``, ``/get_model_info``, ``/get_server_info``,
    ``/v1/completions``, ``/v1/chat/completions`` and, for SGLang, ``/generate``,
    ``/health_generate`` and ``/v1/models/{name}``. The probe's routes read and refuse
    requests as the real engine does (see :mod:`testbed.emulator.intake`); an unknown route
    is FastAPI's 404 ``{"detail": "Not Found"}``, a known one with another method its 405.
    Thread-safe.
    """

    def __init__(self, spec: PodEngineSpec) -> None:
        """Prepare (but do not start) an emulator for ``spec``."""
        if spec.dp_ranks < 1:
            raise ValueError("dp_ranks must be >= 1")
        if not math.isfinite(spec.request_seconds) or spec.request_seconds < 0:
            raise ValueError("request_seconds must be a finite number >= 0")
        if not math.isfinite(spec.shutdown_timeout) or spec.shutdown_timeout < 0:
            raise ValueError("shutdown_timeout must be a finite number >= 0")
        self.engine = EngineKind(spec.engine)
        served = tuple(spec.served_model_names)
        if not served or not all(isinstance(n, str) and n for n in served):
            raise ValueError("served_model_names must be one or more non-empty strings")
        if self.engine is EngineKind.SGLANG and len(served) != 1:
            raise ValueError("SGLang serves exactly one model name")
        if not isinstance(spec.model_path, str) or not spec.model_path:
            raise ValueError("model_path must be a non-empty string")
        spec.served_model_names = served
        self.spec = spec
        self._lock = threading.Lock()
        self._generation = 0
        self._ranks = [Rank() for _ in range(spec.dp_ranks)]
        self._rr = 0
        self._created = time.time()
        self._in_flight = 0
        self._completed = 0
        self._aborted = 0
        self._restarts = 0
        self._boot_id = secrets.token_hex(8)
        self._traps = Traps()
        self._running = False
        self._halt = threading.Event()
        self._servers: list[Server] = []
        self._threads: list[threading.Thread] = []
        self._serve_port = spec.serve_port
        self._metrics_port = spec.metrics_port
        self._life = threading.Lock()
        # One process lifetime: set when it ends; termination threads hold the one they
        # belong to, so a late SIGKILL cannot reach a restarted process.
        self._ended = threading.Event()
        self._started_at = time.monotonic()
        self._phase = Phase.RUNNING
        self._exit: Exit | None = None
        self._terminating = False
        self._sigterm = False
        # SGLang's ``rid_to_state``: the ids of the requests in flight in this process.
        self._rids: set[str] = set()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Bind both addresses and serve. A no-op when already started."""
        with self._life:
            if self._running:
                return
            servers: list[Server] = []
            try:
                servers.append(Server((self.spec.serve_host, self._serve_port), self))
                same = self.spec.serve_host == "127.0.0.1" and self._metrics_port == servers[0].port
                if not same:
                    servers.append(Server(("127.0.0.1", self._metrics_port), self))
            except OSError:
                for srv in servers:
                    srv.server_close()
                raise
            self._serve_port = servers[0].port
            self._metrics_port = servers[-1].port
            with self._lock:
                self._halt = threading.Event()
                self._running = True
                self._ended = threading.Event()
                self._started_at = time.monotonic()
                self._phase = Phase.RUNNING
                self._exit = None
                self._terminating = False
                self._sigterm = False
                self._rids = set()
            self._servers = servers
            self._threads = []
            for srv in servers:
                thread = threading.Thread(
                    target=srv.serve_forever,
                    kwargs={"poll_interval": 0.05},
                    name=f"emulator-{self.spec.name}-{srv.port}",
                    daemon=True,
                )
                thread.start()
                self._threads.append(thread)

    def stop(self) -> None:
        """Close the listening sockets and cut in-flight requests. Counters are kept."""
        with self._life:
            if not self._running:
                return
            with self._lock:
                self._running = False
                self._halt.set()
            for srv in self._servers:
                srv.shutdown()
                srv.server_close()
            for srv in self._servers:
                srv.cut_all()
            for thread in self._threads:
                thread.join(timeout=5)
            self._servers = []
            self._threads = []
            with self._lock:
                if self._terminating and self._phase is not Phase.EXITED:
                    self._phase, self._exit = Phase.EXITED, Exit.KILLED
                self._ended.set()

    def restart(self) -> None:
        """Simulate a container restart: cut requests, zero gauges/counters, clear traps.

        The same ports are bound again. ``in_flight``/``completed`` are this object's
        lifetime bookkeeping and are not reset; requests cut by the restart end as aborted.
        """
        self.stop()
        with self._lock:
            self._generation += 1
            self._ranks = [Rank() for _ in range(self.spec.dp_ranks)]
            self._created = time.time()
            self._restarts += 1
            self._boot_id = secrets.token_hex(8)
            self._traps.clear()
        self.start()

    @property
    def is_running(self) -> bool:
        """True between start and stop."""
        return self._running

    # -- termination (see testbed.emulator.termination) --------------------------------

    def terminate(self, *, prestop_seconds: float, grace_seconds: float) -> bool:
        """Start the kubelet's termination of this container, in a thread: the preStop
        hook for ``prestop_seconds``, SIGTERM, SIGKILL when ``grace_seconds`` (counted
        from now) run out. False when not running or already terminating."""
        for value in (prestop_seconds, grace_seconds):
            if not math.isfinite(value) or value < 0:
                raise ValueError("prestop_seconds and grace_seconds must be finite and >= 0")
        with self._lock:
            if not self._running or self._terminating:
                return False
            self._terminating = True
            life = self._ended
        threading.Thread(
            target=kubelet_termination,
            args=(self, life),
            kwargs={"prestop_seconds": prestop_seconds, "grace_seconds": grace_seconds},
            name=f"kubelet-{self.spec.name}",
            daemon=True,
        ).start()
        return True

    def sigterm(self, life: threading.Event | None = None) -> bool:
        """Deliver SIGTERM (to the current process, or the one ``life`` stands for): the
        engine handles it its own way, in a thread. False when that process is gone or
        already had one."""
        with self._lock:
            life = self._ended if life is None else life
            if life is not self._ended or not self._running or self._sigterm:
                return False
            self._sigterm = True
            self._terminating = True
            self._phase = Phase.SIGTERM
        threading.Thread(
            target=engine_shutdown, args=(self, life), name=f"sigterm-{self.spec.name}", daemon=True
        ).start()
        return True

    def sigkill(self) -> None:
        """SIGKILL the current process: every connection cut, the listeners closed."""
        with self._lock:
            self._terminating = True
            life = self._ended
        self.exit(life, Exit.KILLED)

    def exit(self, life: threading.Event, how: Exit) -> None:
        """End the process ``life`` stands for (no-op when it already ended)."""
        with self._lock:
            if life is not self._ended or self._phase is Phase.EXITED or not self._running:
                return
            self._phase, self._exit = Phase.EXITED, how
        self.stop()

    def set_phase(self, life: threading.Event, phase: Phase) -> None:
        """Record where the termination of the process ``life`` stands for is."""
        with self._lock:
            if life is self._ended and self._phase is not Phase.EXITED:
                self._phase = phase

    @property
    def phase(self) -> Phase:
        """Where the container is in its termination."""
        with self._lock:
            return self._phase

    @property
    def exit_reason(self) -> Exit | None:
        """How the process ended, once it has ended in a termination."""
        with self._lock:
            return self._exit

    @property
    def ended(self) -> threading.Event:
        """Set when the current process ends."""
        with self._lock:
            return self._ended

    @property
    def healthy(self) -> bool:
        """Whether the health check passes (the ``healthy`` trap)."""
        with self._lock:
            return self._traps.healthy

    @property
    def shutdown_timeout(self) -> float:
        """vLLM's ``--shutdown-timeout``."""
        return self.spec.shutdown_timeout

    @property
    def force_shutdown(self) -> bool:
        """SGLang's ``SGL_FORCE_SHUTDOWN``."""
        return self.spec.force_shutdown

    @property
    def started_at(self) -> float:
        """``time.monotonic()`` when the current process started."""
        with self._lock:
            return self._started_at

    @property
    def serve_port(self) -> int:
        """The bound serving port (the spec's, or the one picked for port 0)."""
        return self._serve_port

    @property
    def metrics_port(self) -> int:
        """The bound loopback metrics port."""
        return self._metrics_port

    @property
    def request_seconds(self) -> float:
        """The default duration of a new request."""
        with self._lock:
            return self.spec.request_seconds

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The names the engine serves its model under (``--served-model-name``)."""
        return self.spec.served_model_names

    def claim_rids(self, rids: list[str]) -> str | None:
        """Hold these request ids as in flight (all or none); the first one already held
        instead (SGLang refuses an id in flight: ``TokenizerManager._init_req_state``)."""
        with self._lock:
            for rid in rids:
                if rid in self._rids:
                    return rid
            self._rids.update(rids)
            return None

    def release_rids(self, rids: list[str]) -> None:
        """Let go of request ids held by :meth:`claim_rids`."""
        with self._lock:
            self._rids.difference_update(rids)

    # -- traps -------------------------------------------------------------------------

    def set_stale_gauges(self, running: int, waiting: int = 0) -> None:
        """Freeze the running/waiting gauges at these values (reported on rank 0)."""
        if running < 0 or waiting < 0:
            raise ValueError("stale gauges must be >= 0")
        with self._lock:
            self._traps.stale = (int(running), int(waiting))

    def set_frontend_hidden(self, seconds: float) -> None:
        """Make each new request spend ``seconds`` uncounted in the HTTP front end."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("seconds must be a finite number >= 0")
        with self._lock:
            self._traps.hidden = float(seconds)

    def set_metrics_mode(self, mode: str) -> None:
        """Set how ``/metrics`` answers; see :data:`METRICS_MODES`."""
        if not is_metrics_mode(mode):
            raise ValueError(f"unknown metrics mode {mode!r}")
        with self._lock:
            self._traps.mode = mode

    def set_healthy(self, healthy: bool) -> None:
        """Make ``/health`` answer 200 (True) or 503 (False)."""
        with self._lock:
            self._traps.healthy = bool(healthy)

    def set_request_seconds(self, seconds: float) -> None:
        """Change the default duration of new requests."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("seconds must be a finite number >= 0")
        with self._lock:
            self.spec.request_seconds = float(seconds)

    def clear_traps(self) -> None:
        """Back to normal behaviour (stale gauges, front-end delay, metrics mode, health)."""
        with self._lock:
            self._traps.clear()

    # -- bookkeeping -------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet finished or cut (front-end phase included)."""
        with self._lock:
            return self._in_flight

    @property
    def completed(self) -> int:
        """Requests answered completely since this object was made."""
        with self._lock:
            return self._completed

    @property
    def aborted(self) -> int:
        """Requests cut (stop, restart, client gone) since this object was made."""
        with self._lock:
            return self._aborted

    def status(self) -> dict[str, Any]:
        """A JSON-able view of the emulator, its traps and its true (untrapped) state."""
        with self._lock:
            ranks = self._ranks
            return {
                "name": self.spec.name,
                "engine": self.engine.value,
                "serve_host": self.spec.serve_host,
                "serve_port": self._serve_port,
                "metrics_port": self._metrics_port,
                "dp_ranks": self.spec.dp_ranks,
                "request_seconds": self.spec.request_seconds,
                "served_model_names": list(self.spec.served_model_names),
                "model_path": self.spec.model_path,
                "state": "running" if self._running else "stopped",
                "termination": {
                    "phase": self._phase.value,
                    "exit": None if self._exit is None else self._exit.value,
                    "shutdown_timeout": self.spec.shutdown_timeout,
                    "force_shutdown": self.spec.force_shutdown,
                },
                "in_flight": self._in_flight,
                "completed": self._completed,
                "aborted": self._aborted,
                "restarts": self._restarts,
                "boot_id": self._boot_id,
                "running_requests": sum(r.running for r in ranks),
                "waiting_requests": sum(r.waiting for r in ranks),
                "prompt_tokens": sum(r.prompt_tokens for r in ranks),
                "generation_tokens": sum(r.generation_tokens for r in ranks),
                "finished_requests": sum(r.requests for r in ranks),
                "traps": self._traps.as_json(),
            }

    def _admit(self, prompt_tokens: int, generation_tokens: int, duration: float) -> _Ticket:
        """Accept a new request (it is now in flight, in the front end)."""
        with self._lock:
            if not self._running:
                raise Cut
            self._in_flight += 1
            return _Ticket(
                self._generation,
                self._halt,
                self._traps.hidden,
                prompt_tokens,
                generation_tokens,
                duration,
            )

    def _begin(self, ticket: _Ticket) -> None:
        """The request enters the scheduler: counted as running on the least busy rank."""
        with self._lock:
            if ticket.halt.is_set():
                raise Cut
            ticket.started_at = time.monotonic()
            if ticket.generation != self._generation:
                return
            n = len(self._ranks)
            best = min(range(n), key=lambda r: (self._ranks[r].running, (r - self._rr) % n))
            self._rr = (best + 1) % n
            ticket.rank = best
            rank = self._ranks[best]
            rank.running += 1
            if self.engine is EngineKind.VLLM:
                rank.prompt_tokens += ticket.prompt_tokens

    def _end(self, ticket: _Ticket, ok: bool) -> None:
        """The request finished (``ok``) or was cut."""
        with self._lock:
            self._in_flight -= 1
            if ok:
                self._completed += 1
            else:
                self._aborted += 1
            if ticket.rank < 0 or ticket.generation != self._generation:
                return
            rank = self._ranks[ticket.rank]
            rank.running -= 1
            if not ok:
                return
            if self.engine is EngineKind.SGLANG:
                rank.prompt_tokens += ticket.prompt_tokens
            rank.generation_tokens += ticket.generation_tokens
            rank.requests += 1
            latency = time.monotonic() - ticket.started_at
            rank.latency_sum += latency
            for i, bound in enumerate(LATENCY_BUCKETS):
                if latency <= bound:
                    rank.latency_buckets[i] += 1

    def _wait(self, ticket: _Ticket, seconds: float) -> None:
        """Sleep ``seconds``, or raise :class:`Cut` as soon as the emulator stops."""
        if ticket.halt.wait(seconds) if seconds > 0 else ticket.halt.is_set():
            raise Cut

    @contextlib.contextmanager
    def admitted(
        self, *, prompt_tokens: int, generation_tokens: int, duration: float
    ) -> Iterator[serving.Spend]:
        """Admit a request, run its front-end phase, and count it as running inside.

        Yields what spends the request's duration (see :class:`serving.Spend`).
        """
        ticket = self._admit(prompt_tokens, generation_tokens, duration)
        ok = False
        try:
            self._wait(ticket, ticket.hidden_seconds)
            self._begin(ticket)

            def spend(pieces: int, on_piece: Callable[[int], None] | None = None) -> None:
                self._run(ticket, pieces, on_piece)

            yield spend
            ok = True
        finally:
            self._end(ticket, ok)

    def _run(
        self,
        ticket: _Ticket,
        pieces: int,
        on_piece: Callable[[int], None] | None = None,
    ) -> None:
        """Spend the request's duration, calling ``on_piece`` after each of ``pieces``."""
        step = ticket.duration / pieces
        for index in range(pieces):
            self._wait(ticket, step)
            if on_piece is not None:
                on_piece(index)

    # -- metrics -----------------------------------------------------------------------

    def _families(self) -> list[Family]:
        """The current families, with gauge traps applied."""
        with self._lock:
            ranks = [
                Rank(
                    r.running,
                    r.waiting,
                    r.prompt_tokens,
                    r.generation_tokens,
                    r.requests,
                    r.latency_sum,
                    list(r.latency_buckets),
                )
                for r in self._ranks
            ]
            stale = self._traps.stale
            created = self._created
        running, waiting = trapped_gauges(ranks, stale)
        if self.engine is EngineKind.VLLM:
            return vllm_families(ranks, running, waiting, created)
        return sglang_families(ranks, running, waiting)

    def metrics_text(self, mode: str | None = None) -> tuple[int, str]:
        """The ``/metrics`` status and body for ``mode`` (default: the current mode).

        ``slow`` is not applied here (the handler stalls before calling this).
        """
        if mode is None:
            with self._lock:
                mode = self._traps.mode
        return trapped_metrics(engine=self.engine, mode=mode, families=self._families)

    # -- HTTP --------------------------------------------------------------------------

    def handle(self, handler: Handler, method: str) -> None:
        """Answer one engine API request."""
        route = handler.route
        sglang = self.engine is EngineKind.SGLANG
        with self._lock:
            shutting_down = self._sigterm
        if shutting_down and not sglang and route not in _VLLM_OPEN_WHILE_SHUTTING_DOWN:
            if method != "GET":
                read_body(handler)
            send_json(handler, 503, _UNAVAILABLE)
            return
        if method == "GET":
            if route in ("/health", "/health_generate", "/ping"):
                with self._lock:
                    # SGLang's health answers 503 once SIGTERM set gracefully_exit.
                    ok = self._running and self._traps.healthy and not self._sigterm
                send_bytes(handler, 200 if ok else 503, b"", "text/plain; charset=utf-8")
            elif route == "/metrics":
                self._serve_metrics(handler)
            elif route == "/v1/models":
                send_json(
                    handler,
                    200,
                    serving.models_list(
                        kind=self.engine,
                        served=self.spec.served_model_names,
                        model_path=self.spec.model_path,
                        created=self._created,
                    ),
                )
            elif route.startswith("/v1/models/") and sglang:
                self._retrieve_model(handler, unquote(route[len("/v1/models/") :]))
            elif route == "/get_model_info":
                send_json(handler, 200, serving.model_info(model_path=self.spec.model_path))
            elif route in ("/get_server_info", "/server_info"):
                send_json(
                    handler,
                    200,
                    serving.server_info(
                        dp_ranks=self.spec.dp_ranks,
                        model_path=self.spec.model_path,
                        served=self.spec.served_model_names,
                    ),
                )
            elif route == "/version":
                send_json(handler, 200, {"version": "emulated"})
            else:
                raise self._no_route(route)
        elif method == "POST" or (method == "PUT" and route == "/generate" and sglang):
            if route == "/v1/completions":
                serving.completions(self, handler, chat=False)
            elif route == "/v1/chat/completions":
                serving.completions(self, handler, chat=True)
            elif route == "/generate" and sglang:
                serving.generate(self, handler)
            else:
                read_body(handler)
                raise self._no_route(route)
        else:
            if method != "GET":
                read_body(handler)
            raise self._no_route(route)

    def _no_route(self, route: str) -> Exception:
        """404 for a route this engine does not serve, 405 for one it serves with another
        method (FastAPI's defaults; see :data:`_POST_ROUTES`)."""
        sglang = self.engine is EngineKind.SGLANG
        known = route in _GET_ROUTES or route in _POST_ROUTES
        if route == "/generate" and not sglang:
            known = False  # vLLM has no /generate
        if route.startswith("/v1/models/") and sglang:
            known = True
        return intake.method_not_allowed() if known else intake.route_not_found()

    def _retrieve_model(self, handler: Handler, name: str) -> None:
        """SGLang's ``GET /v1/models/{name}``: the card, or 404 for a name not served."""
        if name not in self.spec.served_model_names:
            send_json(handler, 404, serving.model_not_found(self.engine, name))
            return
        card = serving.model_card(
            kind=self.engine, name=name, model_path=self.spec.model_path, created=self._created
        )
        send_json(handler, 200, card)

    def _serve_metrics(self, handler: Handler) -> None:
        """Answer ``/metrics`` in the current mode."""
        with self._lock:
            mode = self._traps.mode
            halt = self._halt
        if mode == "slow":
            if halt.wait(SLOW_METRICS_SECONDS):
                raise Cut
            mode = "normal"
        status, text = self.metrics_text(mode)
        send_bytes(handler, status, text.encode(), "text/plain; version=0.0.4; charset=utf-8")
