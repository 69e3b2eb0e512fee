"""Engine emulator: many emulated LLM engine Pods (vLLM, SGLang) in one process.

Test support, not product. Each :class:`EngineEmulator` stands for one Pod's ``main``
container: it serves the engine's HTTP API on the Pod address and the same routes on
``127.0.0.1:<metrics_port>`` (the in-container one-shot reads metrics over loopback).
Requests take a configurable time and move the engine's real gauges and counters
(Prometheus text exposition, shaped like the real engines' output). Known engine traps
can be switched on per emulator: stale gauges, requests hidden in the HTTP front end,
and broken ``/metrics`` answers.

:class:`EmulatorHub` holds many emulators and is driven over a small JSON control API,
so a test process in another network namespace can add Pods, set traps and delete Pods.
Run a hub with ``python -m testbed.emulator --control-host H --control-port P``.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import math
import re
import secrets
import signal
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType
from typing import Any, Protocol, cast
from urllib.parse import unquote, urlsplit

__all__ = [
    "HUGE_METRICS_BYTES",
    "METRICS_MODES",
    "MODEL_NAME",
    "SLOW_METRICS_SECONDS",
    "EmulatorHub",
    "EngineEmulator",
    "EngineKind",
    "PodEngineSpec",
    "main",
]

MODEL_NAME = "emulated"
"""The model name every emulated engine serves and labels its series with."""

SLOW_METRICS_SECONDS = 4.0
"""How long ``/metrics`` stalls in the ``slow`` mode (more than the 2 s read timeout)."""

HUGE_METRICS_BYTES = 2 * 1024 * 1024 + 128 * 1024
"""Minimum body size of ``/metrics`` in the ``huge`` mode (over 2 MiB)."""

METRICS_MODES = frozenset(
    {
        "normal",
        "slow",
        "huge",
        "malformed",
        "nan",
        "missing",
        "negative",
        "nonnumeric",
        "empty",
        "error",
    }
)
"""Base names of the ``/metrics`` modes. ``missing``, ``nan``, ``negative`` and
``nonnumeric`` also take a series: ``"missing:vllm:prompt_tokens_total"``."""

_MAX_BODY = 16 * 1024 * 1024
_DEFAULT_MAX_TOKENS = 16
_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_DEV_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


class EngineKind(StrEnum):
    """Which engine an emulator imitates."""

    VLLM = "vLLM"
    SGLANG = "SGLang"


@dataclass
class PodEngineSpec:
    """One emulated Pod's engine.

    ``serve_host``/``serve_port`` is the Pod address the engine API listens on;
    ``metrics_port`` is the port on ``127.0.0.1`` serving the same routes. A port of 0
    binds a free port (read it back from :attr:`EngineEmulator.serve_port`).
    """

    name: str
    engine: EngineKind
    serve_host: str
    serve_port: int
    metrics_port: int
    dp_ranks: int = 1
    request_seconds: float = 1.0


# --------------------------------------------------------------------------------------
# HTTP plumbing shared by the engines and the hub


class _Cut(Exception):
    """The emulated process went away: close the connection without a response."""


class _BadRequest(Exception):
    """The client sent something the emulated API rejects (HTTP 400)."""


class _App(Protocol):
    """What a server dispatches requests to."""

    def handle(self, handler: _Handler, method: str) -> None:
        """Answer one request on ``handler``."""


class _Server(ThreadingHTTPServer):
    """A threaded HTTP server that remembers its open connections so they can be cut."""

    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], app: _App) -> None:
        """Bind ``address`` (IPv4 or IPv6 literal or name) and dispatch to ``app``."""
        self.app = app
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        """The bound port."""
        return int(self.server_address[1])

    def track(self, conn: socket.socket) -> None:
        """Remember an accepted connection."""
        with self._conns_lock:
            self._conns.add(conn)

    def untrack(self, conn: socket.socket) -> None:
        """Forget a connection that is being closed."""
        with self._conns_lock:
            self._conns.discard(conn)

    def cut_all(self) -> None:
        """Shut down every open connection (in-flight responses end incomplete)."""
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def server_bind(self) -> None:
        """Bind without the reverse DNS lookup ``HTTPServer.server_bind`` does."""
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = int(self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Stay quiet: cut connections and client disconnects are expected here."""


