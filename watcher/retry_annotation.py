"""The ``retirement-retry`` annotation on a ModelDeployment: what the watcher does with it.

A person asks for a retry of a held retirement by annotating its ModelDeployment with
``role:ordinal:token`` (``retirement.retry.parse_retry_annotation``).  The watcher's
answer (``answer``), applied by its reconcile (``watcher.reconcile``):

- a malformed value: a ``RetryAnnotationInvalid`` Warning Event, nothing else (the
  annotation stays, Temporal is not asked);
- no retirement of that role:ordinal runs: a ``RetryAnnotationIgnored`` Event, then the
  annotation is cleared;
- a token already consumed (by this retirement, the deployment's last one, or an earlier
  retirement of that role:ordinal): a replay, logged, then cleared;
- otherwise the token is delivered to the running retirement (its ``retry`` update), a
  ``RetryDelivered`` Event says the decision, and the annotation is cleared.

The clear is bound to the resourceVersion read (``clear_patch``): an annotation written
again meanwhile is not lost.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kube.deployment import ModelDeployment
from retirement.models import RetirementState
from retirement.names import ANNOTATION_RETRY
from retirement.retry import parse_retry_annotation


class Answer(StrEnum):
    INVALID = "invalid"  # malformed: an Event, nothing else
    IGNORED = "ignored"  # no retirement of its replica runs: an Event, cleared
    REPLAY = "replay"  # a consumed token: logged, cleared
    DELIVER = "deliver"  # delivered to the running retirement, cleared


@dataclass(frozen=True)
class RetryAnswer:
    """The answer to one annotation: ``value`` as written, the ``token`` it carries, and
    the Event's message (``INVALID``, ``IGNORED``)."""

    answer: Answer
    value: str
    token: str = ""
    message: str = ""


def answer(md: ModelDeployment, state: RetirementState | None) -> RetryAnswer | None:
    """The answer to ``md``'s annotation given the state of its running retirement
    (``state``, None when none runs); None when ``md`` carries no annotation."""
    value = md.annotations.get(ANNOTATION_RETRY)
    if value is None:
        return None
    try:
        ann = parse_retry_annotation(value)
    except ValueError as e:
        return RetryAnswer(Answer.INVALID, value, message=f"{ANNOTATION_RETRY}: {e}")
    if state is None or (state.request.role, state.request.ordinal) != (ann.role, ann.ordinal):
        message = f"no retirement of {ann.role}:{ann.ordinal} is running"
        return RetryAnswer(Answer.IGNORED, value, ann.token, message)
    consumed = (
        md.last_consumed_retry_token,
        state.last_consumed_retry_token,
        md.consumed_token(ann.role, ann.ordinal),
    )
    return RetryAnswer(Answer.REPLAY if ann.token in consumed else Answer.DELIVER, value, ann.token)


def wants_retry(md: ModelDeployment) -> bool:
    """Whether ``md`` carries a valid ``retirement-retry`` annotation (one to deliver or
    ignore; an invalid one only gets its Event and asks Temporal nothing)."""
    value = md.annotations.get(ANNOTATION_RETRY)
    if value is None:
        return False
    try:
        parse_retry_annotation(value)
    except ValueError:
        return False
    return True


def clear_patch(md: ModelDeployment) -> dict[str, Any]:
    """The merge patch that removes the annotation, bound to the version read."""
    return {
        "metadata": {
            "annotations": {ANNOTATION_RETRY: None},
            "resourceVersion": md.resource_version,
        }
    }
