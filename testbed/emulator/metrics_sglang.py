"""SGLang's ``/metrics`` families: ``sglang:`` series names, ``dp_rank`` only when DP > 1.

The in-flight gauges come in as arguments (not from the ranks) so a trap can replace
them with stale values while the counters stay true.
"""

from __future__ import annotations

from testbed.emulator.exposition import Family, Rank, histogram
from testbed.emulator.spec import MODEL_NAME

__all__ = ["sglang_families"]


def sglang_families(ranks: list[Rank], running: list[float], waiting: list[float]) -> list[Family]:
    """SGLang's series: one label set per DP rank (``dp_rank`` only when DP > 1)."""
    base = {"model_name": MODEL_NAME, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    if len(ranks) > 1:
        labels = [{**base, "dp_rank": str(i)} for i in range(len(ranks))]
    else:
        labels = [dict(base)]

    def fam(name: str, typ: str, help_text: str, values: list[float]) -> Family:
        return Family(
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
        histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            list(zip(labels, ranks, strict=True)),
        ),
    ]