class _Handler(BaseHTTPRequestHandler):
    """Request handler that hands every method to the server's app."""

    protocol_version = "HTTP/1.1"
    server_version = "emulated-engine/1"
    sys_version = ""

    @property
    def srv(self) -> _Server:
        """The owning server, typed."""
        return cast(_Server, self.server)

    def setup(self) -> None:
        """Register the connection so a stop can cut it."""
        super().setup()
        self.srv.track(self.connection)

    def finish(self) -> None:
        """Unregister the connection."""
        self.srv.untrack(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        """Do not log each request."""

    def _dispatch(self, method: str) -> None:
        """Run the app; on a cut, close the connection without writing anything more."""
        try:
            self.srv.app.handle(self, method)
        except _Cut:
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
        except _BadRequest as exc:
            send_json(self, 400, _error_body(str(exc), 400))
        except OSError:
            self.close_connection = True

    def do_GET(self) -> None:
        """Dispatch GET."""
        self._dispatch("GET")

    def do_POST(self) -> None:
        """Dispatch POST."""
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        """Dispatch DELETE."""
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        """Dispatch PUT."""
        self._dispatch("PUT")

    @property
    def route(self) -> str:
        """The request path without the query string."""
        return urlsplit(self.path).path


def _error_body(message: str, code: int) -> dict[str, Any]:
    """An OpenAI-style error object."""
    return {"object": "error", "message": message, "type": "BadRequestError", "code": code}


def send_bytes(
    handler: _Handler,
    status: int,
    body: bytes,
    content_type: str,
    headers: dict[str, str] | None = None,
) -> None:
    """Write a complete response with a Content-Length."""
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


def send_json(handler: _Handler, status: int, obj: Any) -> None:
    """Write a JSON response."""
    send_bytes(handler, status, json.dumps(obj).encode(), "application/json")


def read_body(handler: _Handler) -> bytes:
    """Read the request body (Content-Length or chunked)."""
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        total = 0
        while True:
            line = handler.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError as exc:
                raise _BadRequest("bad chunked body") from exc
            if size == 0:
                while handler.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            total += size
            if total > _MAX_BODY:
                raise _BadRequest("body too large")
            parts.append(handler.rfile.read(size))
            handler.rfile.readline(1024)
    length_text = handler.headers.get("Content-Length", "0")
    try:
        length = int(length_text)
    except ValueError as exc:
        raise _BadRequest("bad Content-Length") from exc
    if length < 0 or length > _MAX_BODY:
        raise _BadRequest("bad Content-Length")
    return handler.rfile.read(length) if length else b""


def read_json(handler: _Handler) -> dict[str, Any]:
    """Read a JSON object body (an empty body is ``{}``)."""
    raw = read_body(handler)
    if not raw.strip():
        return {}
    try:
        obj = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise _BadRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise _BadRequest("body must be a JSON object")
    return obj


def _start_stream(handler: _Handler) -> None:
    """Send the headers of a chunked Server-Sent-Events response."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Transfer-Encoding", "chunked")
    handler.end_headers()


def _write_chunk(handler: _Handler, data: bytes) -> None:
    """Write one HTTP chunk."""
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))


def _write_event(handler: _Handler, obj: Any) -> None:
    """Write one SSE ``data:`` event as a chunk."""
    payload = obj if isinstance(obj, str) else json.dumps(obj)
    _write_chunk(handler, f"data: {payload}\n\n".encode())


def _end_stream(handler: _Handler) -> None:
    """Write ``data: [DONE]`` and the last chunk."""
    _write_event(handler, "[DONE]")
    handler.wfile.write(b"0\r\n\r\n")


def _int_field(obj: dict[str, Any], key: str, default: int, minimum: int = 0) -> int:
    """An integer field (bools rejected) or its default."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _BadRequest(f"{key} must be an integer >= {minimum}")
    return value


def _seconds_field(obj: dict[str, Any], key: str) -> float | None:
    """A non-negative, finite number of seconds, or None when absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BadRequest(f"{key} must be a number")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise _BadRequest(f"{key} must be a finite number >= 0")
    return seconds


def _count_tokens(value: Any) -> int:
    """A rough token count of a prompt: words of text, or the length of a token list."""
    if isinstance(value, str):
        return max(1, len(value.split()))
    if isinstance(value, list):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return max(1, len(value))
        return max(1, sum(_count_tokens(v) for v in value))
    if isinstance(value, dict):
        return _count_tokens(value.get("content", ""))
    return 1


def _fmt(value: float) -> str:
    """Format a sample value the way prometheus_client does (Go-style exponents)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _labels(labels: dict[str, str]) -> str:
    """Render a label set, names sorted like prometheus_client."""
    inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
    return "{" + inner + "}" if inner else ""


# --------------------------------------------------------------------------------------
# Metric state and exposition


@dataclass
class _Rank:
    """Metric state of one DP engine rank (reset by a container restart)."""

    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    latency_sum: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(_LATENCY_BUCKETS))


@dataclass
class _Family:
    """One metric family of the exposition: its name, help, type and samples."""

    name: str
    help: str
    type: str
    samples: list[tuple[str, dict[str, str], float | str]]


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


def _histogram(name: str, help_text: str, per_rank: list[tuple[dict[str, str], _Rank]]) -> _Family:
    """A latency histogram family over the ranks."""
    samples: list[tuple[str, dict[str, str], float | str]] = []
    for labels, rank in per_rank:
        for bound, count in zip(_LATENCY_BUCKETS, rank.latency_buckets, strict=True):
            samples.append((f"{name}_bucket", {**labels, "le": _fmt(bound)}, float(count)))
        samples.append((f"{name}_bucket", {**labels, "le": "+Inf"}, float(rank.requests)))
        samples.append((f"{name}_count", labels, float(rank.requests)))
        samples.append((f"{name}_sum", labels, rank.latency_sum))
    return _Family(name, help_text, "histogram", samples)


