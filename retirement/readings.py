"""What a drain read measures, and how the in-container one-shot's output is judged.

The one-shot prints one ``name<TAB>value`` line per expected series (the sum over its label
sets), then, when the engine counts its requests exactly, ``#load<TAB>N``, then ``#end``;
or ``#error<TAB>reason``.  Anything else — a missing or extra line, a NaN, a negative or
non-numeric value, no ``#end``, an exact count that is not a whole number — reads
UNKNOWN, never idle.

Two engine traps the series alone miss, and what closes each:

- vLLM's scheduler gauges do not see a request still in its HTTP front end (rendering,
  tokenizing, or its last streamed bytes).  With ``--enable-server-load-tracking`` (vLLM
  0.8.0+) the API server counts requests from its handler's start until the response's
  last byte was sent (``load_aware_call``, vllm/entrypoints/serve/utils/api_utils.py,
  0.25.1 and 0.29.0) and serves it at ``GET /load``: the exact count, read in the same
  exec (``MemberTarget.exact_load`` says when it is there).
- SGLang writes ``num_running_reqs``/``num_queue_reqs`` only after a prefill batch (the
  running batch as it was before the requests just admitted), every
  ``--decode-log-interval`` decode batches (40 by default) and when idle
  (scheduler_components/metrics_reporter.py, 0.5.18 and 0.5.21), and its request counters
  move only when a request finishes: a request admitted into a running engine can be
  invisible to both for 40 decode steps.  ``sglang:realtime_tokens_total`` moves on every
  prefill batch and every decode step (``log_decode_stats_every_iteration`` in 0.5.7,
  ``report_decode_stats`` before its interval gate in 0.5.18/0.5.21), so as a work
  counter it shows any decoding between two reads.  SGLang offers no request-level count
  over HTTP (``/v1/loads`` is the scheduler's queues, from a snapshot refreshed every 15
  decode steps).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from retirement.phases import Verdict
from retirement.versions import at_least


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


#: The SGLang work counter that moves on every prefill batch and decode step, and the
#: first release known to export it so (see the module's docstring).
SGLANG_STEP_COUNTER = "sglang:realtime_tokens_total"
SGLANG_STEP_COUNTER_SINCE = (0, 5, 7)


def series_for(engine: str, version: str) -> EngineSeries | None:
    """The series a drain reads for ``engine`` at ``version`` (None: not an engine read
    here).  SGLang releases known to move the per-step counter have it as a work counter;
    others keep to the rule without it (``retirement.drain``: an SGLang settle)."""
    base = SERIES.get(engine)
    if base is None or engine != "SGLang" or not at_least(version, SGLANG_STEP_COUNTER_SINCE):
        return base
    return EngineSeries(gauges=base.gauges, counters=(*base.counters, SGLANG_STEP_COUNTER))


def steps_counted(engine: str, version: str) -> bool:
    """Whether a read of ``engine`` at ``version`` shows every engine step in its counters
    (vLLM: its token counters move per step; SGLang: with the per-step counter)."""
    if engine == "vLLM":
        return True
    series = series_for(engine, version)
    return series is not None and SGLANG_STEP_COUNTER in series.counters


class Sample(BaseModel):
    """One member's read: complete (every series valid) or UNKNOWN with a reason."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    complete: bool
    in_flight: float = 0.0  # sum of the gauges
    counters: tuple[float, ...] = ()
    #: The engine's own request-level count (requests its HTTP front end holds), when it
    #: offers one (``GET /load``); None when not read.
    exact: int | None = None
    reason: str = ""

    @property
    def idle(self) -> bool:
        """Whether this is a complete read with nothing in flight: no gauge above zero and,
        where the engine counts exactly, no request in its front end either."""
        return self.complete and self.in_flight == 0 and not self.exact

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


#: An exact count: a whole number, as JSON prints one.
_COUNT = re.compile(r"0|[1-9][0-9]{0,8}")


