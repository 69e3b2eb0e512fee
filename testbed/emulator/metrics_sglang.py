"""SGLang's ``/metrics`` families, with SGLang 0.5.21's label sets, shown only once written.

SGLang serves ``/metrics`` through prometheus_client's multiprocess collector
(``add_prometheus_middleware``, sglang/srt/utils/common.py: ``MultiProcessCollector``), which
shows a series only once some process wrote a value for it: no ``# HELP`` line, nothing, before
that. Two collectors write them (sglang/srt/observability/metrics_collector.py):

- the scheduler's (``SchedulerMetricsCollector``), once per DP rank, labelled ``model_name``
  (the served name), ``engine_type`` (``unified`` without PD disaggregation), ``tp_rank``,
  ``pp_rank``, ``moe_ep_rank`` and, with DP > 1, ``dp_rank``
  (``SchedulerMetricsCollectorContext.init_new``): the in-flight gauges, written by
  ``log_stats`` only when the scheduler reports (see :mod:`testbed.emulator.sglang_scheduler`;
  absent until its first report), and ``sglang:realtime_tokens_total`` with a ``mode`` label
  (``prefill_compute``, ``prefill_cache``, ``decode``), one series per mode once that mode
  moved (``increment_realtime_tokens`` skips a delta of 0); and
  ``sglang:prefill_effective_tokens_total``, which the constructor pre-seeds at 0 for each
  ``mode`` (so a rank shows it from the start; ``input`` moves with every prefill, the cache
  hit modes never here);
- the tokenizer manager's (``TokenizerMetricsCollector``), one for the whole server (not per
  rank), labelled ``model_name``, ``engine_type`` and ``is_streaming``
  (``observe_one_finished_request``: ``stream_labels``): ``num_requests_total``,
  ``prompt_tokens_total``, ``generation_tokens_total`` and the end-to-end latency histogram,
  written only when a request finishes.

The gauges come in already chosen (published, or a trap's stale values) so a trap can
replace them while the counters stay true.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from testbed.emulator.exposition import Family, Sample, fmt
from testbed.emulator.sglang_scheduler import Published

__all__ = ["E2E_BUCKETS", "RankMetrics", "TokenizerCounters", "sglang_families"]

E2E_BUCKETS = (
    0.1,
    0.2,
    0.4,
    0.6,
    0.8,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
    10.0,
    20.0,
    40.0,
    60.0,
    80.0,
    100.0,
    200.0,
    400.0,
    600.0,
    1200.0,
    1800.0,
    2400.0,
)
"""``bucket_e2e_request_latency``'s default (``TokenizerMetricsCollector.__init__``)."""

_ENGINE_TYPE = "unified"
"""``DisaggregationMode.to_engine_type`` without PD disaggregation."""


@dataclass
class _Child:
    """One ``is_streaming`` label set of the tokenizer's request counters."""

    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    latency_sum: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(E2E_BUCKETS))


@dataclass
class TokenizerCounters:
    """The tokenizer manager's request counters (one per server, not per rank)."""

    children: dict[bool, _Child] = field(default_factory=dict)

    def finished(
        self, *, streaming: bool, prompt_tokens: int, generation_tokens: int, latency: float
    ) -> None:
        """``observe_one_finished_request``."""
        child = self.children.setdefault(streaming, _Child())
        child.requests += 1
        child.prompt_tokens += prompt_tokens
        child.generation_tokens += generation_tokens
        child.latency_sum += latency
        for i, bound in enumerate(E2E_BUCKETS):
            if latency <= bound:
                child.latency_buckets[i] += 1

    def copy(self) -> TokenizerCounters:
        """An independent copy."""
        return TokenizerCounters(
            {
                streaming: replace(child, latency_buckets=list(child.latency_buckets))
                for streaming, child in self.children.items()
            }
        )

    @property
    def requests(self) -> int:
        """Requests finished, over both label sets."""
        return sum(c.requests for c in self.children.values())

    @property
    def prompt_tokens(self) -> int:
        """Prompt tokens counted, over both label sets."""
        return sum(c.prompt_tokens for c in self.children.values())

    @property
    def generation_tokens(self) -> int:
        """Generated tokens counted, over both label sets."""
        return sum(c.generation_tokens for c in self.children.values())


@dataclass
class RankMetrics:
    """What one DP rank's scheduler shows: its gauges (None: never written) and its
    ``realtime_tokens_total`` per mode."""

    gauges: Published | None
    realtime: dict[str, int]


