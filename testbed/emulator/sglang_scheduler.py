"""One SGLang DP rank's scheduler, as its metrics and load snapshots see it: a step clock
that runs prefill and decode batches and publishes what SGLang publishes, when SGLang
publishes it.

Why: SGLang's in-flight gauges are not live. A drain rule that reads them must be tested
against gauges that lag the way the real ones do (a lenient fake once hid a real bug).
Sources read: SGLang 0.5.21 (the bed's version; 0.5.18 the same on every point below),
``sglang/srt/managers/scheduler_components/metrics_reporter.py`` (``SchedulerMetricsReporter``),
``sglang/srt/managers/scheduler.py`` (``Scheduler``), ``sglang/srt/managers/load_snapshot.py``,
``sglang/srt/managers/scheduler_components/load_inquirer.py`` and
``sglang/srt/observability/metrics_collector.py``.

The scheduler loop (``event_loop_overlap``/``event_loop_normal``) runs one batch per step:

- a **prefill** batch of every request waiting (``get_new_batch_prefill``; the emulator does
  not cap it), whenever one is waiting: a new request waits for the step in progress to end,
  or starts at once on an idle rank. Its report (``report_prefill_stats``, after the
  forward) sets ``num_running_reqs`` to the running batch *as it was when the prefill was
  scheduled*, without the requests just admitted (``PrefillStats.from_adder(adder,
  running_batch.reqs, ...)`` in ``Scheduler.get_new_batch_prefill``), and ``num_queue_reqs``
  to the waiting queue now (in the default overlapping loop, after the next batch was
  picked: a request that was waiting is in that next prefill, not in the queue);
  ``sglang:realtime_tokens_total{mode="prefill_compute"}`` grows by the batch's new tokens
  (``increment_realtime_tokens``, skipped when 0). The admitted requests join the running
  batch when the next batch is picked (``get_next_batch_to_run`` merges ``last_batch``);
- otherwise a **decode** step of the running batch, one token per request:
  ``report_decode_stats`` adds them to ``realtime_tokens_total{mode="decode"}`` on every step
  (before its interval gate), but sets the gauges only when ``forward_ct_decode %
  decode_log_interval == 0`` (``--decode-log-interval``, 40 by default), to the batch that
  just ran (``len(batch.reqs)``, requests finishing in it included);
- otherwise the rank is **idle** (``on_idle``): ``_maybe_log_idle_metrics`` publishes at once
  when ``num_running_reqs`` disagrees with the (empty) running batch, and otherwise only
  every 30 s (``metrics_collector.last_log_time + 30``).

So a request admitted into an idle rank is reported by its prefill as running 0, and stays
invisible to ``num_running_reqs`` until the decode counter next reaches a multiple of the
interval: up to 40 decode steps. Request counters (``num_requests_total``,
``generation_tokens_total``, ``prompt_tokens_total``) are the tokenizer manager's and move
only when a request finishes (``TokenizerMetricsCollector.observe_one_finished_request``).

The load snapshot behind ``GET /v1/loads`` (``LoadInquirer.get_loads``) is written by
``Scheduler.publish_load_snapshot``: forced at the start of a prefill's result processing,
every ``--load-snapshot-publish-interval`` (15) decode results otherwise, and forced on every
idle loop (``on_idle``). In the overlapping loop (the default) a prefill's result is processed
after the next batch was picked, so its snapshot counts the just-admitted requests as running;
with ``--disable-overlap-schedule`` it is processed before, and they are in neither the
running batch nor the waiting queue (invisible until the next snapshot).

Time: the emulator's requests keep their own wall-clock durations (``request_seconds``,
``emulate_seconds``); this clock only decides when SGLang would publish. A request that ends
mid-step leaves the running batch at once (the step in progress still reports it, as the
real batch still holds a request finishing in it); when it was the last one, that step ends
with it, so the rank goes idle (and publishes so) at once. A request that ends before any prefill
took it (a 1-token request admitted while a step runs) has its prefill tokens counted when
it ends. Prefix caching is not emulated (``prefill_cache`` never moves).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DEFAULT_STEP_SECONDS",
    "IDLE_LOG_SECONDS",
    "WARMUP_NEW_TOKENS",
    "WARMUP_PROMPT_TOKENS",
    "Published",
    "SglangRank",
]

DEFAULT_STEP_SECONDS = 0.025
"""The emulated time of one scheduler step (a prefill batch or a decode step). 25 ms: a
decode step of a small batch of a 7-8B model on one current datacenter GPU takes about
10-30 ms (the inter-token latency SGLang users see at moderate load), so 40 decode steps,
SGLang's default ``--decode-log-interval``, are about 1 s, as on a real engine. Larger
batches and models step more slowly (50-100 ms), which makes the lag longer; tests that need
a longer window set a longer step rather than relying on timing luck."""

IDLE_LOG_SECONDS = 30.0
"""``_maybe_log_idle_metrics``: an idle rank whose gauges agree republishes every 30 s."""

WARMUP_PROMPT_TOKENS = 6
"""The warmup request's prompt, ``"The capital city of France is"`` (``_execute_server_warmup``,
sglang/srt/entrypoints/http_server.py), as the emulator counts tokens (words)."""

WARMUP_NEW_TOKENS = 8
"""The warmup request's ``max_new_tokens`` for a generation model (same function)."""