def parse_oneshot_reads(
    *, engine: str, stdout: str, version: str = "", exact: bool = False, reads: int = 1
) -> list[Sample]:
    """Judge the output of a one-shot that read ``reads`` times in one process (each read
    a block ending in its own ``#end``): one Sample per read, in order.  A block cut short
    (an ``#error`` line, no ``#end``, the process stopped) and every read after it are
    UNKNOWN; output past the last block is malformed, and makes every read UNKNOWN."""
    blocks: list[str] = []
    current: list[str] = []
    for line in stdout.split("\n"):
        if not line:
            continue
        current.append(line)
        if line == "#end":
            blocks.append("\n".join(current) + "\n")
            current = []
    if len(blocks) > reads or (current and len(blocks) == reads):
        return [unknown(f"output past its {reads} read(s)")] * reads
    samples = [
        parse_oneshot_output(engine=engine, stdout=b, version=version, exact=exact) for b in blocks
    ]
    if current:
        samples.append(
            parse_oneshot_output(
                engine=engine, stdout="\n".join(current), version=version, exact=exact
            )
        )
    while len(samples) < reads:
        samples.append(unknown("output incomplete (read not made)"))
    return samples


def parse_oneshot_output(
    *, engine: str, stdout: str, version: str = "", exact: bool = False
) -> Sample:
    """Judge the one-shot's output for ``engine`` at ``version``; with ``exact``, the
    engine's request-level count must be there too (a read without it is UNKNOWN)."""
    series = series_for(engine, version)
    if series is None:
        return unknown(f"unknown engine {engine!r}")
    values: dict[str, float] = {}
    count: int | None = None
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
        if name == "#load" and exact and count is None:
            if not _COUNT.fullmatch(raw):
                return unknown(f"exact request count {raw[:40]!r} is not a whole number")
            count = int(raw)
            continue
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
    if exact and count is None:
        return unknown("exact request count missing (GET /load)")
    return Sample(
        complete=True,
        in_flight=sum(values[n] for n in series.gauges),
        counters=tuple(values[n] for n in series.counters),
        exact=count,
    )


@dataclass(frozen=True)
class QuietReads:
    """What the ``quiet`` one-shot saw (``activities.oneshot.quiet_command``): ``busy``, the
    engine's count when it stayed above 0 for the whole wait (no read was made); else its
    two reads, ``apart_s`` seconds apart on the container's own clock (from the end of the
    first to the start of the second), each UNKNOWN when it was not made or is unreadable."""

    busy: int | None = None
    reads: tuple[Sample, Sample] = (unknown("not read"), unknown("not read"))
    apart_s: float = 0.0


#: The seconds the ``quiet`` one-shot prints (``%.3f``).
_SECONDS = re.compile(r"[0-9]{1,6}\.[0-9]{3}")


def parse_quiet_output(*, engine: str, stdout: str, version: str = "") -> QuietReads:
    """Judge the ``quiet`` one-shot's output: ``#busy<TAB>N`` alone; or ``#waited<TAB>s``,
    the first read's block, ``#apart<TAB>s``, the second read's block.  Anything else makes
    both reads UNKNOWN (a block cut short only its own read and the one after it)."""
    lines = [line for line in stdout.split("\n") if line]

    def broken(reason: str) -> QuietReads:
        return QuietReads(reads=(unknown(reason), unknown(reason)))

    if not lines:
        return broken("quiet read said nothing")
    head, _, value = lines[0].partition("\t")
    if head == "#busy":
        if len(lines) != 1 or not _COUNT.fullmatch(value):
            return broken(f"malformed busy line {lines[0][:80]!r}")
        return QuietReads(busy=int(value))
    if head == "#error":
        return broken(f"read failed: {value[:200] or 'no reason'}")
    if head != "#waited" or not _SECONDS.fullmatch(value):
        return broken(f"malformed first line {lines[0][:80]!r}")
    rest = lines[1:]
    apart_at = [i for i, line in enumerate(rest) if line.startswith("#apart\t")]
    if not apart_at:  # the first read failed or was cut: the second was never made
        first = parse_oneshot_output(
            engine=engine, stdout="\n".join(rest), version=version, exact=True
        )
        return QuietReads(reads=(first, unknown("second read not made")))
    i = apart_at[0]
    apart = rest[i].partition("\t")[2]
    if len(apart_at) > 1 or i == 0 or rest[i - 1] != "#end" or not _SECONDS.fullmatch(apart):
        return broken("malformed quiet read (its #apart line)")
    first, second = (
        parse_oneshot_output(engine=engine, stdout="\n".join(block), version=version, exact=True)
        for block in (rest[:i], rest[i + 1 :])
    )
    return QuietReads(reads=(first, second), apart_s=float(apart))
