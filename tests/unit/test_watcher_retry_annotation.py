"""The watcher's answer to a ``retirement-retry`` annotation (``watcher.retry_annotation``),
without Kubernetes or Temporal: malformed, for no running retirement of that replica, a
replay of a consumed token (of the run, the deployment, or the role:ordinal), delivered;
and the clear bound to the version read."""

from __future__ import annotations

import pytest

from kube.deployment import Engine, ModelDeployment, Role
from retirement.models import RetirementRequest, RetirementState
from retirement.names import ANNOTATION_RETRY
from watcher.retry_annotation import Answer, RetryAnswer, answer, clear_patch, wants_retry

TOKEN = "t-1"


def md(value: str | None = f"server:1:{TOKEN}", **kw: object) -> ModelDeployment:
    return ModelDeployment(
        namespace="ns",
        name="md",
        uid="uid",
        engine=Engine(name="vLLM"),
        roles=(Role(name="server", replicas=1),),
        annotations={} if value is None else {ANNOTATION_RETRY: value},
        resource_version="7",
        **kw,  # type: ignore[arg-type]
    )


def running(ordinal: int = 1, **kw: object) -> RetirementState:
    req = RetirementRequest(namespace="ns", deployment="md", role="server", ordinal=ordinal)
    state = RetirementState.begin(workflow_id="retirement/ns/md", request=req)
    return state.model_copy(update=kw)


def test_no_annotation_has_no_answer() -> None:
    assert answer(md(None), running()) is None
    assert not wants_retry(md(None))


def test_a_malformed_annotation_is_invalid_and_not_wanted() -> None:
    ans = answer(md("server:x"), running())
    assert ans is not None and ans.answer is Answer.INVALID
    assert ans.message.startswith(f"{ANNOTATION_RETRY}: expected role:ordinal:token")
    assert not wants_retry(md("server:x"))


@pytest.mark.parametrize("state", [None, running(ordinal=2)], ids=["none runs", "another"])
def test_an_annotation_for_no_running_retirement_of_its_replica_is_ignored(
    state: RetirementState | None,
) -> None:
    value = f"server:1:{TOKEN}"
    assert answer(md(value), state) == RetryAnswer(
        Answer.IGNORED, value, TOKEN, "no retirement of server:1 is running"
    )
    assert wants_retry(md(value))


@pytest.mark.parametrize(
    ("deployment", "state"),
    [
        (md(last_consumed_retry_token=TOKEN), running()),
        (md(), running(last_consumed_retry_token=TOKEN)),
        (md(retry_tokens={"server:1": TOKEN}), running()),
    ],
    ids=["deployment's last", "run's", "role:ordinal's"],
)
def test_a_consumed_token_is_a_replay(deployment: ModelDeployment, state: RetirementState) -> None:
    ans = answer(deployment, state)
    assert ans is not None and ans.answer is Answer.REPLAY and ans.token == TOKEN


def test_a_fresh_token_for_the_running_retirement_is_delivered() -> None:
    ans = answer(md(retry_tokens={"server:2": TOKEN}), running())
    assert ans == RetryAnswer(Answer.DELIVER, f"server:1:{TOKEN}", TOKEN)


def test_the_clear_is_bound_to_the_version_read() -> None:
    assert clear_patch(md()) == {
        "metadata": {"annotations": {ANNOTATION_RETRY: None}, "resourceVersion": "7"}
    }
