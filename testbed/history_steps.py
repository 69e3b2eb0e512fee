"""The activities a retirement's history shows, remote and local alike, for the benchmarks
and the tests that read histories.

A remote activity is three events (scheduled, started, completed or failed); a local one
(``workflows.steps``: admission, disqualification, the mirror's last publishes) is one
``core_local_activity`` marker, recorded with the workflow task that ran it: its ``data``
names the activity type, its ``result`` holds the result, and a failed one carries a
``failure`` instead.  Its event time is when the server recorded it (the workflow task's
completion), the earliest moment the rest of the world can know of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace

from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent

#: The marker the SDK's core records for each local activity.
LOCAL_ACTIVITY_MARKER = "core_local_activity"


@dataclass(frozen=True)
class ActivityStep:
    """One activity of a history, in the order it was asked for (a local one: recorded)."""

    name: str
    local: bool
    #: When it completed (seconds since the epoch); None while it has not, or it failed.
    completed_at: float | None = None
    #: Its result's payload (None: none, or it has not completed).
    result: Payload | None = None


def event_seconds(e: HistoryEvent) -> float:
    """The event's time in seconds since the epoch."""
    return e.event_time.seconds + e.event_time.nanos / 1e9


def activity_steps(events: Iterable[HistoryEvent]) -> list[ActivityStep]:
    """Every activity of ``events``, remote or local, in order."""
    steps: list[ActivityStep] = []
    by_scheduled: dict[int, int] = {}
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            by_scheduled[e.event_id] = len(steps)
            name = e.activity_task_scheduled_event_attributes.activity_type.name
            steps.append(ActivityStep(name=name, local=False))
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            c = e.activity_task_completed_event_attributes
            i = by_scheduled.get(c.scheduled_event_id)
            if i is not None:
                payloads = list(c.result.payloads)
                steps[i] = replace(
                    steps[i],
                    completed_at=event_seconds(e),
                    result=payloads[0] if payloads else None,
                )
        elif e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            m = e.marker_recorded_event_attributes
            if m.marker_name != LOCAL_ACTIVITY_MARKER:
                continue
            data = json.loads(m.details["data"].payloads[0].data)
            failed = m.HasField("failure")
            results = list(m.details["result"].payloads) if "result" in m.details else []
            steps.append(
                ActivityStep(
                    name=str(data["activity_type"]),
                    local=True,
                    completed_at=None if failed else event_seconds(e),
                    result=results[0] if results and not failed else None,
                )
            )
    return steps


def activity_names(events: Iterable[HistoryEvent]) -> list[str]:
    """The activity types of ``events`` in order, remote or local."""
    return [s.name for s in activity_steps(events)]
