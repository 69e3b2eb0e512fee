"""What the activities cost the API server, counted in this worker process.

Each drain read is one ``pods/exec`` through the API server, the dearest call a retirement
makes; the counter lets a benchmark (or a scrape of the default registry, if the worker
ever serves one) report a fleet's cost in execs per second.  Defined once, at import: this
module starts no server.
"""

from __future__ import annotations

from prometheus_client import REGISTRY, Counter

DRAIN_EXEC_READS = Counter(
    "retire_drain_exec_reads",  # exposed as retire_drain_exec_reads_total
    "Drain reads: pods/exec calls into a measured member's engine container",
)


def drain_exec_reads() -> float:
    """How many drain execs this process has made so far (for a benchmark's rate)."""
    return REGISTRY.get_sample_value("retire_drain_exec_reads_total") or 0.0
