"""Safe upgrades and named timers.

- Every history under ``tests/workflows/histories/`` (recorded by
  ``tests.workflows.history_paths``: complete; abort and hold; retry by signal;
  cancel-intent; reruns of an UNKNOWN phase; a long hold continued as new) replays on
  today's workflow.  A change that does not replay fails here: docs/runbook.md,
  "Upgrading", says how to ship it.
- Every timer the workflow starts names what it waits for (the Temporal UI shows the
  summary instead of ``1 (5m, 20s)``): live on the time-skipping server, and in the
  recorded histories.
- Every payload the recorded histories hold (the workflow's input, a continue-as-new's
  input with the held state it carries, its result, each activity's input and result)
  decodes into its model and encodes again byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer

from retirement.models import (
    Admission,
    AdmitInput,
    DeleteResult,
    Observation,
    PhaseInput,
    PublishInput,
    RestoreResult,
    RetirementRequest,
    RetirementState,
)
from tests.workflows.history_paths import HISTORIES, TIME_SKIPPING, run_paths
from workflows.retirement import RetirementWorkflow
from workflows.wording import PHASE_ACTIVITY, backstop_summary, rerun_summary

#: The paths a new build must replay (each file is one run; two runs where the path
#: continues as new).
EXPECTED = {
    "complete",
    "stale-evidence",
    "abort-hold",
    "retry-signal-1",
    "retry-signal-2",
    "cancel-intent",
    "reruns",
    "long-hold-continued-1",
    "long-hold-continued-2",
}

#: What a hold's timer waits for: members to put back, routers to read again, the
#: abandon bound of a hold asked to end.
HELD = re.compile(r"^held: (put back \S+.* again|read the routers again|abandon if still not back)")


def recorded(*, older: bool = False) -> list[tuple[str, WorkflowHistory]]:
    """The histories recorded by this build (``histories/*.json``) by name; with
    ``older``, also those kept from earlier builds (``histories/<build>/*.json``)."""
    files = HISTORIES.rglob("*.json") if older else HISTORIES.glob("*.json")
    return [
        (
            str(f.relative_to(HISTORIES).with_suffix("")),
            WorkflowHistory.from_json(f"retirement/hist/{f.stem}", f.read_text()),
        )
        for f in sorted(files)
    ]


def timer_summaries(history: WorkflowHistory) -> list[str]:
    """The summary of every TimerStarted event ("" when it has none)."""
    convert = pydantic_data_converter.payload_converter
    out = []
    for e in history.events:
        if e.event_type != EventType.EVENT_TYPE_TIMER_STARTED:
            continue
        has = e.HasField("user_metadata") and e.user_metadata.HasField("summary")
        out.append(convert.from_payload(e.user_metadata.summary, str) if has else "")
    return out


def assert_named(histories: list[tuple[str, WorkflowHistory]]) -> set[str]:
    """Every timer names what it waits for; the kinds of timer seen."""
    backstops = {backstop_summary(p) for p in PHASE_ACTIVITY}
    reruns = {rerun_summary(p) for p in PHASE_ACTIVITY}
    kinds: set[str] = set()
    for name, history in histories:
        for summary in timer_summaries(history):
            assert summary.strip(), f"{name}: a timer without a summary"
            if summary in backstops:
                kinds.add("backstop")
            elif summary in reruns:
                kinds.add("rerun")
            else:
                assert HELD.match(summary), f"{name}: {summary!r}"
                kinds.add("held")
    return kinds


async def test_recorded_histories_replay_on_this_build() -> None:
    """The baseline: histories recorded before a change must replay after it (those of
    earlier builds kept in subdirectories too: a change guarded by ``workflow.patched``
    must still replay them)."""
    assert {name for name, _ in recorded()} >= EXPECTED, sorted(n for n, _ in recorded())
    histories = recorded(older=True)
    replayer = Replayer(workflows=[RetirementWorkflow], data_converter=pydantic_data_converter)
    for name, history in histories:
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, f"{name} does not replay: {result.replay_failure}"


def test_the_recorded_paths_are_what_they_say() -> None:
    """The files hold the paths they are named for (a re-recording that went wrong shows
    here, not as a replay that proves little)."""
    ends = {name: EventType.Name(history.events[-1].event_type) for name, history in recorded()}
    assert ends["complete"] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED"
    assert ends["stale-evidence"] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED"
    activities = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in dict(recorded())["stale-evidence"].events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert activities.count("drain") == 1 and "delete" in activities, activities
    assert ends["abort-hold"] == "EVENT_TYPE_WORKFLOW_TASK_COMPLETED"  # still held
    for first in ("retry-signal-1", "long-hold-continued-1"):
        assert ends[first] == "EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW", first
    for last in ("retry-signal-2", "cancel-intent", "reruns", "long-hold-continued-2"):
        assert ends[last] == "EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED", last
    kinds = {name: {EventType.Name(e.event_type) for e in h.events} for name, h in recorded()}
    assert "EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED" in kinds["abort-hold"]
    assert "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED" in kinds["abort-hold"]
    assert "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED" in kinds["retry-signal-1"]
    assert "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED" in kinds["cancel-intent"]


def test_recorded_timers_name_what_they_wait_for() -> None:
    kinds = assert_named(recorded())
    assert kinds == {"backstop", "rerun", "held"}, kinds


async def test_every_timer_names_what_it_waits_for(
    time_skipping_env: WorkflowEnvironment,
) -> None:
    """Run every path live and read each TimerStarted event's summary: the phase
    activity's backstop, the wait before an UNKNOWN phase runs again, a hold's recheck
    (after an abort, and in a run a long hold continued into)."""
    histories = await run_paths(time_skipping_env, TIME_SKIPPING)
    assert sum(len(timer_summaries(h)) for _, h in histories) > 10
    kinds = assert_named(histories)
    assert kinds == {"backstop", "rerun", "held"}, kinds
    carried = dict(histories)["long-hold-carried"]
    assert any(HELD.match(s) for s in timer_summaries(carried))


#: The models of each activity's input and result (``publish`` returns nothing).
ACTIVITY_IO: dict[str, tuple[type[BaseModel], type[BaseModel] | None]] = {
    "admit": (AdmitInput, Admission),
    **{name: (PhaseInput, Observation) for name in ("disqualify", "withdraw", "drain", "settle")},
    "delete": (PhaseInput, DeleteResult),
    "restore": (PhaseInput, RestoreResult),
    "publish": (PublishInput, None),
}


def payloads(history: WorkflowHistory) -> Iterator[tuple[Payload, type[BaseModel]]]:
    """Every payload of the workflow's input (a continue-as-new's too), its result, and
    its activities' inputs and results, with the model it holds."""
    scheduled: dict[int, str] = {}
    for e in history.events:
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            for p in e.workflow_execution_started_event_attributes.input.payloads:
                yield p, RetirementRequest
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            for p in e.workflow_execution_continued_as_new_event_attributes.input.payloads:
                yield p, RetirementRequest
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            for p in e.workflow_execution_completed_event_attributes.result.payloads:
                yield p, RetirementState
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            a = e.activity_task_scheduled_event_attributes
            scheduled[e.event_id] = a.activity_type.name
            for p in a.input.payloads:
                yield p, ACTIVITY_IO[a.activity_type.name][0]
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            c = e.activity_task_completed_event_attributes
            result = ACTIVITY_IO[scheduled[c.scheduled_event_id]][1]
            for p in c.result.payloads if result is not None else ():
                yield p, result


def test_recorded_payloads_encode_as_they_were_recorded() -> None:
    """What goes into history keeps its shape (field names, values, key order): a model
    change that fails here changes what running retirements' histories hold, and the
    histories are recorded again only on purpose (``history_paths``)."""
    convert = pydantic_data_converter.payload_converter
    seen: set[str] = set()
    for name, history in recorded():
        for payload, model in payloads(history):
            again = convert.to_payloads([convert.from_payload(payload, model)])[0]
            assert again.data == payload.data, f"{name}: a {model.__name__} encodes otherwise"
            seen.add(model.__name__)
    assert seen == {m.__name__ for m in (RetirementRequest, RetirementState)} | {
        m.__name__ for io in ACTIVITY_IO.values() for m in io if m is not None
    }
