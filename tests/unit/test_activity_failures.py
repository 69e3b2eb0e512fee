"""How the workflow tells a person why a phase activity ended in an error
(``workflows.steps.failure``): an activity that timed out before it ever started could not
start in time (no worker slot free); anything else failed, with its cause."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows.wording import failure


def error(cause: BaseException, *, started_event_id: int) -> ActivityError:
    e = ActivityError(
        "activity error",
        scheduled_event_id=5,
        started_event_id=started_event_id,
        identity="worker",
        activity_type="drain",
        activity_id="7",
        retry_state=RetryState.TIMEOUT,
    )
    e.__cause__ = cause
    return e


def timeout(kind: TimeoutType) -> ActivityTimeout:
    return ActivityTimeout("activity timeout", type=kind, last_heartbeat_details=[])


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        (TimeoutType.SCHEDULE_TO_START, "ScheduleToStart"),
        (TimeoutType.SCHEDULE_TO_CLOSE, "ScheduleToClose"),
    ],
)
@pytest.mark.parametrize("unset", [0, -1])  # the server's EmptyEventID; the test server's
def test_a_timeout_before_the_activity_started_says_it_could_not_start(
    kind: TimeoutType, name: str, unset: int
) -> None:
    assert failure("drain", error(timeout(kind), started_event_id=unset)) == (
        f"drain could not start in time: it waited in the task queue until its {name} "
        "timeout (no worker slot free)"
    )


@pytest.mark.parametrize(
    "kind", [TimeoutType.SCHEDULE_TO_CLOSE, TimeoutType.START_TO_CLOSE, TimeoutType.HEARTBEAT]
)
def test_a_timeout_of_a_started_activity_is_a_failure(kind: TimeoutType) -> None:
    reason = failure("drain", error(timeout(kind), started_event_id=9))
    assert reason == "drain failed: activity timeout"


def test_a_heartbeat_timeout_is_never_a_queueing_delay() -> None:
    reason = failure("drain", error(timeout(TimeoutType.HEARTBEAT), started_event_id=0))
    assert reason.startswith("drain failed:")


def test_any_other_error_is_a_failure_with_its_cause() -> None:
    reason = failure("withdraw", error(ApplicationError("HTTP 403"), started_event_id=0))
    assert reason == "withdraw failed: HTTP 403"