def _vllm_families(
    ranks: list[_Rank], running: list[float], waiting: list[float], created: float
) -> list[_Family]:
    """vLLM's series: one label set per DP engine."""
    labels = [{"engine": str(i), "model_name": MODEL_NAME} for i in range(len(ranks))]

    def per(values: list[float]) -> list[tuple[dict[str, str], float]]:
        return list(zip(labels, values, strict=True))

    def gauge(name: str, help_text: str, values: list[float]) -> _Family:
        return _Family(name, help_text, "gauge", [(name, lb, v) for lb, v in per(values)])

    def counter(name: str, help_text: str, values: list[float]) -> list[_Family]:
        total = f"{name}_total"
        return [
            _Family(total, help_text, "counter", [(total, lb, v) for lb, v in per(values)]),
            _Family(
                f"{name}_created",
                help_text,
                "gauge",
                [(f"{name}_created", lb, created) for lb in labels],
            ),
        ]

    success_labels = [{**lb, "finished_reason": "length"} for lb in labels]
    families = [
        gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", running
        ),
        gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
        gauge(
            "vllm:gpu_cache_usage_perc",
            "GPU KV-cache usage. 1 means 100 percent usage.",
            [min(1.0, max(0.0, r) * 0.01) for r in running],
        ),
        *counter(
            "vllm:num_preemptions",
            "Cumulative number of preemption from the engine.",
            [0.0] * len(ranks),
        ),
        *counter(
            "vllm:prompt_tokens",
            "Number of prefill tokens processed.",
            [float(r.prompt_tokens) for r in ranks],
        ),
        *counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            [float(r.generation_tokens) for r in ranks],
        ),
        _Family(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            "counter",
            [
                ("vllm:request_success_total", lb, float(r.requests))
                for lb, r in zip(success_labels, ranks, strict=True)
            ],
        ),
        _histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            list(zip(labels, ranks, strict=True)),
        ),
    ]
    return families


def _sglang_families(
    ranks: list[_Rank], running: list[float], waiting: list[float]
) -> list[_Family]:
    """SGLang's series: one label set per DP rank (``dp_rank`` only when DP > 1)."""
    base = {"model_name": MODEL_NAME, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    if len(ranks) > 1:
        labels = [{**base, "dp_rank": str(i)} for i in range(len(ranks))]
    else:
        labels = [dict(base)]

    def fam(name: str, typ: str, help_text: str, values: list[float]) -> _Family:
        return _Family(
            name, help_text, typ, [(name, lb, v) for lb, v in zip(labels, values, strict=True)]
        )

    zeros = [0.0] * len(ranks)
    return [
        fam("sglang:num_running_reqs", "gauge", "The number of running requests.", running),
        fam(
            "sglang:num_used_tokens",
            "gauge",
            "The number of used tokens.",
            [max(0.0, r) * 64.0 for r in running],
        ),
        fam(
            "sglang:token_usage",
            "gauge",
            "The token usage.",
            [min(1.0, max(0.0, r) * 0.01) for r in running],
        ),
        fam("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", zeros),
        fam(
            "sglang:num_queue_reqs",
            "gauge",
            "The number of requests in the waiting queue.",
            waiting,
        ),
        fam(
            "sglang:num_prefill_bootstrap_queue_reqs",
            "gauge",
            "The number of requests in the prefill bootstrap queue.",
            zeros,
        ),
        fam(
            "sglang:num_prefill_inflight_queue_reqs",
            "gauge",
            "The number of requests in the prefill inflight queue.",
            zeros,
        ),
        fam(
            "sglang:num_decode_prealloc_queue_reqs",
            "gauge",
            "The number of requests in the decode prealloc queue.",
            zeros,
        ),
        fam(
            "sglang:num_decode_transfer_queue_reqs",
            "gauge",
            "The number of requests in the decode transfer queue.",
            zeros,
        ),
        fam("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", zeros),
        fam(
            "sglang:prompt_tokens_total",
            "counter",
            "Number of prefill tokens processed.",
            [float(r.prompt_tokens) for r in ranks],
        ),
        fam(
            "sglang:generation_tokens_total",
            "counter",
            "Number of generation tokens processed.",
            [float(r.generation_tokens) for r in ranks],
        ),
        fam(
            "sglang:num_requests_total",
            "counter",
            "Number of requests processed.",
            [float(r.requests) for r in ranks],
        ),
        _histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            list(zip(labels, ranks, strict=True)),
        ),
    ]


