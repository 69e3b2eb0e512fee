"""Reading an engine emulator from a test: its ``/metrics`` exposition parsed into samples
(``parse``, ``Samples``) and a series summed over its label sets (``total``), and one HTTP
call run in the background (``Background``). Shared by the ``tests/test_emulator*.py``
files."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import httpx

_prom_parse: Callable[[str], Iterable[Any]] | None
try:
    from prometheus_client.parser import text_string_to_metric_families as _prom_parse
except ImportError:  # pragma: no cover - prometheus_client is a project dependency
    _prom_parse = None


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str) -> Samples:
    """Sample name -> [(labels, value)], via prometheus_client when available."""
    out: Samples = {}
    if _prom_parse is not None:
        for family in _prom_parse(text):
            for sample in family.samples:
                out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return out
    for line in text.splitlines():  # pragma: no cover - fallback
        if not line or line.startswith("#"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, rest = head.partition("{")
        labels = dict(
            (kv.split("=", 1)[0], kv.split("=", 1)[1].strip('"'))
            for kv in rest.rstrip("}").split(",")
            if kv
        )
        out.setdefault(name, []).append((labels, float(value)))
    return out


def total(samples: Samples, name: str) -> float:
    """Sum of a series over its label sets."""
    return sum(value for _, value in samples[name])


class Background:
    """Run one HTTP call in a thread; keep its response or exception."""

    def __init__(self, fn: Callable[[], httpx.Response]) -> None:
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.response = fn()
            except BaseException as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self, timeout: float = 5.0) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background request did not end"
