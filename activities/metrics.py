"""What the activities cost the API server, counted in this worker process.

Each drain read is one ``pods/exec`` through the API server, the dearest call a retirement
makes; so is each wait for idle (``activities.idle_wait``), counted with the reads.  Inside
an activity each read (and each failed one) is also counted on Temporal's activity metric
meter, which the worker exports with the SDK's own metrics (``worker/telemetry.py``):
``retire_drain_exec_reads_total`` and ``retire_drain_exec_errors_total``.
The process-wide totals serve tests and benchmarks that call the activities directly.
"""

from __future__ import annotations

import threading

from temporalio import activity

#: Every metric this module exports, by Prometheus type.
EXPORTED = {"retire_drain_exec_reads_total": "counter", "retire_drain_exec_errors_total": "counter"}

_lock = threading.Lock()
_totals = {"reads": 0, "errors": 0}


def count_exec_read(*, failed: bool) -> None:
    """One drain exec was made (``failed``: it gave no usable output)."""
    with _lock:
        _totals["reads"] += 1
        _totals["errors"] += int(failed)
    if activity.in_activity():
        meter = activity.metric_meter()
        meter.create_counter(
            "retire_drain_exec_reads_total", "Drain reads: pods/exec into an engine container"
        ).add(1)
        if failed:
            meter.create_counter(
                "retire_drain_exec_errors_total", "Drain reads that failed (no usable output)"
            ).add(1)


def drain_exec_reads() -> float:
    """How many drain execs this process has made so far (for a benchmark's rate)."""
    with _lock:
        return float(_totals["reads"])


def drain_exec_errors() -> float:
    """How many of them failed."""
    with _lock:
        return float(_totals["errors"])