def _render(families: list[_Family]) -> str:
    """Prometheus text exposition (format 0.0.4) of ``families``."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {fam.help}\n")
        out.append(f"# TYPE {fam.name} {fam.type}\n")
        for name, labels, value in fam.samples:
            text = value if isinstance(value, str) else _fmt(value)
            out.append(f"{name}{_labels(labels)} {text}\n")
    return "".join(out)


_PADDING_CACHE: dict[str, str] = {}
_PADDING_LOCK = threading.Lock()


def _padding(prefix: str) -> str:
    """A valid but large extra family, so a body goes over 2 MiB (built once)."""
    with _PADDING_LOCK:
        cached = _PADDING_CACHE.get(prefix)
        if cached is None:
            name = f"{prefix}:emulated_padding_info"
            pad = "x" * 1000
            lines = [
                f"# HELP {name} Padding that makes the exposition large.\n",
                f"# TYPE {name} gauge\n",
            ]
            size = 0
            index = 0
            while size < HUGE_METRICS_BYTES:
                line = f'{name}{{index="{index}",pad="{pad}"}} 1.0\n'
                lines.append(line)
                size += len(line)
                index += 1
            cached = "".join(lines)
            _PADDING_CACHE[prefix] = cached
        return cached


# --------------------------------------------------------------------------------------
# The engine emulator


class EngineEmulator:
    """One emulated engine (one Pod's ``main`` container).

    Serves on ``(serve_host, serve_port)`` and on ``("127.0.0.1", metrics_port)``:
    ``/health``, ``/metrics``, ``/v1/models``, ``/get_model_info``, ``/get_server_info``,
    ``/v1/completions``, ``/v1/chat/completions`` and, for SGLang, ``/generate`` and
    ``/health_generate``. Thread-safe.
    """

    def __init__(self, spec: PodEngineSpec) -> None:
        """Prepare (but do not start) an emulator for ``spec``."""
        if spec.dp_ranks < 1:
            raise ValueError("dp_ranks must be >= 1")
        if not math.isfinite(spec.request_seconds) or spec.request_seconds < 0:
            raise ValueError("request_seconds must be a finite number >= 0")
        self.spec = spec
        self.engine = EngineKind(spec.engine)
        self._lock = threading.Lock()
        self._generation = 0
        self._ranks = [_Rank() for _ in range(spec.dp_ranks)]
        self._rr = 0
        self._created = time.time()
        self._in_flight = 0
        self._completed = 0
        self._aborted = 0
        self._restarts = 0
        self._boot_id = secrets.token_hex(8)
        self._stale: tuple[int, int] | None = None
        self._hidden = 0.0
        self._mode = "normal"
        self._healthy = True
        self._running = False
        self._halt = threading.Event()
        self._servers: list[_Server] = []
        self._threads: list[threading.Thread] = []
        self._serve_port = spec.serve_port
        self._metrics_port = spec.metrics_port
        self._life = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Bind both addresses and serve. A no-op when already started."""
        with self._life:
            if self._running:
                return
            servers: list[_Server] = []
            try:
                servers.append(_Server((self.spec.serve_host, self._serve_port), self))
                same = self.spec.serve_host == "127.0.0.1" and self._metrics_port == servers[0].port
                if not same:
                    servers.append(_Server(("127.0.0.1", self._metrics_port), self))
            except OSError:
                for srv in servers:
                    srv.server_close()
                raise
            self._serve_port = servers[0].port
            self._metrics_port = servers[-1].port
            with self._lock:
                self._halt = threading.Event()
                self._running = True
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

    def restart(self) -> None:
        """Simulate a container restart: cut requests, zero gauges/counters, clear traps.

        The same ports are bound again. ``in_flight``/``completed`` are this object's
        lifetime bookkeeping and are not reset; requests cut by the restart end as aborted.
        """
        self.stop()
        with self._lock:
            self._generation += 1
            self._ranks = [_Rank() for _ in range(self.spec.dp_ranks)]
            self._created = time.time()
            self._restarts += 1
            self._boot_id = secrets.token_hex(8)
            self._clear_traps_locked()
        self.start()

    @property
    def is_running(self) -> bool:
        """True between start and stop."""
        return self._running

    @property
    def serve_port(self) -> int:
        """The bound serving port (the spec's, or the one picked for port 0)."""
        return self._serve_port

    @property
    def metrics_port(self) -> int:
        """The bound loopback metrics port."""
        return self._metrics_port

    # -- traps -------------------------------------------------------------------------

    def set_stale_gauges(self, running: int, waiting: int = 0) -> None:
        """Freeze the running/waiting gauges at these values (reported on rank 0)."""
        if running < 0 or waiting < 0:
            raise ValueError("stale gauges must be >= 0")
        with self._lock:
            self._stale = (int(running), int(waiting))

    def set_frontend_hidden(self, seconds: float) -> None:
        """Make each new request spend ``seconds`` uncounted in the HTTP front end."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("seconds must be a finite number >= 0")
        with self._lock:
            self._hidden = float(seconds)

    def set_metrics_mode(self, mode: str) -> None:
        """Set how ``/metrics`` answers; see :data:`METRICS_MODES`."""
        base, _, series = mode.partition(":")
        if base not in METRICS_MODES or (
            series and base not in {"missing", "nan", "negative", "nonnumeric"}
        ):
            raise ValueError(f"unknown metrics mode {mode!r}")
        with self._lock:
            self._mode = mode

    def set_healthy(self, healthy: bool) -> None:
        """Make ``/health`` answer 200 (True) or 503 (False)."""
        with self._lock:
            self._healthy = bool(healthy)

    def set_request_seconds(self, seconds: float) -> None:
        """Change the default duration of new requests."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError("seconds must be a finite number >= 0")
        with self._lock:
            self.spec.request_seconds = float(seconds)

    def clear_traps(self) -> None:
        """Back to normal behaviour (stale gauges, front-end delay, metrics mode, health)."""
        with self._lock:
            self._clear_traps_locked()

    def _clear_traps_locked(self) -> None:
        """Clear the traps; the caller holds the lock."""
        self._stale = None
        self._hidden = 0.0
        self._mode = "normal"
        self._healthy = True

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
                "state": "running" if self._running else "stopped",
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
                "traps": {
                    "stale_gauges": list(self._stale) if self._stale is not None else None,
                    "frontend_hidden": self._hidden,
                    "metrics_mode": self._mode,
                    "healthy": self._healthy,
                },
            }

    def _admit(self, prompt_tokens: int, generation_tokens: int, duration: float) -> _Ticket:
        """Accept a new request (it is now in flight, in the front end)."""
        with self._lock:
            if not self._running:
                raise _Cut
            self._in_flight += 1
            return _Ticket(
                self._generation,
                self._halt,
                self._hidden,
                prompt_tokens,
                generation_tokens,
                duration,
            )

    def _begin(self, ticket: _Ticket) -> None:
        """The request enters the scheduler: counted as running on the least busy rank."""
        with self._lock:
            if ticket.halt.is_set():
                raise _Cut
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
            for i, bound in enumerate(_LATENCY_BUCKETS):
                if latency <= bound:
                    rank.latency_buckets[i] += 1

    def _wait(self, ticket: _Ticket, seconds: float) -> None:
        """Sleep ``seconds``, or raise :class:`_Cut` as soon as the emulator stops."""
        if ticket.halt.wait(seconds) if seconds > 0 else ticket.halt.is_set():
            raise _Cut

    @contextlib.contextmanager
    def _request(
        self, prompt_tokens: int, generation_tokens: int, duration: float
    ) -> Iterator[_Ticket]:
        """Admit a request, run its front-end phase, and count it as running inside."""
        ticket = self._admit(prompt_tokens, generation_tokens, duration)
        ok = False
        try:
            self._wait(ticket, ticket.hidden_seconds)
            self._begin(ticket)
            yield ticket
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

    def _families(self) -> list[_Family]:
        """The current families, with gauge traps applied."""
        with self._lock:
            ranks = [
                _Rank(
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
            stale = self._stale
            created = self._created
        running = [float(r.running) for r in ranks]
        waiting = [float(r.waiting) for r in ranks]
        if stale is not None:
            running = [float(stale[0])] + [0.0] * (len(ranks) - 1)
            waiting = [float(stale[1])] + [0.0] * (len(ranks) - 1)
        if self.engine is EngineKind.VLLM:
            return _vllm_families(ranks, running, waiting, created)
        return _sglang_families(ranks, running, waiting)

    def _default_series(self, base: str) -> str:
        """The series a ``missing``/``nan``/``negative``/``nonnumeric`` mode acts on."""
        if self.engine is EngineKind.VLLM:
            return "vllm:num_requests_waiting" if base == "missing" else "vllm:num_requests_running"
        return "sglang:num_queue_reqs" if base == "missing" else "sglang:num_running_reqs"

    def metrics_text(self, mode: str | None = None) -> tuple[int, str]:
        """The ``/metrics`` status and body for ``mode`` (default: the current mode).

        ``slow`` is not applied here (the handler stalls before calling this).
        """
        if mode is None:
            with self._lock:
                mode = self._mode
        base, _, series = mode.partition(":")
        series = series or self._default_series(base)
        if base == "error":
            return 500, "Internal Server Error\n"
        if base == "empty":
            return 200, ""
        families = self._families()
        if base == "missing":
            families = [f for f in families if f.name != series]
        elif base in {"nan", "negative", "nonnumeric"}:
            bad: float | str = {"nan": math.nan, "negative": -1.0}.get(base, "idle")
            for fam in families:
                if fam.name == series and fam.samples:
                    name, labels, _ = fam.samples[0]
                    fam.samples[0] = (name, labels, bad)
        text = _render(families)
        if base == "huge":
            prefix = "vllm" if self.engine is EngineKind.VLLM else "sglang"
            text += _padding(prefix)
        elif base == "malformed":
            cut = text.index("}")
            text = (
                text[:cut]
                + " 0.0\n"
                + "<html><head><title>502 Bad Gateway</title></head>\n"
                + 'metric without value\n{broken="\n'
            )
        return 200, text

    # -- HTTP --------------------------------------------------------------------------

    def handle(self, handler: _Handler, method: str) -> None:
        """Answer one engine API request."""
        route = handler.route
        sglang = self.engine is EngineKind.SGLANG
        if method == "GET":
            if route in ("/health", "/health_generate", "/ping"):
                with self._lock:
                    ok = self._running and self._healthy
                send_bytes(handler, 200 if ok else 503, b"", "text/plain; charset=utf-8")
            elif route == "/metrics":
                self._serve_metrics(handler)
            elif route == "/v1/models":
                send_json(
                    handler,
                    200,
                    {
                        "object": "list",
                        "data": [
                            {
                                "id": MODEL_NAME,
                                "object": "model",
                                "created": int(self._created),
                                "owned_by": "sglang" if sglang else "vllm",
                                "root": MODEL_NAME,
                                "max_model_len": 4096,
                            }
                        ],
                    },
                )
            elif route == "/get_model_info":
                send_json(
                    handler,
                    200,
                    {"model_path": MODEL_NAME, "tokenizer_path": MODEL_NAME, "is_generation": True},
                )
            elif route in ("/get_server_info", "/server_info"):
                send_json(
                    handler,
                    200,
                    {
                        "model_path": MODEL_NAME,
                        "dp_size": self.spec.dp_ranks,
                        "version": "emulated",
                    },
                )
            elif route == "/version":
                send_json(handler, 200, {"version": "emulated"})
            else:
                send_json(handler, 404, _error_body(f"no route {route}", 404))
        elif method == "POST":
            if route == "/v1/completions":
                self._completions(handler, chat=False)
            elif route == "/v1/chat/completions":
                self._completions(handler, chat=True)
            elif route == "/generate" and sglang:
                self._generate(handler)
            else:
                read_body(handler)
                send_json(handler, 404, _error_body(f"no route {route}", 404))
        else:
            send_json(handler, 405, _error_body(f"method {method} not allowed", 405))

    def _serve_metrics(self, handler: _Handler) -> None:
        """Answer ``/metrics`` in the current mode."""
        with self._lock:
            mode = self._mode
            halt = self._halt
        if mode == "slow":
            if halt.wait(SLOW_METRICS_SECONDS):
                raise _Cut
            mode = "normal"
        status, text = self.metrics_text(mode)
        send_bytes(handler, status, text.encode(), "text/plain; version=0.0.4; charset=utf-8")

    def _duration(self, body: dict[str, Any], generation_tokens: int) -> float:
        """How long a request takes: 0 for a 1-token request, else emulate_seconds/default."""
        override = _seconds_field(body, "emulate_seconds")
        if generation_tokens <= 1:
            return 0.0
        if override is not None:
            return override
        with self._lock:
            return self.spec.request_seconds

    def _completions(self, handler: _Handler, chat: bool) -> None:
        """OpenAI ``/v1/completions`` and ``/v1/chat/completions``."""
        body = read_json(handler)
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _BadRequest("messages must be a non-empty list")
            prompt_tokens = _count_tokens(messages)
            max_tokens = _int_field(
                body, "max_completion_tokens", _int_field(body, "max_tokens", _DEFAULT_MAX_TOKENS)
            )
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str | list):
                raise _BadRequest("prompt must be a string or a list")
            prompt_tokens = _count_tokens(prompt)
            max_tokens = _int_field(body, "max_tokens", _DEFAULT_MAX_TOKENS)
        stream = bool(body.get("stream", False))
        model = body.get("model") if isinstance(body.get("model"), str) else MODEL_NAME
        header_rid = handler.headers.get("X-Request-Id")
        body_rid = body.get("request_id")
        if self.engine is EngineKind.VLLM:
            rid = header_rid or (body_rid if isinstance(body_rid, str) and body_rid else None)
            prefix = "chatcmpl-" if chat else "cmpl-"
            resp_id = prefix + (rid or secrets.token_hex(16))
        else:
            srid = body.get("rid")
            resp_id = srid if isinstance(srid, str) and srid else secrets.token_hex(16)
        duration = self._duration(body, max_tokens)
        created = int(time.time())
        obj = "chat.completion" if chat else "text_completion"
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": max_tokens,
            "total_tokens": prompt_tokens + max_tokens,
        }
        pieces = max(1, min(max_tokens, 8)) if stream else 1
        texts = _split_text(max_tokens, pieces)

        def choice(text: str, final: bool, delta: bool) -> dict[str, Any]:
            reason = "length" if final else None
            if chat:
                key = "delta" if delta else "message"
                return {
                    "index": 0,
                    key: {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": reason,
                }
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

        def chunk(payload: dict[str, Any]) -> dict[str, Any]:
            return {
                "id": resp_id,
                "object": obj + (".chunk" if chat else ""),
                "created": created,
                "model": model,
                **payload,
            }

        with self._request(prompt_tokens, max_tokens, duration) as ticket:
            if stream:
                _start_stream(handler)

                def on_piece(index: int) -> None:
                    if index < pieces - 1:
                        _write_event(
                            handler,
                            chunk({"choices": [choice(texts[index], final=False, delta=True)]}),
                        )

                self._run(ticket, pieces, on_piece)
            else:
                self._run(ticket, 1)
        if not stream:
            send_json(
                handler,
                200,
                {
                    "id": resp_id,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice("".join(texts), final=True, delta=False)],
                    "usage": usage,
                },
            )
            return
        last: dict[str, Any] = {"choices": [choice(texts[-1], final=True, delta=True)]}
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            last["usage"] = usage
        _write_event(handler, chunk(last))
        _end_stream(handler)

    def _generate(self, handler: _Handler) -> None:
        """SGLang native ``/generate``."""
        body = read_json(handler)
        if "text" in body:
            text = body["text"]
            if not isinstance(text, str):
                raise _BadRequest("text must be a string (batches are not emulated)")
            prompt_tokens = _count_tokens(text)
        elif isinstance(body.get("input_ids"), list):
            prompt_tokens = _count_tokens(body["input_ids"])
        else:
            raise _BadRequest("text or input_ids is required")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise _BadRequest("sampling_params must be an object")
        max_new = _int_field(params, "max_new_tokens", _DEFAULT_MAX_TOKENS)
        srid = body.get("rid")
        rid = srid if isinstance(srid, str) and srid else secrets.token_hex(16)
        stream = bool(body.get("stream", False))
        duration = self._duration(body, max_new)
        pieces = max(1, min(max_new, 8)) if stream else 1
        texts = _split_text(max_new, pieces)
        started = time.monotonic()

        def result(upto: int, final: bool) -> dict[str, Any]:
            done = max_new if final else max(1, max_new * upto // pieces)
            return {
                "text": "".join(texts[:upto]),
                "meta_info": {
                    "id": rid,
                    "finish_reason": {"type": "length", "length": max_new} if final else None,
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": done,
                    "cached_tokens": 0,
                    "e2e_latency": time.monotonic() - started,
                },
            }

        with self._request(prompt_tokens, max_new, duration) as ticket:
            if stream:
                _start_stream(handler)

                def on_piece(index: int) -> None:
                    if index < pieces - 1:
                        _write_event(handler, result(index + 1, final=False))

                self._run(ticket, pieces, on_piece)
            else:
                self._run(ticket, 1)
        if stream:
            _write_event(handler, result(pieces, final=True))
            _end_stream(handler)
        else:
            send_json(handler, 200, result(pieces, final=True))


def _split_text(tokens: int, pieces: int) -> list[str]:
    """``tokens`` emulated words split into ``pieces`` consecutive strings."""
    words = [" ok"] if tokens <= 1 else [f" w{i}" for i in range(tokens)]
    out: list[str] = []
    for index in range(pieces):
        lo = len(words) * index // pieces
        hi = len(words) * (index + 1) // pieces
        out.append("".join(words[lo:hi]))
    return out


# --------------------------------------------------------------------------------------
# The hub


def _spec_from_json(body: dict[str, Any]) -> PodEngineSpec:
    """Validate a POST /pods body."""
    name = body.get("name")
    if not isinstance(name, str) or not name or "/" in name or len(name) > 253:
        raise _BadRequest("name must be a non-empty string without '/'")
    engine_text = body.get("engine")
    kinds = {k.value.lower(): k for k in EngineKind}
    if not isinstance(engine_text, str) or engine_text.lower() not in kinds:
        raise _BadRequest("engine must be 'vLLM' or 'SGLang'")
    host = body.get("serve_host")
    if not isinstance(host, str):
        raise _BadRequest("serve_host must be an IP address")
    try:
        ipaddress.ip_address(host)
    except ValueError as exc:
        raise _BadRequest("serve_host must be an IP address") from exc
    ports: list[int] = []
    for key in ("serve_port", "metrics_port"):
        value = body.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise _BadRequest(f"{key} must be an integer port")
        ports.append(value)
    dp = _int_field(body, "dp_ranks", 1, minimum=1)
    if dp > 64:
        raise _BadRequest("dp_ranks must be <= 64")
    seconds = _seconds_field(body, "request_seconds")
    return PodEngineSpec(
        name=name,
        engine=kinds[engine_text.lower()],
        serve_host=host,
        serve_port=ports[0],
        metrics_port=ports[1],
        dp_ranks=dp,
        request_seconds=1.0 if seconds is None else seconds,
    )


def _apply_traps(emu: EngineEmulator, body: dict[str, Any]) -> None:
    """Validate and apply a POST /pods/{name}/traps body (``clear`` first)."""
    known = {
        "stale_gauges",
        "frontend_hidden",
        "metrics_mode",
        "clear",
        "request_seconds",
        "healthy",
    }
    unknown = sorted(set(body) - known)
    if unknown:
        raise _BadRequest(f"unknown trap fields: {unknown}")
    stale = body.get("stale_gauges")
    if stale is not None and (
        not isinstance(stale, list)
        or not 1 <= len(stale) <= 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in stale)
    ):
        raise _BadRequest("stale_gauges must be [running, waiting] of integers >= 0")
    hidden = _seconds_field(body, "frontend_hidden")
    seconds = _seconds_field(body, "request_seconds")
    mode = body.get("metrics_mode")
    if mode is not None and not isinstance(mode, str):
        raise _BadRequest("metrics_mode must be a string")
    healthy = body.get("healthy")
    if healthy is not None and not isinstance(healthy, bool):
        raise _BadRequest("healthy must be a boolean")
    if mode is not None:
        base, _, series = mode.partition(":")
        if base not in METRICS_MODES or (
            series and base not in {"missing", "nan", "negative", "nonnumeric"}
        ):
            raise _BadRequest(f"unknown metrics_mode {mode!r}")
    if body.get("clear"):
        emu.clear_traps()
    if stale is not None:
        emu.set_stale_gauges(stale[0], stale[1] if len(stale) > 1 else 0)
    if hidden is not None:
        emu.set_frontend_hidden(hidden)
    if mode is not None:
        emu.set_metrics_mode(mode)
    if healthy is not None:
        emu.set_healthy(healthy)
    if seconds is not None:
        emu.set_request_seconds(seconds)


