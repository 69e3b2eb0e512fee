"""The retirement's own metrics, emitted through Temporal's workflow metric meter.

The worker's runtime exports them with the SDK's own metrics on one Prometheus endpoint
(``worker/telemetry.py``); the SDK drops them while a workflow replays, so each is counted
once.  Names (attributes in braces):

- ``retire_retirements_total{outcome}``: a retirement reached an outcome (an abort into a
  hold counts as Aborted; the same retirement completing after a retry counts again);
- ``retire_phase_duration_seconds{phase}``: how long each phase lasted;
- ``retire_members_abandoned_total{deployment, members}``: members a retirement ended with
  out of service (outcome Abandoned), by name.

Counters carry ``_total`` in their names here: the SDK's exporter adds no suffix.

Nothing here says what holds *now*: a gauge set from workflow code lives on whichever
worker ran the workflow's last task, so with two workers one kept exporting a hold for
ever, and a terminated workflow never reset it.  The watcher exports the holds from
Temporal's visibility instead (``retire_watcher_retirement_held{deployment}``,
``watcher/running.py``); how many members a hold could not put back is in the workflow's
state (``retire status``, its current details), not a metric.
"""

from __future__ import annotations

from temporalio import workflow

from retirement.models import RetirementState
from retirement.phases import Outcome, Phase

#: Every metric this module exports, by Prometheus type (the alert rules and the dashboard
#: are checked against these names).
EXPORTED = {
    "retire_retirements_total": "counter",
    "retire_phase_duration_seconds": "histogram",
    "retire_members_abandoned_total": "counter",
}
#: Phase-duration buckets, in seconds (a phase lasts from milliseconds to its budget).
PHASE_BUCKETS = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240, 300, 600)


class RetirementMetrics:
    """What one workflow run has emitted so far (phase entries, outcome)."""

    def __init__(self, *, already: RetirementState | None = None) -> None:
        self._entries = len(already.phase_timeline) if already else 0
        self._outcome = already.outcome if already else Outcome.RUNNING

    def show(self, s: RetirementState) -> None:
        """Emit what changed since the last call."""
        meter = workflow.metric_meter()
        timeline = s.phase_timeline
        durations = meter.create_histogram_float(
            "retire_phase_duration_seconds", "How long each phase of a retirement lasted", "s"
        )
        for i in range(max(1, self._entries), len(timeline)):
            (phase, started), (_, ended) = timeline[i - 1], timeline[i]
            if phase not in (Phase.COMPLETED, Phase.ABORTED):
                durations.record(max(0.0, (ended - started).total_seconds()), {"phase": str(phase)})
        self._entries = len(timeline)
        if s.outcome is not self._outcome and s.outcome is not Outcome.RUNNING:
            meter.create_counter(
                "retire_retirements_total", "Retirements that reached an outcome, by outcome"
            ).add(1, {"outcome": str(s.outcome)})
            if s.outcome is Outcome.ABANDONED:
                meter.create_counter(
                    "retire_members_abandoned_total",
                    "Members a retirement ended with out of service (outcome Abandoned)",
                ).add(
                    max(1, len(s.unrestored)),
                    {
                        "deployment": f"{s.request.namespace}/{s.request.deployment}",
                        "members": ",".join(sorted(s.unrestored)),
                    },
                )
        self._outcome = s.outcome
