"""One emulated engine: one Pod's ``main`` container, with its lifecycle, its in-flight
accounting and its HTTP routes.

A request is admitted (in flight, in the front end), then enters the scheduler on the
least busy DP rank (counted as running), then ends completed or cut. vLLM counts prompt
tokens when a request is scheduled, SGLang when it finishes, as the real engines do.
A restart bumps a generation so that requests from before it no longer move the new
gauges and counters.

vLLM's gauges follow the scheduler at once (it sets them every engine step). SGLang's are
published only when its scheduler reports (:mod:`testbed.emulator.sglang_scheduler`: after
a prefill, every ``--decode-log-interval`` decode steps, at once when idle), and its
``GET /v1/loads`` answers each DP rank's last load snapshot. vLLM's ``GET /load`` answers the
API server process's in-flight count (:meth:`EngineEmulator.server_load`), which moves only
when the Pod's command line has ``--enable-server-load-tracking``.

A Pod deleted with a grace period ends as :mod:`testbed.emulator.termination` says the
kubelet and the real engine end it (preStop hook, SIGTERM handled the engine's way,
SIGKILL); :meth:`EngineEmulator.terminate` starts that.
"""

from __future__ import annotations

import collections
import contextlib
import json
import math
import os
import secrets
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from testbed.emulator import intake, serving
from testbed.emulator.engine_args import SglangArgs, VllmArgs, sglang_args, vllm_args
from testbed.emulator.exposition import LATENCY_BUCKETS, Family, Rank
from testbed.emulator.metrics_sglang import RankMetrics, TokenizerCounters, sglang_families
from testbed.emulator.metrics_vllm import vllm_families
from testbed.emulator.sglang_scheduler import (
    WARMUP_NEW_TOKENS,
    WARMUP_PROMPT_TOKENS,
    Published,
    SglangRank,
)
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
    send_chunked,
    send_json,
)

__all__ = ["EngineEmulator"]

_UNAVAILABLE = {"error": "Server is unavailable. Please try again later."}
"""vLLM's answer to a request after SIGTERM (``ServiceUnavailableMiddleware``, 503)."""

_VLLM_OPEN_WHILE_SHUTTING_DOWN = frozenset({"/metrics", "/live"})
"""The routes vLLM keeps answering after SIGTERM (liveness and observability)."""

_GET_ROUTES = frozenset(
    {"/health", "/health_generate", "/ping", "/metrics", "/v1/models", "/get_model_info"}
    | {"/get_server_info", "/server_info", "/version", "/load", "/v1/loads"}
)
_POST_ROUTES = frozenset({"/v1/completions", "/v1/chat/completions", "/generate"})
"""The emulated routes by method: another method on one of them is 405, an unknown route
404 (FastAPI's defaults, :func:`intake.method_not_allowed`, :func:`intake.route_not_found`).
SGLang's ``/generate`` takes ``PUT`` as well (``@app.api_route("/generate", methods=["POST",
"PUT"])``, sglang/srt/entrypoints/http_server.py). ``/load`` is vLLM's only, ``/v1/loads``
SGLang's only; SGLang 0.5.21 has no ``/get_load`` (0.5.18 still had it, as a deprecated
wrapper of ``/v1/loads``)."""

SGLANG_VERSION = "0.5.21"
"""What the emulated SGLang says it is (``/v1/loads``'s ``version``)."""
#: Requests an emulator keeps in its journal (the oldest are dropped first).
JOURNAL_MAX = 50_000

#: How often a silent engine's requests look whether the silence ended (``Traps.silent``).
SILENT_POLL_S = 0.1


class _Halt(threading.Event):
    """The end of one process lifetime: an event that a ``poll`` can wait on too (a pipe
    that becomes readable when it is set), so a request waiting on its client's socket
    wakes at once when the process stops. The pipe is closed when the last holder lets
    go of it."""

    def __init__(self) -> None:
        super().__init__()
        self._read, self._write = os.pipe()

    def fileno(self) -> int:
        """The end of the pipe that is readable once set."""
        return self._read

    def set(self) -> None:
        """Set the event and make the pipe readable."""
        super().set()
        with contextlib.suppress(OSError):
            os.write(self._write, b"x")

    def __del__(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)