class EmulatorHub:
    """Many emulators in one process, driven by a JSON control API over HTTP.

    Routes: ``GET /health``; ``GET /pods``; ``POST /pods`` (create and start);
    ``GET /pods/{name}``; ``DELETE /pods/{name}``; ``POST /pods/{name}/restart``;
    ``POST /pods/{name}/stop``; ``POST /pods/{name}/start``;
    ``POST /pods/{name}/traps``. ``on_add(spec)`` runs before an emulator binds (for
    example to put its address on an interface); ``on_remove(spec)`` after it stops.
    """

    def __init__(
        self,
        control_host: str,
        control_port: int,
        on_add: Callable[[PodEngineSpec], None] | None = None,
        on_remove: Callable[[PodEngineSpec], None] | None = None,
    ) -> None:
        """Bind the control address now (port 0 picks a free one)."""
        self._on_add = on_add or (lambda spec: None)
        self._on_remove = on_remove or (lambda spec: None)
        self._pods: dict[str, EngineEmulator] = {}
        self._lock = threading.Lock()
        self._state = threading.Lock()
        self._serving = False
        self._closed = False
        self._done = threading.Event()
        self._server = _Server((control_host, control_port), self)

    @property
    def control_port(self) -> int:
        """The bound control port."""
        return self._server.port

    @property
    def control_host(self) -> str:
        """The bound control host."""
        return str(self._server.server_address[0])

    def serve_forever(self) -> None:
        """Serve the control API until :meth:`shutdown` (from another thread)."""
        with self._state:
            if self._closed:
                return
            self._serving = True
        self._server.serve_forever(poll_interval=0.1)

    def start_background(self) -> threading.Thread:
        """Run :meth:`serve_forever` in a daemon thread and return it."""
        thread = threading.Thread(target=self.serve_forever, name="emulator-hub", daemon=True)
        thread.start()
        return thread

    def shutdown(self) -> None:
        """Stop the control API and every emulator. Idempotent."""
        with self._state:
            closed = self._closed
            self._closed = True
            serving = self._serving
        if closed:
            self._done.wait(timeout=30)
            return
        if serving:
            self._server.shutdown()
        self._server.server_close()
        self._server.cut_all()
        with self._lock:
            pods = list(self._pods.values())
            self._pods.clear()
        for emu in pods:
            emu.stop()
            with contextlib.suppress(Exception):
                self._on_remove(emu.spec)
        self._done.set()

    # -- direct API --------------------------------------------------------------------

    def add(self, spec: PodEngineSpec) -> EngineEmulator:
        """Create and start an emulator; ``KeyError`` if the name exists.

        An emulator still bound to the new one's address or metrics port belongs to a Pod
        that is gone (the cluster reuses a deleted Pod's address): it is stopped first, as
        a kubelet would have stopped that Pod's container.
        """
        emu = EngineEmulator(spec)
        with self._lock:
            if spec.name in self._pods:
                raise KeyError(spec.name)
            stale = [n for n, e in self._pods.items()
                     if (e.spec.serve_host, e.spec.serve_port) == (spec.serve_host,
                                                                   spec.serve_port)
                     or (spec.metrics_port and e.spec.metrics_port == spec.metrics_port)]
            for name in stale:
                self._pods.pop(name).stop()
            self._on_add(spec)
            emu.start()
            self._pods[spec.name] = emu
        return emu

    def remove(self, name: str) -> None:
        """Stop and forget an emulator; ``KeyError`` if unknown."""
        with self._lock:
            emu = self._pods.pop(name)
        emu.stop()
        self._on_remove(emu.spec)

    def get(self, name: str) -> EngineEmulator:
        """The emulator called ``name``; ``KeyError`` if unknown."""
        with self._lock:
            return self._pods[name]

    def names(self) -> list[str]:
        """Names of the current emulators."""
        with self._lock:
            return sorted(self._pods)

    # -- HTTP --------------------------------------------------------------------------

    def handle(self, handler: _Handler, method: str) -> None:
        """Answer one control API request."""
        parts = [unquote(p) for p in handler.route.strip("/").split("/") if p]
        body = read_json(handler) if method != "GET" else {}
        if parts == ["health"] and method == "GET":
            send_json(handler, 200, {"ok": True, "pods": len(self.names())})
        elif parts == ["pods"] and method == "GET":
            statuses = []
            for name in self.names():
                with contextlib.suppress(KeyError):
                    statuses.append(self.get(name).status())
            send_json(handler, 200, {"pods": statuses})
        elif parts == ["pods"] and method == "POST":
            spec = _spec_from_json(body)
            try:
                emu = self.add(spec)
            except KeyError:
                send_json(handler, 409, {"error": f"pod {spec.name!r} exists"})
                return
            except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as exc:
                send_json(handler, 500, {"error": f"cannot start {spec.name!r}: {exc}"})
                return
            send_json(handler, 201, emu.status())
        elif len(parts) in (2, 3) and parts[0] == "pods":
            self._pod_route(handler, method, parts[1], parts[2] if len(parts) == 3 else "", body)
        else:
            send_json(handler, 404, {"error": f"no route {method} {handler.route}"})

    def _pod_route(
        self, handler: _Handler, method: str, name: str, action: str, body: dict[str, Any]
    ) -> None:
        """Routes under ``/pods/{name}``."""
        try:
            emu = self.get(name)
        except KeyError:
            send_json(handler, 404, {"error": f"no pod {name!r}"})
            return
        if action == "" and method == "GET":
            send_json(handler, 200, emu.status())
        elif action == "" and method == "DELETE":
            try:
                self.remove(name)
            except KeyError:
                pass
            except (OSError, subprocess.SubprocessError) as exc:
                send_json(handler, 500, {"error": f"stopped, but on_remove failed: {exc}"})
                return
            send_json(handler, 200, {"deleted": name})
        elif method == "POST" and action in ("restart", "stop", "start", "traps"):
            try:
                if action == "restart":
                    emu.restart()
                elif action == "stop":
                    emu.stop()
                elif action == "start":
                    emu.start()
                else:
                    _apply_traps(emu, body)
            except OSError as exc:
                send_json(handler, 500, {"error": str(exc)})
                return
            except ValueError as exc:
                raise _BadRequest(str(exc)) from exc
            send_json(handler, 200, emu.status())
        else:
            send_json(handler, 404, {"error": f"no route {method} {handler.route}"})