def sglang_families(
    *, model_name: str, ranks: list[RankMetrics], tokenizer: TokenizerCounters
) -> list[Family]:
    """SGLang's series (see the module docstring)."""
    base = {
        "model_name": model_name,
        "engine_type": _ENGINE_TYPE,
        "tp_rank": "0",
        "pp_rank": "0",
        "moe_ep_rank": "0",
    }
    rank_labels = [
        {**base, "dp_rank": str(i)} if len(ranks) > 1 else dict(base) for i in range(len(ranks))
    ]

    def gauge(name: str, help_text: str, value: str) -> Family:
        samples: list[Sample] = []
        for labels, rank in zip(rank_labels, ranks, strict=True):
            if rank.gauges is not None:
                samples.append((name, labels, float(getattr(rank.gauges, value))))
        return Family(name, help_text, "gauge", samples)

    families = [
        gauge("sglang:num_running_reqs", "The number of running requests.", "running"),
        gauge("sglang:num_used_tokens", "The number of used tokens.", "used_tokens"),
        gauge("sglang:token_usage", "The token usage.", "token_usage"),
        gauge("sglang:gen_throughput", "The generation throughput (token/s).", "gen_throughput"),
        gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", "queue"),
        gauge(
            "sglang:num_prefill_bootstrap_queue_reqs",
            "The number of requests in the prefill bootstrap queue.",
            "zero",
        ),
        gauge(
            "sglang:num_prefill_inflight_queue_reqs",
            "The number of requests in the prefill inflight queue.",
            "zero",
        ),
        gauge(
            "sglang:num_decode_prealloc_queue_reqs",
            "The number of requests in the decode prealloc queue.",
            "zero",
        ),
        gauge(
            "sglang:num_decode_transfer_queue_reqs",
            "The number of requests in the decode transfer queue.",
            "zero",
        ),
        gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", "zero"),
    ]
    realtime: list[Sample] = []
    for labels, rank in zip(rank_labels, ranks, strict=True):
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            if rank.realtime.get(mode):
                realtime.append(
                    ("sglang:realtime_tokens_total", {**labels, "mode": mode}, rank.realtime[mode])
                )
    families.append(
        Family(
            "sglang:realtime_tokens_total",
            "Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            "counter",
            realtime,
        )
    )
    # Pre-seeded at 0 by the collector's constructor, so present from the start.
    families.append(
        Family(
            "sglang:prefill_effective_tokens_total",
            "Effective prefill tokens with retracted-request re-counts excluded, updated on "
            "each log interval. mode: device_hit, host_hit, storage_hit, input. Windowed "
            "prefix cache hit rate = rate(sum of *_hit) / rate(sum of all modes); per-tier "
            "rate uses a single *_hit mode in the numerator.",
            "counter",
            [
                (
                    "sglang:prefill_effective_tokens_total",
                    {**labels, "mode": mode},
                    float(rank.realtime.get("prefill_compute", 0)) if mode == "input" else 0.0,
                )
                for labels, rank in zip(rank_labels, ranks, strict=True)
                for mode in ("input", "device_hit", "host_hit", "storage_hit")
            ],
        )
    )
    families.extend(_tokenizer_families(model_name, tokenizer))
    return [f for f in families if f.samples]


def _tokenizer_families(model_name: str, tokenizer: TokenizerCounters) -> list[Family]:
    """The tokenizer manager's request counters and latency histogram."""
    children = [
        (
            {
                "model_name": model_name,
                "engine_type": _ENGINE_TYPE,
                "is_streaming": "true" if streaming else "false",
            },
            child,
        )
        for streaming, child in sorted(tokenizer.children.items())
    ]

    def counter(name: str, help_text: str, value: str) -> Family:
        return Family(
            name,
            help_text,
            "counter",
            [(name, lb, float(getattr(child, value))) for lb, child in children],
        )

    latency = "sglang:e2e_request_latency_seconds"
    samples: list[Sample] = []
    for labels, child in children:
        for bound, count in zip(E2E_BUCKETS, child.latency_buckets, strict=True):
            samples.append((f"{latency}_bucket", {**labels, "le": fmt(bound)}, float(count)))
        samples.append((f"{latency}_bucket", {**labels, "le": "+Inf"}, float(child.requests)))
        samples.append((f"{latency}_count", labels, float(child.requests)))
        samples.append((f"{latency}_sum", labels, child.latency_sum))
    return [
        counter(
            "sglang:prompt_tokens_total", "Number of prefill tokens processed.", "prompt_tokens"
        ),
        counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            "generation_tokens",
        ),
        counter("sglang:num_requests_total", "Number of requests processed.", "requests"),
        Family(latency, "Histogram of End-to-end request latency in seconds", "histogram", samples),
    ]