_USED_TOKENS_PER_REQUEST = 64.0
"""The KV tokens the emulator says one running request holds (``num_used_tokens``)."""

MAX_TOTAL_NUM_TOKENS = 65536
"""The KV pool size the emulated rank reports (``max_total_num_tokens``)."""

MAX_RUNNING_REQUESTS = 1024
"""The emulated ``max_running_requests``."""


@dataclass
class Published:
    """The scheduler gauges as last written by ``SchedulerMetricsCollector.log_stats``."""

    running: int
    queue: int
    gen_throughput: float = 0.0

    @property
    def zero(self) -> float:
        """A gauge this emulator never moves (PD queues, cache hit rate)."""
        return 0.0

    @property
    def used_tokens(self) -> float:
        """``num_used_tokens`` (the emulator's KV accounting)."""
        return self.running * _USED_TOKENS_PER_REQUEST

    @property
    def token_usage(self) -> float:
        """``token_usage`` (the same, as a share of the pool)."""
        return self.used_tokens / MAX_TOTAL_NUM_TOKENS


@dataclass
class _Req:
    """One request as the scheduler holds it."""

    prompt_tokens: int
    finished: bool = False


@dataclass
class _Step:
    """The batch in progress: a prefill (``reqs``, ``running_before``) or a decode step
    (``batch`` requests)."""

    prefill: bool
    start: float
    end: float
    reqs: list[_Req] = field(default_factory=list)
    running_before: int = 0
    batch: int = 0