@dataclass(eq=False)
class _Ticket:
    """One request's handle on the emulator state (hashable by identity: SGLang's
    scheduler holds it as the request's key)."""

    generation: int
    halt: _Halt
    hidden_seconds: float
    prompt_tokens: int
    generation_tokens: int
    duration: float
    stream: bool = False
    connection: socket.socket | None = None
    rank: int = -1
    started_at: float = 0.0
    #: Wall-clock time of admission (the fault campaign's journal; the audit log's clock).
    admitted_wall: float = 0.0


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
        if not math.isfinite(spec.step_seconds) or spec.step_seconds <= 0:
            raise ValueError("step_seconds must be a finite number > 0")
        args = tuple(spec.args)
        if not all(isinstance(a, str) for a in args):
            raise ValueError("args must be strings")
        spec.served_model_names = served
        spec.args = args
        # What the engine reads from its command line (raises where it would not start).
        self._vllm_args = (
            vllm_args(args, dp_ranks=spec.dp_ranks)
            if self.engine is EngineKind.VLLM
            else VllmArgs()
        )
        self._sglang_args = sglang_args(args) if self.engine is EngineKind.SGLANG else SglangArgs()
        self.spec = spec
        self._lock = threading.Lock()
        self._generation = 0
        self._ranks = [Rank() for _ in range(spec.dp_ranks)]
        # vLLM: each API server process's ``app.state.server_load_metrics``, and the next
        # process to accept a connection.
        self._server_load = [0] * max(1, self._vllm_args.api_server_count)
        self._server_load_counted = 0  # requests counted in this process (the status shows it)
        self._next_process = 0
        # SGLang: each DP rank's scheduler and the tokenizer manager's request counters.
        self._schedulers: list[SglangRank] = []
        self._tokenizer = TokenizerCounters()
        self._new_sglang_process()
        self._rr = 0
        self._created = time.time()
        self._in_flight = 0
        self._completed = 0
        self._aborted = 0
        self._restarts = 0
        self._boot_id = secrets.token_hex(8)
        self._traps = Traps()
        self._running = False
        self._halt = _Halt()
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
        # Every generation request's admission and end (wall clock) and whether it was
        # answered, for the fault campaign's oracle (``chaos.oracle``): kept across restarts.
        self._journal: collections.deque[tuple[float, float, bool]] = collections.deque(
            maxlen=JOURNAL_MAX
        )
        self._open: set[_Ticket] = set()

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
                self._halt = _Halt()
                self._running = True
                self._ended = threading.Event()
                self._started_at = time.monotonic()
                self._phase = Phase.RUNNING
                self._exit = None
                self._terminating = False
                self._sigterm = False
                self._rids = set()
                # A new process: its API servers count from 0.
                self._server_load = [0] * len(self._server_load)
                self._server_load_counted = 0
            self._servers = servers
            self._threads = []
            for srv in servers:
                thread = threading.Thread(
                    target=srv.serve_forever,
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
            # The handlers of the cut requests count them as aborted on their own threads: a
            # process that has exited has nothing in flight, so wait (bounded) for them.
            settle = time.monotonic() + 5.0
            while self.in_flight > 0 and time.monotonic() < settle:
                time.sleep(0.005)
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
            self._new_sglang_process()
            self._created = time.time()
            self._restarts += 1
            self._boot_id = secrets.token_hex(8)
            self._traps.clear()
        self.start()

    def _new_sglang_process(self) -> None:
        """SGLang's schedulers and tokenizer counters as a new process has them when it
        reports ready: after its warmup request, unless ``--skip-server-warmup``
        (``_execute_server_warmup``, sglang/srt/entrypoints/http_server.py: one
        ``/generate`` of ``"The capital city of France is"``, ``max_new_tokens`` 8, not
        streamed, one per DP rank; the server is Up only once it answered). The caller
        holds the lock, or the emulator is not shared yet."""
        self._tokenizer = TokenizerCounters()
        if self.engine is not EngineKind.SGLANG:
            self._schedulers = []
            return
        now = time.monotonic()
        opts = self._sglang_args
        self._schedulers = [
            SglangRank(
                dp_rank=i,
                step_seconds=self.spec.step_seconds,
                decode_log_interval=opts.decode_log_interval,
                publish_interval=opts.load_snapshot_publish_interval,
                overlap=opts.overlap_schedule,
                now=now,
            )
            for i in range(self.spec.dp_ranks)
        ]
        if opts.skip_server_warmup:
            return
        for sched in self._schedulers:
            sched.warmup(now)
            self._tokenizer.finished(
                streaming=False,
                prompt_tokens=WARMUP_PROMPT_TOKENS,
                generation_tokens=WARMUP_NEW_TOKENS,
                latency=WARMUP_NEW_TOKENS * self.spec.step_seconds,
            )

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

    def set_silent(self, silent: bool) -> None:
        """Stop (True) or resume (False) producing tokens (``Traps.silent``)."""
        with self._lock:
            self._traps.silent = bool(silent)

    def _silent(self) -> bool:
        with self._lock:
            return self._traps.silent

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

    def journal(self) -> dict[str, Any]:
        """Every generation request this emulator admitted: ``ended`` as ``[admitted,
        ended, ok]`` (wall clock, oldest first, the last ``JOURNAL_MAX``) and ``open``, the
        admission times of those still in flight."""
        with self._lock:
            return {
                "ended": [list(e) for e in self._journal],
                "open": sorted(t.admitted_wall for t in self._open),
            }

    def status(self) -> dict[str, Any]:
        """A JSON-able view of the emulator, its traps and its true (untrapped) state
        (SGLang: the counters include its warmup request; ``schedulers`` shows what each
        rank's scheduler last published)."""
        with self._lock:
            ranks = self._ranks
            tok = self._tokenizer
            self._advance_schedulers()
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
                "prompt_tokens": sum(r.prompt_tokens for r in ranks) + tok.prompt_tokens,
                "generation_tokens": sum(r.generation_tokens for r in ranks)
                + tok.generation_tokens,
                "finished_requests": sum(r.requests for r in ranks) + tok.requests,
                "args": list(self.spec.args),
                "server_load_tracking": self._vllm_args.server_load_tracking,
                "server_load": list(self._server_load),
                "server_load_counted": self._server_load_counted,
                "step_seconds": self.spec.step_seconds,
                "schedulers": [sched.view() for sched in self._schedulers],
                "traps": self._traps.as_json(),
            }

    def _admit(
        self,
        prompt_tokens: int,
        generation_tokens: int,
        duration: float,
        stream: bool,
        connection: socket.socket | None,
    ) -> _Ticket:
        """Accept a new request (it is now in flight, in the front end)."""
        with self._lock:
            if not self._running:
                raise Cut
            self._in_flight += 1
            ticket = _Ticket(
                self._generation,
                self._halt,
                self._traps.hidden,
                prompt_tokens,
                generation_tokens,
                duration,
                stream=stream,
                # vLLM notices a client that goes away at once (``with_cancellation``,
                # Starlette's ``StreamingResponse.listen_for_disconnect``) and aborts.
                connection=connection if self.engine is EngineKind.VLLM else None,
                admitted_wall=time.time(),
            )
            self._open.add(ticket)
            return ticket

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
            else:
                self._schedulers[best].admit(ticket, ticket.prompt_tokens, ticket.started_at)

    def _end(self, ticket: _Ticket, ok: bool) -> None:
        """The request finished (``ok``) or was cut."""
        with self._lock:
            self._in_flight -= 1
            self._open.discard(ticket)
            self._journal.append((ticket.admitted_wall, time.time(), ok))
            if ok:
                self._completed += 1
            else:
                self._aborted += 1
            if ticket.rank < 0 or ticket.generation != self._generation:
                return
            rank = self._ranks[ticket.rank]
            rank.running -= 1
            now = time.monotonic()
            if self.engine is EngineKind.SGLANG:
                self._schedulers[ticket.rank].finish(ticket, now)
                if ok:
                    self._tokenizer.finished(
                        streaming=ticket.stream,
                        prompt_tokens=ticket.prompt_tokens,
                        generation_tokens=ticket.generation_tokens,
                        latency=now - ticket.started_at,
                    )
                return
            if not ok:
                return
            rank.generation_tokens += ticket.generation_tokens
            rank.requests += 1
            latency = now - ticket.started_at
            rank.latency_sum += latency
            for i, bound in enumerate(LATENCY_BUCKETS):
                if latency <= bound:
                    rank.latency_buckets[i] += 1

    def _wait(self, ticket: _Ticket, seconds: float) -> None:
        """Sleep ``seconds``, or raise :class:`Cut` as soon as the emulator stops (or, for
        vLLM, as soon as the client goes away)."""
        conn = ticket.connection
        if conn is None or seconds <= 0:
            if ticket.halt.wait(seconds) if seconds > 0 else ticket.halt.is_set():
                raise Cut
            return
        deadline = time.monotonic() + seconds
        poller = select.poll()
        try:
            poller.register(conn, select.POLLIN | select.POLLERR | select.POLLHUP)
            poller.register(ticket.halt.fileno(), select.POLLIN)
        except (OSError, ValueError):
            raise Cut from None
        while True:
            if ticket.halt.is_set():
                raise Cut
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if not poller.poll(max(1, math.ceil(left * 1000))):
                continue
            if ticket.halt.is_set():
                raise Cut
            try:
                peeked = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                raise Cut from None
            if not peeked:
                raise Cut  # the client closed: vLLM cancels the handler
            # Bytes of a next (pipelined) request: nothing more to watch for.
            if ticket.halt.wait(max(0.0, deadline - time.monotonic())):
                raise Cut
            return

    @contextlib.contextmanager
    def admitted(
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        duration: float,
        stream: bool = False,
        connection: socket.socket | None = None,
    ) -> Iterator[serving.Spend]:
        """Admit a request, run its front-end phase, and count it as running inside.

        Yields what spends the request's duration (see :class:`serving.Spend`).
        ``stream`` is whether the answer streams (SGLang's ``is_streaming`` label);
        ``connection`` the client's socket (vLLM aborts a request whose client left).
        """
        ticket = self._admit(prompt_tokens, generation_tokens, duration, stream, connection)
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
            while self._silent():  # hung: nothing produced, the request stays in flight
                self._wait(ticket, SILENT_POLL_S)
            self._wait(ticket, step)
            if on_piece is not None:
                on_piece(index)

    # -- metrics -----------------------------------------------------------------------

    def _advance_schedulers(self) -> None:
        """Bring every SGLang scheduler's clock to now (the caller holds the lock)."""
        now = time.monotonic()
        for sched in self._schedulers:
            sched.advance(now)

    def _sglang_families(self) -> list[Family]:
        """SGLang's families: each rank's published gauges (a stale-gauges trap replaces
        them, on rank 0), its per-step token counter, the tokenizer's request counters."""
        with self._lock:
            self._advance_schedulers()
            stale = self._traps.stale
            ranks = []
            for i, sched in enumerate(self._schedulers):
                gauges = sched.published
                if stale is not None:
                    gauges = Published(*stale) if i == 0 else Published(0, 0)
                elif gauges is not None:
                    gauges = Published(gauges.running, gauges.queue, gauges.gen_throughput)
                ranks.append(RankMetrics(gauges, dict(sched.realtime)))
            tokenizer = self._tokenizer.copy()
        return sglang_families(
            model_name=self.spec.served_model_names[0], ranks=ranks, tokenizer=tokenizer
        )

    def _families(self) -> list[Family]:
        """The current families, with gauge traps applied."""
        if self.engine is EngineKind.SGLANG:
            return self._sglang_families()
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
        return vllm_families(ranks, running, waiting, created)

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
            elif route == "/load" and not sglang:
                self._serve_load(handler)
            elif route == "/v1/loads" and sglang:
                self._serve_loads(handler)
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
        if (route == "/generate" or route == "/v1/loads") and not sglang:
            known = False  # vLLM has no /generate, no /v1/loads
        if route == "/load" and sglang:
            known = False  # SGLang has no /load
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

    # -- vLLM: the API server's in-flight count ---------------------------------------

    def _process(self, handler: Handler) -> int:
        """The API server process that accepted this connection. vLLM's API servers
        (``run_multi_api_server``, vllm/entrypoints/cli/serve.py) all accept on one
        listening socket, so which one gets a connection is the kernel's choice: the
        emulator hands connections out in turn."""
        if handler.process is None:
            with self._lock:
                handler.process = self._next_process % len(self._server_load)
                self._next_process += 1
        return handler.process

    @contextlib.contextmanager
    def server_load(self, handler: Handler) -> Iterator[Callable[[], None]]:
        """vLLM's ``load_aware_call`` around one request handler
        (vllm/entrypoints/serve/utils/api_utils.py, 0.29.0; the same in 0.25.1), for the
        process that accepted the connection. Yields ``entered``, which the handler calls
        once FastAPI has validated the body (a refusal before it, 400/422, is never
        counted): with ``--enable-server-load-tracking`` the count goes up then, and down
        once when the block ends: after the last byte of the answer was written (vLLM adds
        the decrement as the response's background task, which Starlette runs after the
        body was sent: a stream counts until its last chunk), on an error (vLLM: at once on
        an exception), or when the client went away (``listen_for_disconnect``). Without
        the flag nothing is counted: ``/load`` stays 0."""
        process = self._process(handler)
        counted: threading.Event | None = None

        def entered() -> None:
            nonlocal counted
            with self._lock:
                if counted is None and self._vllm_args.server_load_tracking:
                    self._server_load[process] += 1
                    self._server_load_counted += 1
                    counted = self._ended

        try:
            yield entered
        finally:
            with self._lock:
                # Only in the process lifetime that counted it (a restart starts from 0).
                if counted is not None and counted is self._ended:
                    self._server_load[process] -= 1

    def _serve_load(self, handler: Handler) -> None:
        """vLLM's ``GET /load`` (``get_server_load_metrics``,
        vllm/entrypoints/serve/instrumentator/basic.py; registered whatever the flag):
        ``{"server_load": N}`` of the API server process that took the connection, as
        Starlette's ``JSONResponse`` renders it (no spaces)."""
        process = self._process(handler)
        with self._lock:
            load = self._server_load[process]
        body = json.dumps({"server_load": load}, separators=(",", ":")).encode()
        send_bytes(handler, 200, body, "application/json")

    # -- SGLang: the load snapshots ---------------------------------------------------------

    def _serve_loads(self, handler: Handler) -> None:
        """SGLang's ``GET /v1/loads`` (``get_loads``, sglang/srt/entrypoints/v1_loads.py,
        0.5.21): every DP rank's last published load snapshot (see
        :mod:`testbed.emulator.sglang_scheduler` for when one is published), read by
        ``TokenizerManager.get_loads`` from shared memory. ``dp_rank`` filters (out of
        range: no loads), ``include`` picks sections (``core`` alone: no sections; an
        unknown one fails in ``LoadSnapshot.to_dict`` with a ``ValueError`` the route does
        not catch: 500), ``format=prometheus`` answers the text format
        (``_format_loads_prometheus``)."""
        query = parse_qs(urlsplit(handler.path).query, keep_blank_values=True)
        dp_text = query.get("dp_rank", [None])[-1]
        include_text = query.get("include", [None])[-1]
        fmt_text = query.get("format", [None])[-1]
        dp_rank: int | None = None
        if dp_text is not None:
            try:
                dp_rank = int(dp_text)
            except ValueError:
                raise intake.sglang_query_invalid("dp_rank", dp_text) from None
        include = [s.strip() for s in include_text.split(",")] if include_text else None
        with self._lock:
            self._advance_schedulers()
            snapshots = [sched.snapshot() for sched in self._schedulers]
        if dp_rank is not None:
            snapshots = [s for s in snapshots if s["dp_rank"] == dp_rank]
        sections = {"memory": "memory", "disaggregation": "disagg", "queues": "queues"}
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        wanted = set(include) if include else None
        loads = []
        for snap in snapshots:
            if wanted is not None and "all" not in wanted:
                if not wanted <= valid:
                    raise intake.sglang_internal_error()
                for key, name in sections.items():
                    if name not in wanted:
                        snap.pop(key, None)
            loads.append(snap)
        if fmt_text == "prometheus":
            send_bytes(
                handler,
                200,
                _loads_prometheus(loads).encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
            return
        answer = {
            "timestamp": _utc_now_iso(),
            "version": SGLANG_VERSION,
            "accelerator": "NVIDIA H100 80GB HBM3",
            "num_accelerators": 1,
            "loads": loads,
        }
        send_bytes(
            handler, 200, json.dumps(answer, separators=(",", ":")).encode(), "application/json"
        )

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
        # Chunked, as the engines' uvicorn sends prometheus_client's answer (no length).
        send_chunked(handler, status, text.encode(), "text/plain; version=0.0.4; charset=utf-8")


def _utc_now_iso() -> str:
    """``datetime.now(timezone.utc).isoformat()``."""
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat()


def _loads_prometheus(loads: list[dict[str, Any]]) -> str:
    """``_format_loads_prometheus`` (sglang/srt/entrypoints/v1_loads.py): one gauge per
    numeric field, ``sglang_<field>`` (sections: ``sglang_<section>_<field>``, ``disagg``
    for ``disaggregation``), labelled by ``dp_rank``."""
    prefixes = {"disaggregation": "disagg"}
    samples: dict[str, list[tuple[int, Any]]] = {}
    for load in loads:
        rest = dict(load)
        dp_rank = rest.pop("dp_rank")
        for key, value in rest.items():
            if isinstance(value, dict):
                prefix = prefixes.get(key, key)
                for sub, sub_value in value.items():
                    if isinstance(sub_value, int | float):
                        samples.setdefault(f"sglang_{prefix}_{sub}", []).append(
                            (dp_rank, sub_value)
                        )
            elif isinstance(value, int | float):
                samples.setdefault(f"sglang_{key}", []).append((dp_rank, value))
    lines = []
    for name, values in samples.items():
        lines.append(f"# TYPE {name} gauge")
        for dp_rank, value in values:
            lines.append(f'{name}{{dp_rank="{dp_rank}"}} {value}')
    return "\n".join(lines) + "\n"