def address_adder(dev: str) -> Callable[[PodEngineSpec], None]:
    """An ``on_add`` hook that puts each Pod's address on ``dev`` (``ip addr replace``).

    Loopback and unspecified addresses are left alone. No shell is involved: the address
    is parsed by :mod:`ipaddress` and the device name is checked.
    """
    if not _DEV_NAME.match(dev):
        raise ValueError(f"bad device name {dev!r}")

    def on_add(spec: PodEngineSpec) -> None:
        addr = ipaddress.ip_address(spec.serve_host)
        if addr.is_loopback or addr.is_unspecified:
            return
        prefix = 32 if addr.version == 4 else 128
        subprocess.run(
            ["ip", "addr", "replace", f"{addr}/{prefix}", "dev", dev],
            check=True,
            capture_output=True,
            timeout=10,
        )

    return on_add


def main(argv: list[str] | None = None) -> int:
    """Run a hub until SIGTERM/SIGINT. Prints one JSON line with the bound address."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed.emulator", description="Run an engine emulator hub."
    )
    parser.add_argument("--control-host", default="127.0.0.1")
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument(
        "--address-dev",
        default=None,
        help="put each Pod's serve_host on this interface before binding",
    )
    args = parser.parse_args(argv)
    on_add = address_adder(args.address_dev) if args.address_dev else None
    hub = EmulatorHub(args.control_host, args.control_port, on_add=on_add)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=hub.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        json.dumps({"control_host": hub.control_host, "control_port": hub.control_port}), flush=True
    )
    hub.serve_forever()
    hub.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
