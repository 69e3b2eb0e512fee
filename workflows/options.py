"""Timeouts and retry policies of the retirement's activities (one place for all of them)."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy

from activities.fencing import THROTTLE_S

#: Errors an activity raises that retrying cannot mend (a 404/409/422/403): the names of
#: ``kube.errors``' classes that are not ``retryable`` (``activities.errors`` raises each as
#: an ``ApplicationError`` of its class's name; ``tests/unit/test_error_vocabulary.py``
#: holds the two lists together; this module stays free of the Kubernetes client, which
#: the workflow sandbox would import).
NON_RETRYABLE = ["NotFound", "Conflict", "Invalid", "Forbidden"]
#: Slack between an activity's own deadline and the workflow's timeout of it.
GRACE = timedelta(seconds=15)
#: The workflow's own timer on a phase activity fires this long after the activity's
#: ScheduleToClose timeout: the server's timeout, which says whether the activity ever
#: started, answers first (the timer is only a backstop).
BACKSTOP = timedelta(seconds=5)
#: Heartbeat timeout of the polling activities (one request may take the Kubernetes
#: layer's 10 s timeout, so no shorter).
HEARTBEAT = timedelta(seconds=10)
#: How often a worker sends heartbeats at most (the SDK would wait 0.8 x HEARTBEAT).  A
#: cancel reaches a running activity only on a heartbeat's answer, so this bounds how long
#: an abort waits for the phase activity to stop before the restore begins; the fencing of
#: the activities' changes counts on it (``activities.fencing``).
HEARTBEAT_THROTTLE = timedelta(seconds=THROTTLE_S)
ADMIT_TIMEOUT = timedelta(seconds=30)
DELETE_TIMEOUT = timedelta(seconds=60)
DELETE_SCHEDULE_TIMEOUT = timedelta(minutes=30)
RESTORE_BUDGET = timedelta(seconds=30)
RESTORE_TIMEOUT = timedelta(seconds=60)
RESTORE_SCHEDULE_TIMEOUT = timedelta(minutes=5)
PUBLISH_TIMEOUT = timedelta(seconds=20)
PUBLISH_SCHEDULE_TIMEOUT = timedelta(minutes=2)

SHORT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    non_retryable_error_types=NON_RETRYABLE,
)
#: The API server may be down for a while; after ~2.5 min of attempts, or on a definite
#: error, admission refuses (nothing was touched; the watcher derives the intent again).
ADMIT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=5),
    maximum_attempts=30,
    non_retryable_error_types=NON_RETRYABLE,
)
#: After the point of no return the deletes must finish: retry until they do (an error
#: the activity marks non-retryable, such as Invalid, still ends them).
PERSISTENT = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
)
