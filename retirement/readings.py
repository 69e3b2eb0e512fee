"""What a drain read measures, and how the in-container one-shot's output is judged.

The one-shot prints one ``name<TAB>value`` line per expected series (the sum over its label
sets), then ``#end``; or ``#error<TAB>reason``.  Anything else — a missing or extra line, a
NaN, a negative or non-numeric value, no ``#end`` — reads UNKNOWN, never idle.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from retirement.phases import Verdict


@dataclass(frozen=True)
class EngineSeries:
    """The series a drain reads for one engine."""

    gauges: tuple[str, ...]  # in-flight work: idle when every one sums to zero
    counters: tuple[str, ...]  # work done: must not move between the two idle reads

    @property
    def all(self) -> tuple[str, ...]:
        """Every expected series, gauges first."""
        return self.gauges + self.counters


SERIES: dict[str, EngineSeries] = {
    "vLLM": EngineSeries(
        gauges=("vllm:num_requests_running", "vllm:num_requests_waiting"),
        counters=("vllm:prompt_tokens_total", "vllm:generation_tokens_total"),
    ),
    "SGLang": EngineSeries(
        gauges=(
            "sglang:num_running_reqs",
            "sglang:num_queue_reqs",
            "sglang:num_prefill_bootstrap_queue_reqs",
            "sglang:num_prefill_inflight_queue_reqs",
            "sglang:num_decode_prealloc_queue_reqs",
            "sglang:num_decode_transfer_queue_reqs",
        ),
        counters=("sglang:num_requests_total", "sglang:generation_tokens_total"),
    ),
}


class Sample(BaseModel):
    """One member's read: complete (every series valid) or UNKNOWN with a reason."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    complete: bool
    in_flight: float = 0.0  # sum of the gauges
    counters: tuple[float, ...] = ()
    reason: str = ""

    @property
    def idle(self) -> bool:
        """Whether this is a complete read with nothing in flight."""
        return self.complete and self.in_flight == 0

    @property
    def verdict(self) -> Verdict:
        """VERIFIED for a complete read, UNKNOWN otherwise."""
        return Verdict.VERIFIED if self.complete else Verdict.UNKNOWN


def unknown(reason: str) -> Sample:
    """An incomplete read."""
    return Sample(complete=False, reason=reason)


#: What the one-shot prints for a value: Python's ``repr`` of a float, nothing around it
#: (``float()`` alone would also accept spaces, '\x1e', '_' separators or other digits).
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _number(text: str) -> float | None:
    if not _NUMBER.fullmatch(text):
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    if math.isnan(value) or math.isinf(value) or value < 0:
        return None
    return value


def parse_oneshot_output(*, engine: str, stdout: str) -> Sample:
    """Judge the one-shot's output for ``engine``."""
    series = SERIES.get(engine)
    if series is None:
        return unknown(f"unknown engine {engine!r}")
    values: dict[str, float] = {}
    ended = False
    for line in stdout.split("\n"):  # only "\n" ends a line (splitlines also splits on \x1e)
        if not line:
            continue
        if ended:
            return unknown("output after #end")
        if line == "#end":
            ended = True
            continue
        name, tab, raw = line.partition("\t")
        if name == "#error":
            return unknown(f"read failed: {raw[:200] or 'no reason'}")
        if not tab:
            return unknown(f"malformed line {line[:80]!r}")
        if name not in series.all:
            return unknown(f"unexpected series {name[:80]!r}")
        if name in values:
            return unknown(f"series {name} reported twice")
        value = _number(raw)
        if value is None:
            return unknown(f"series {name} has an invalid value {raw[:40]!r}")
        values[name] = value
    if not ended:
        return unknown("output incomplete (no #end)")
    missing = [n for n in series.all if n not in values]
    if missing:
        return unknown(f"missing series: {', '.join(missing)}")
    return Sample(
        complete=True,
        in_flight=sum(values[n] for n in series.gauges),
        counters=tuple(values[n] for n in series.counters),
    )
