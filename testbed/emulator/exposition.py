"""Prometheus text exposition (format 0.0.4) shared by the vLLM and SGLang renderers.

The per-rank metric state lives here too, because both engines render the same state,
each under its own series names and labels. Sample values are formatted the way
``prometheus_client`` formats them, so the one-shot parses what the real engines send.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["LATENCY_BUCKETS", "Family", "Rank", "Sample", "fmt", "histogram", "render"]

LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
"""Upper bounds of the end-to-end latency histogram buckets (both engines)."""

Sample = tuple[str, dict[str, str], float | str]
"""One sample: series name, label set, value (a string is written verbatim)."""


@dataclass
class Rank:
    """Metric state of one DP engine rank (reset by a container restart)."""

    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    latency_sum: float = 0.0
    latency_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))


@dataclass
class Family:
    """One metric family of the exposition: its name, help, type and samples."""

    name: str
    help: str
    type: str
    samples: list[Sample]


def fmt(value: float) -> str:
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


def histogram(name: str, help_text: str, per_rank: list[tuple[dict[str, str], Rank]]) -> Family:
    """A latency histogram family over the ranks."""
    samples: list[Sample] = []
    for labels, rank in per_rank:
        for bound, count in zip(LATENCY_BUCKETS, rank.latency_buckets, strict=True):
            samples.append((f"{name}_bucket", {**labels, "le": fmt(bound)}, float(count)))
        samples.append((f"{name}_bucket", {**labels, "le": "+Inf"}, float(rank.requests)))
        samples.append((f"{name}_count", labels, float(rank.requests)))
        samples.append((f"{name}_sum", labels, rank.latency_sum))
    return Family(name, help_text, "histogram", samples)


def render(families: list[Family]) -> str:
    """Prometheus text exposition (format 0.0.4) of ``families``."""
    out: list[str] = []
    for fam in families:
        out.append(f"# HELP {fam.name} {fam.help}\n")
        out.append(f"# TYPE {fam.name} {fam.type}\n")
        for name, labels, value in fam.samples:
            text = value if isinstance(value, str) else fmt(value)
            out.append(f"{name}{_labels(labels)} {text}\n")
    return "".join(out)
