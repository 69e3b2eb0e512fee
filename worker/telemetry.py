"""The worker's Prometheus endpoint: the Temporal SDK's own metrics (workflow and activity
task latencies, slots, polls, failures, ``temporal_*``) and the product's, emitted through
the SDK's metric meters (``workflows/metrics.py``, ``activities/metrics.py``: ``retire_*``),
on one ``/metrics`` served by the SDK's runtime."""

from __future__ import annotations

from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from workflows.metrics import PHASE_BUCKETS


def runtime_serving_metrics(address: str) -> Runtime:
    """A Temporal runtime whose metrics are served at ``http://<address>/metrics``."""
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=address,
                histogram_bucket_overrides={"retire_phase_duration_seconds": PHASE_BUCKETS},
            )
        )
    )