class SglangRank:
    """One DP rank's scheduler (see the module docstring). Not thread-safe: the engine
    calls it under its own lock, with ``time.monotonic()`` readings."""

    def __init__(
        self,
        *,
        dp_rank: int,
        step_seconds: float,
        decode_log_interval: int,
        publish_interval: int,
        overlap: bool,
        now: float,
    ) -> None:
        if not math.isfinite(step_seconds) or step_seconds <= 0:
            raise ValueError("step_seconds must be a finite number > 0")
        if decode_log_interval < 1 or publish_interval < 1:
            raise ValueError("intervals must be >= 1")
        self.dp_rank = dp_rank
        self.step_seconds = step_seconds
        self.decode_log_interval = decode_log_interval
        self.publish_interval = publish_interval
        self.overlap = overlap
        self._wall = time.time() - time.monotonic()
        self._waiting: list[_Req] = []
        self._running: list[_Req] = []
        self._step: _Step | None = None
        self._keys: dict[object, _Req] = {}
        #: ``log_stats`` never ran: the gauges are absent from ``/metrics`` (SGLang serves
        #: them through prometheus_client's multiprocess collector, which shows a series
        #: only once a value was written).
        self.published: Published | None = None
        self.last_log = now
        self.forward_ct_decode = 0
        self._tokens_since_decode_log = 0
        self._last_decode_log = now
        #: ``realtime_tokens_total`` per mode; a mode appears once it moved.
        self.realtime: dict[str, int] = {}
        self.steps = 0
        # The load snapshot (``LoadSnapshot``) as last written, and its inputs.
        self._publish_counter = 0
        self._prefill_uncached = 0
        self._prefill_busy_us = 0
        self._moments = [0.0] * 6
        # The loop starts idle: ``on_idle`` publishes a snapshot at once (the writer's
        # initial all-default ``LoadSnapshot(dp_rank)`` is never seen).
        self._snapshot: dict[str, Any] = self._snapshot_now(now, running=0, waiting=0)

    # -- the requests --------------------------------------------------------------------

    def admit(self, key: object, prompt_tokens: int, now: float) -> None:
        """A request reaches the scheduler (``process_input_requests``): it waits for the
        step in progress, or starts a prefill at once on an idle rank."""
        self.advance(now)
        req = _Req(prompt_tokens=prompt_tokens)
        self._keys[key] = req
        self._waiting.append(req)
        if self._step is None:
            self._start_next(now)

    def finish(self, key: object, now: float) -> None:
        """A request ends (finished or aborted): it leaves the batches at once."""
        self.advance(now)
        req = self._keys.pop(key, None)
        if req is None:
            return
        req.finished = True
        if req in self._running:
            self._running.remove(req)
        elif req in self._waiting:
            # Ended before any prefill took it: its prefill is counted now.
            self._waiting.remove(req)
            self._count_prefill([req])
        step = self._step
        if (
            step is not None
            and not self._running
            and not self._waiting
            and all(r.finished for r in step.reqs)
        ):
            # The last request's last token ends the step it was in: the rank is idle now,
            # and says so at once (a real request finishes at a step's end, and the next
            # loop iteration finds nothing to run).
            step.end = now
            self._end_step(step)

    def warmup(self, now: float) -> None:
        """The effect of SGLang's startup warmup request on this rank, already done when the
        server reports ready: a prefill of :data:`WARMUP_PROMPT_TOKENS` (which publishes
        the gauges: 0 running, 0 waiting), then ``WARMUP_NEW_TOKENS - 1`` decode steps (the
        prefill samples the first token), then idle, all before ``now``."""
        decodes = WARMUP_NEW_TOKENS - 1
        self._count_prefill([_Req(WARMUP_PROMPT_TOKENS)])
        self._prefill_busy_us += self._step_us
        self._log(now, running=0, queue=0)
        for _ in range(decodes):
            self._decode_step(now, batch=1, queue=0)
        self._publish_snapshot(now, force=True)

    # -- the clock -------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Run every step that ended by ``now`` (and the idle republish, when due)."""
        while self._step is not None and self._step.end <= now:
            self._end_step(self._step)
        if self._step is None and now >= self.last_log + IDLE_LOG_SECONDS:
            # ``_maybe_log_idle_metrics``: the 30 s republish (it also creates the series
            # of a rank that never logged, e.g. with ``--skip-server-warmup``).
            periods = math.floor((now - self.last_log) / IDLE_LOG_SECONDS)
            self._log(self.last_log + periods * IDLE_LOG_SECONDS, running=0, queue=0)

    @property
    def _step_us(self) -> int:
        return round(self.step_seconds * 1e6)

    def _start_next(self, at: float) -> None:
        """``get_next_batch_to_run`` at ``at``: a prefill of the waiting requests, else a
        decode step of the running batch, else idle (``on_idle``)."""
        if self._waiting:
            reqs, self._waiting = self._waiting, []
            self._step = _Step(
                prefill=True,
                start=at,
                end=at + self.step_seconds,
                reqs=reqs,
                running_before=len(self._running),
            )
        elif self._running:
            self._step = _Step(
                prefill=False, start=at, end=at + self.step_seconds, batch=len(self._running)
            )
        else:
            self._step = None
            self._on_idle(at)

    def _end_step(self, step: _Step) -> None:
        """The step's result is processed at its end, then the next batch is picked. In the
        overlapping loop the next batch is picked first (``event_loop_overlap`` processes
        the previous result after launching the next batch): a prefill's requests are in
        the running batch by then, and whatever was waiting went into the next prefill (the
        emulator admits every waiting request), so the reports see an empty queue. In the
        normal loop the result comes first: the running batch without the prefill's
        requests, the waiting queue as it is."""
        at = step.end
        self.steps += 1
        new = [r for r in step.reqs if not r.finished] if step.prefill else []
        if self.overlap:
            self._running.extend(new)
            running, waiting = len(self._running), 0
        else:
            running, waiting = len(self._running), len(self._waiting)
        # ``publish_load_snapshot`` at the start of ``process_batch_result``: forced for a
        # prefill, every ``publish_interval`` calls for a decode step.
        self._publish_snapshot(at, force=step.prefill, running=running, waiting=waiting)
        if step.prefill:
            if not self.overlap:
                self._running.extend(new)
            self._count_prefill(step.reqs)
            self._prefill_busy_us += self._step_us
            self._log(at, running=step.running_before, queue=waiting)
        else:
            self._decode_step(at, batch=step.batch, queue=waiting)
        self._start_next(at)

    def _count_prefill(self, reqs: list[_Req]) -> None:
        tokens = sum(r.prompt_tokens for r in reqs)
        self._prefill_uncached += tokens
        if tokens:
            self.realtime["prefill_compute"] = self.realtime.get("prefill_compute", 0) + tokens

    def _decode_step(self, at: float, *, batch: int, queue: int) -> None:
        """``process_batch_result_decode`` -> ``report_decode_stats``."""
        self.forward_ct_decode = (self.forward_ct_decode + 1) % (1 << 30)
        if batch:
            self.realtime["decode"] = self.realtime.get("decode", 0) + batch
        self._tokens_since_decode_log += batch
        b, t = float(batch), float(self._step_us)
        for i, value in enumerate((1.0, b, t, b * b, b * t, b)):
            self._moments[i] += value
        if self.forward_ct_decode % self.decode_log_interval != 0:
            return
        gap = at - self._last_decode_log
        throughput = self._tokens_since_decode_log / gap if gap > 0 else 0.0
        self._last_decode_log = at
        self._tokens_since_decode_log = 0
        self._log(at, running=batch, queue=queue, gen_throughput=throughput)

    def _on_idle(self, at: float) -> None:
        """``on_idle``: a forced snapshot, and the gauges at once if they disagree with the
        empty running batch (``_maybe_log_idle_metrics``: ``gauge_stale``)."""
        self._publish_snapshot(at, force=True)
        if self.published is not None and self.published.running != 0:
            self._log(at, running=0, queue=0)

    def _log(self, at: float, *, running: int, queue: int, gen_throughput: float = 0.0) -> None:
        """``SchedulerMetricsCollector.log_stats``."""
        self.published = Published(running=running, queue=queue, gen_throughput=gen_throughput)
        self.last_log = at

    # -- the load snapshot ----------------------------------------------------------------

    def _publish_snapshot(
        self, at: float, *, force: bool, running: int | None = None, waiting: int | None = None
    ) -> None:
        """``Scheduler.publish_load_snapshot``: forced, or every ``publish_interval`` calls;
        the batches as they are now unless told."""
        if not force:
            self._publish_counter += 1
            if self._publish_counter < self.publish_interval:
                return
        self._publish_counter = 0
        self._snapshot = self._snapshot_now(
            at,
            running=len(self._running) if running is None else running,
            waiting=len(self._waiting) if waiting is None else waiting,
        )

    def _snapshot_now(self, at: float, *, running: int, waiting: int) -> dict[str, Any]:
        """``LoadInquirer.get_loads`` as ``LoadSnapshot.to_dict`` returns it (core keys, then
        the sections this rank has: memory, disaggregation, queues)."""
        used = int(running * _USED_TOKENS_PER_REQUEST)
        return {
            "timestamp": at + self._wall,
            "dp_rank": self.dp_rank,
            "num_running_reqs": running,
            "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": 0,
            "num_used_tokens": used,
            "num_total_tokens": used,
            "num_active_tokens": used,
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": MAX_TOTAL_NUM_TOKENS,
            "max_running_requests": MAX_RUNNING_REQUESTS,
            "token_usage": round(used / MAX_TOTAL_NUM_TOKENS, 4),
            "gen_throughput": round(self.published.gen_throughput if self.published else 0.0, 2),
            "cache_hit_rate": 0.0,
            "utilization": 0.0,
            "total_prefill_uncached_tokens": self._prefill_uncached,
            "total_prefill_busy_us": self._prefill_busy_us,
            "decode_moments": list(self._moments) if self._moments[0] > 0 else None,
            "memory": {
                "weight_gb": 15.0,
                "kv_cache_gb": 8.0,
                "graph_gb": 0.5,
                "token_capacity": MAX_TOTAL_NUM_TOKENS,
            },
            "disaggregation": {
                "mode": "null",
                "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0,
                "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0,
                "kv_transfer_latency_ms": 0.0,
            },
            "queues": {
                "waiting": waiting,
                "grammar": 0,
                "paused": 0,
                "retracted": 0,
                "prealloc_ready": 0,
            },
        }

    def snapshot(self) -> dict[str, Any]:
        """The load snapshot as last published (a copy)."""
        out = dict(self._snapshot)
        for key in ("memory", "disaggregation", "queues"):
            out[key] = dict(out[key])
        if out["decode_moments"] is not None:
            out["decode_moments"] = list(out["decode_moments"])
        return out

    # -- what the engine shows -------------------------------------------------------------

    @property
    def true_running(self) -> int:
        """Requests in the running batch now (not what was published)."""
        return len(self._running) + (
            sum(1 for r in self._step.reqs if not r.finished)
            if self._step is not None and self._step.prefill
            else 0
        )

    @property
    def true_waiting(self) -> int:
        """Requests waiting for a prefill now."""
        return len(self._waiting)

    def view(self) -> dict[str, Any]:
        """A JSON-able view for the emulator's status."""
        return {
            "dp_rank": self.dp_rank,
            "published": None
            if self.published is None
            else {"running": self.published.running, "queue": self.published.queue},
            "forward_ct_decode": self.forward_ct_decode,
            "steps": self.steps,
            "realtime_tokens": dict(self.realtime),
            "busy": self._step is not None,
        }
