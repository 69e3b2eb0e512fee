"""vLLM's ``/metrics`` families: one label set per DP engine, ``vllm:`` series names.

The in-flight gauges come in as arguments (not from the ranks) so a trap can replace
them with stale values while the counters stay true.
"""

from __future__ import annotations

from testbed.emulator.exposition import Family, Rank, histogram
from testbed.emulator.spec import MODEL_NAME

__all__ = ["vllm_families"]


def vllm_families(
    ranks: list[Rank], running: list[float], waiting: list[float], created: float
) -> list[Family]:
    """vLLM's series: one label set per DP engine."""
    labels = [{"engine": str(i), "model_name": MODEL_NAME} for i in range(len(ranks))]

    def per(values: list[float]) -> list[tuple[dict[str, str], float]]:
        return list(zip(labels, values, strict=True))

    def gauge(name: str, help_text: str, values: list[float]) -> Family:
        return Family(name, help_text, "gauge", [(name, lb, v) for lb, v in per(values)])

    def counter(name: str, help_text: str, values: list[float]) -> list[Family]:
        total = f"{name}_total"
        return [
            Family(total, help_text, "counter", [(total, lb, v) for lb, v in per(values)]),
            Family(
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
        Family(
            "vllm:request_success_total",
            "Count of successfully processed requests.",
            "counter",
            [
                ("vllm:request_success_total", lb, float(r.requests))
                for lb, r in zip(success_labels, ranks, strict=True)
            ],
        ),
        histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            list(zip(labels, ranks, strict=True)),
        ),
    ]
    return families
