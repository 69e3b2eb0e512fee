"""Cancelling the polling activities (``withdraw``, ``drain``, ``settle``, ``restore``)
under ``ActivityEnvironment``: a cancellation that arrives while an activity waits for its
next poll stops it at once with ``CancelledError`` (not after the poll interval), and it
makes no Kubernetes call after that, so a cancelled phase never writes or deletes."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.exceptions import CancelledError

from activities import RetirementActivities
from kube.api import ExecResult
from retirement.models import Admission, AdmitInput, PhaseInput, RetirementRequest, Target
from retirement.names import LABEL_ELIGIBLE
from tests.helpers import model_deployment
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod, oneshot_stdout

NS = "default"
MD = "llm"
#: Long enough that only a cancellation can end the wait within the test's bounds.
INTERVAL_S = 30.0


def admitted() -> tuple[FakeKube, Target]:
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1))
    kube.add_pod(member_pod("llm-1", deployment=MD, ordinal=1, uid="uid-1", ip="198.18.1.11"))
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    kube.calls.clear()
    return kube, admission.target


def holding(name: str) -> tuple[FakeKube, Target]:
    """A cluster where activity ``name`` answers UNKNOWN on every poll."""
    kube, target = admitted()
    if name == "withdraw":  # router-less, policy hold
        kube.set_label("llm-1", LABEL_ELIGIBLE, None)
    elif name == "drain":  # always busy
        kube.set_label("llm-1", LABEL_ELIGIBLE, None)
        kube.script_exec("llm-1", ExecResult(stdout=oneshot_stdout(in_flight=1)))
    elif name == "settle":  # the Pod is still there
        pass
    elif name == "restore":  # Ready is Unknown: held
        kube.add_pod(
            member_pod(
                "llm-1",
                deployment=MD,
                ordinal=1,
                uid="uid-1",
                ip="198.18.1.11",
                eligible=False,
                ready=None,
            )
        )
    kube.calls.clear()
    return kube, target


POLLING = ["withdraw", "drain", "settle", "restore"]


def activity(kube: FakeKube, name: str) -> Callable[[PhaseInput], Any]:
    acts = RetirementActivities(kube)
    fn: Callable[[PhaseInput], Any] = getattr(acts, name)
    return fn


def phase(target: Target) -> PhaseInput:
    return PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=120),
        poll_interval_s=INTERVAL_S,
    )


@pytest.mark.parametrize("name", POLLING)
def test_a_cancellation_mid_poll_stops_the_activity_at_once(name: str) -> None:
    kube, target = holding(name)
    env = attempt_env()
    beat = threading.Event()
    beats: list[Any] = []

    def on_heartbeat(*details: Any) -> None:
        beats.extend(details)
        if details:  # a poll's heartbeat (the attempt's first one carries nothing)
            beat.set()

    env.on_heartbeat = on_heartbeat
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(env.run(activity(kube, name), phase(target)))
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert beat.wait(5), "no heartbeat: the activity did not poll"
    calls_at_cancel = len(kube.calls)
    started = time.monotonic()
    env.cancel()
    thread.join(5)
    assert not thread.is_alive()
    assert time.monotonic() - started < 5 < INTERVAL_S
    [result] = outcome
    assert isinstance(result, CancelledError), result
    assert len(beats) == 1  # one poll, then the wait the cancellation cut short
    assert len(kube.calls) == calls_at_cancel
    assert not {"patch_pod", "delete_pod", "delete_workload"} & {c.method for c in kube.calls}


@pytest.mark.parametrize("name", POLLING)
def test_an_activity_cancelled_before_it_starts_polls_once_and_stops(name: str) -> None:
    kube, target = holding(name)
    env = attempt_env()
    beats: list[Any] = []
    env.on_heartbeat = lambda *d: beats.extend(d)
    env.cancel()
    started = time.monotonic()
    with pytest.raises(CancelledError):
        env.run(activity(kube, name), phase(target))
    assert time.monotonic() - started < 5
    assert len(beats) == 1
    assert not {"patch_pod", "delete_pod", "delete_workload"} & {c.method for c in kube.calls}
