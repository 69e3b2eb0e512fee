"""The known engine traps an emulator can be switched into, and how each one bends
``/metrics``.

Stale gauges (running/waiting frozen after a mass abort), requests hidden in the HTTP
front end (accepted but not yet counted by the scheduler), an unhealthy ``/health``, and
broken ``/metrics`` answers: slow, huge, malformed, empty, an HTTP error, or one series
missing, NaN, negative or non-numeric. The drain rule must read every one of them as
not idle; the emulator reproduces them on demand so the tests can prove it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from testbed.emulator.exposition import Family, Rank, render
from testbed.emulator.spec import EngineKind

__all__ = [
    "HUGE_METRICS_BYTES",
    "METRICS_MODES",
    "SLOW_METRICS_SECONDS",
    "Traps",
    "is_metrics_mode",
    "trapped_gauges",
    "trapped_metrics",
]

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

_SERIES_MODES = frozenset({"missing", "nan", "negative", "nonnumeric"})


def is_metrics_mode(mode: str) -> bool:
    """Whether ``mode`` names a ``/metrics`` mode (a series only on the series modes)."""
    base, _, series = mode.partition(":")
    return base in METRICS_MODES and not (series and base not in _SERIES_MODES)


@dataclass
class Traps:
    """The traps switched on for one emulator (the owner guards it with its lock)."""

    stale: tuple[int, int] | None = None
    hidden: float = 0.0
    mode: str = "normal"
    healthy: bool = True
    #: The engine stops producing tokens: a request being decoded sends nothing more (and
    #: stays running in the gauges) until the trap is cleared, as an engine hung in a
    #: collective or a stuck GPU kernel does; its HTTP server still answers.
    silent: bool = False

    def clear(self) -> None:
        """Back to normal behaviour (stale gauges, front-end delay, metrics mode, health,
        silence)."""
        self.stale = None
        self.hidden = 0.0
        self.mode = "normal"
        self.healthy = True
        self.silent = False

    def as_json(self) -> dict[str, Any]:
        """The JSON-able view the hub's status answer carries."""
        return {
            "stale_gauges": list(self.stale) if self.stale is not None else None,
            "frontend_hidden": self.hidden,
            "metrics_mode": self.mode,
            "healthy": self.healthy,
            "silent": self.silent,
        }


def trapped_gauges(
    ranks: list[Rank], stale: tuple[int, int] | None
) -> tuple[list[float], list[float]]:
    """The running and waiting gauges per rank; stale values are reported on rank 0."""
    running = [float(r.running) for r in ranks]
    waiting = [float(r.waiting) for r in ranks]
    if stale is not None:
        running = [float(stale[0])] + [0.0] * (len(ranks) - 1)
        waiting = [float(stale[1])] + [0.0] * (len(ranks) - 1)
    return running, waiting


def _default_series(engine: EngineKind, base: str) -> str:
    """The series a ``missing``/``nan``/``negative``/``nonnumeric`` mode acts on."""
    if engine is EngineKind.VLLM:
        return "vllm:num_requests_waiting" if base == "missing" else "vllm:num_requests_running"
    return "sglang:num_queue_reqs" if base == "missing" else "sglang:num_running_reqs"


def trapped_metrics(
    *, engine: EngineKind, mode: str, families: Callable[[], list[Family]]
) -> tuple[int, str]:
    """The ``/metrics`` status and body in ``mode``, from the engine's ``families``.

    ``slow`` is not applied here (the handler stalls before calling this).
    """
    base, _, series = mode.partition(":")
    series = series or _default_series(engine, base)
    if base == "error":
        return 500, "Internal Server Error\n"
    if base == "empty":
        return 200, ""
    fams = families()
    if base == "missing":
        fams = [f for f in fams if f.name != series]
    elif base in {"nan", "negative", "nonnumeric"}:
        bad: float | str = {"nan": math.nan, "negative": -1.0}.get(base, "idle")
        for fam in fams:
            if fam.name == series and fam.samples:
                name, labels, _ = fam.samples[0]
                fam.samples[0] = (name, labels, bad)
    text = render(fams)
    if base == "huge":
        prefix = "vllm" if engine is EngineKind.VLLM else "sglang"
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
