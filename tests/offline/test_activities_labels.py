"""``disqualify`` and ``restore`` under ``ActivityEnvironment`` against the fake Kubernetes
layer: the eligibility label comes off (and goes back on) only the admitted UIDs, a
concurrent change of the label is read again and never overwritten blindly, a replaced or
gone member is never touched, and a Kubernetes error is an ``ApplicationError`` (never a
delete)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from activities import RetirementActivities
from activities.http_client import http_client
from activities.labels import LABEL_ATTEMPTS
from kube.errors import Forbidden, KubeError, Unavailable
from kube.objects import Pod
from retirement.models import (
    Admission,
    AdmitInput,
    IntentKind,
    Observation,
    PhaseInput,
    RestoreResult,
    RetirementRequest,
    Target,
)
from retirement.names import LABEL_ELIGIBLE, LABEL_INSTANCE
from retirement.phases import Verdict
from tests.helpers import eventually, model_deployment
from tests.helpers.activity_env import attempt_env, recording_env
from tests.helpers.fake_kube import FakeKube, member_pod

NS = "default"
MD = "llm"
WRITES = {"patch_pod", "delete_pod", "delete_workload", "patch_deployment"}


# ---------------------------------------------------------------- a bound target


def single(**kw: Any) -> dict[str, Any]:
    kw.setdefault("uid", "uid-1")
    kw.setdefault("ip", "198.18.1.11")
    return member_pod("llm-1", deployment=MD, ordinal=1, **kw)


def group_member(index: int, **kw: Any) -> dict[str, Any]:
    kw.setdefault("uid", f"uid-1-{index}")
    kw.setdefault("ip", f"198.18.1.{20 + index}")
    return member_pod(f"llm-1-{index}", deployment=MD, ordinal=1, member=index, **kw)


def admitted(
    *pods: dict[str, Any], size: int = 1, version: str = "0.29.0", kube: FakeKube | None = None
) -> tuple[FakeKube, Target]:
    """A cluster (``kube``, default a new FakeKube) with ``pods`` as replica 1 of ``llm``,
    and the target admission binds."""
    kube = kube or FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, size=size, version=version))
    for p in pods or (single(),):
        kube.add_pod(p)
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    kube.calls.clear()
    return kube, admission.target


def phase(target: Target, *, seconds: float = 5.0, interval: float = 0.01) -> PhaseInput:
    return PhaseInput(
        target=target,
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        poll_interval_s=interval,
    )


def replace(kube: FakeKube, pod: dict[str, Any], uid: str = "uid-new") -> None:
    """A Pod of the same name with another UID takes the member's place."""
    body = json.loads(json.dumps(pod))
    body["metadata"]["uid"] = uid
    kube.add_pod(body)


def restate(kube: FakeKube, pod: dict[str, Any]) -> None:
    """The member (same name, same UID) now reads as ``pod`` (its status, its labels)."""
    kube.add_pod(pod)


def eligible(kube: FakeKube, pod: str) -> str | None:
    return kube.pod_labels(pod).get(LABEL_ELIGIBLE)


def writes(kube: FakeKube) -> list[str]:
    return [c.method for c in kube.calls if c.method in WRITES]


# ---------------------------------------------------------------- disqualify


def disqualify(kube: FakeKube, target: Target) -> Observation:
    obs: Observation = attempt_env().run(RetirementActivities(kube).disqualify, phase(target))
    return obs


def test_disqualify_takes_the_label_off_every_member_bound_to_its_uid() -> None:
    kube, target = admitted(group_member(0), group_member(1), size=2)
    obs = disqualify(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.readings == {"llm-1-0": "label removed", "llm-1-1": "label removed"}
    assert eligible(kube, "llm-1-0") is None and eligible(kube, "llm-1-1") is None
    assert kube.pod_labels("llm-1-0")["app.kubernetes.io/instance"] == MD  # only that label
    for call in kube.called("patch_pod"):
        uid = "uid-1-0" if call.args["name"] == "llm-1-0" else "uid-1-1"
        assert call.args["ops"][0] == {"op": "test", "path": "/metadata/uid", "value": uid}
    assert writes(kube) == ["patch_pod", "patch_pod"]


def test_disqualify_binds_each_removal_to_the_pod_as_it_read_it() -> None:
    """Each removal tests the resourceVersion of the read just before it: one that lands
    late, after the label was put back, changes nothing (``kube.members``)."""
    kube, target = admitted()
    version = kube.read_pod(namespace=NS, name="llm-1").resource_version
    kube.calls.clear()
    assert disqualify(kube, target).verdict is Verdict.VERIFIED
    (call,) = kube.called("patch_pod")
    assert {"op": "test", "path": "/metadata/resourceVersion", "value": version} in call.args["ops"]


def test_disqualify_again_verifies_without_writing() -> None:
    kube, target = admitted()
    assert disqualify(kube, target).verdict is Verdict.VERIFIED
    kube.calls.clear()
    obs = disqualify(kube, target)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.readings == {"llm-1": "label already absent"}
    assert writes(kube) == []


@pytest.mark.parametrize("how", ["replaced", "gone"])
def test_disqualify_fails_on_a_lost_member_and_touches_no_replacement(how: str) -> None:
    kube, target = admitted(group_member(0), group_member(1), size=2)
    if how == "replaced":
        replace(kube, group_member(1))
    else:
        kube.remove_pod("llm-1-1")
    obs = disqualify(kube, target)
    assert obs.verdict is Verdict.FAILED
    assert obs.reason == "member llm-1-1 is gone or replaced"
    assert obs.readings == {"llm-1-0": "label removed"}  # what was done before
    assert [c.args["name"] for c in kube.called("patch_pod")] == ["llm-1-0"]
    if how == "replaced":
        assert eligible(kube, "llm-1-1") == "true"  # the replacement keeps its label
    assert "delete_pod" not in writes(kube)


class ConcurrentWriter(FakeKube):
    """Before each of the first ``times`` Pod patches, another writer changes the label
    (or, with ``replace_uid``, replaces the Pod): a change between read and write."""

    def __init__(self, *, replace_uid: str | None = None) -> None:
        super().__init__()
        self.times, self.replace_uid = 0, replace_uid

    def patch_pod(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> Pod:
        if self.times > 0:
            self.times -= 1
            if self.replace_uid is not None:
                body = json.loads(json.dumps(self.pods[(namespace, name)]))
                body["metadata"]["uid"] = self.replace_uid
                self.add_pod(body)
            else:
                self.set_label(name, LABEL_ELIGIBLE, f"v{self.times}", namespace=namespace)
        return super().patch_pod(namespace=namespace, name=name, ops=ops)


def test_disqualify_reads_again_after_a_concurrent_label_change() -> None:
    racing = ConcurrentWriter()
    _, target = admitted(kube=racing)
    racing.times = 1
    obs = disqualify(racing, target)
    assert obs.verdict is Verdict.VERIFIED
    assert eligible(racing, "llm-1") is None
    assert len(racing.called("patch_pod")) == 2  # the first write's test failed


def test_disqualify_holds_when_the_label_keeps_changing() -> None:
    racing = ConcurrentWriter()
    _, target = admitted(kube=racing)
    racing.times = LABEL_ATTEMPTS
    obs = disqualify(racing, target)
    assert obs.verdict is Verdict.UNKNOWN
    assert "keeps changing concurrently" in obs.reason
    assert eligible(racing, "llm-1") == "v0"  # never overwritten blindly
    assert len(racing.called("patch_pod")) == LABEL_ATTEMPTS


class ConcurrentRemover(FakeKube):
    """Before each Pod patch, another writer changes the label (``changes`` times, then)
    removes it: the label goes away between disqualify's read and its write."""

    def __init__(self, *, changes: int = 0) -> None:
        super().__init__()
        self.armed, self.changes = False, changes

    def patch_pod(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> Pod:
        if self.armed:
            if self.changes > 0:
                self.changes -= 1
                self.set_label(name, LABEL_ELIGIBLE, f"v{self.changes}", namespace=namespace)
            else:
                self.armed = False
                self.set_label(name, LABEL_ELIGIBLE, None, namespace=namespace)
        return super().patch_pod(namespace=namespace, name=name, ops=ops)


def test_disqualify_reads_a_label_removed_by_someone_else_as_done() -> None:
    racing = ConcurrentRemover()
    _, target = admitted(kube=racing)
    racing.armed = True
    obs = disqualify(racing, target)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.readings == {"llm-1": "label already absent"}
    assert eligible(racing, "llm-1") is None
    assert len(racing.called("patch_pod")) == 1  # its test failed; nothing written


def test_disqualify_reads_a_label_removed_at_its_last_attempt_as_done() -> None:
    """The label changes under every allowed write, the last time by being removed: the
    member is withdrawn as asked, not "changing concurrently" (nor replaced)."""
    racing = ConcurrentRemover(changes=LABEL_ATTEMPTS - 1)
    _, target = admitted(kube=racing)
    racing.armed = True
    obs = disqualify(racing, target)
    assert obs.verdict is Verdict.VERIFIED, obs.reason
    assert obs.readings == {"llm-1": "label already absent"}
    assert len(racing.called("patch_pod")) == LABEL_ATTEMPTS
    assert writes(racing) == ["patch_pod"] * LABEL_ATTEMPTS  # every write's test failed


def test_disqualify_goes_on_after_a_member_whose_label_someone_else_removed() -> None:
    racing = ConcurrentRemover()
    _, target = admitted(group_member(0), group_member(1), size=2, kube=racing)
    racing.armed = True
    obs = disqualify(racing, target)
    assert obs.verdict is Verdict.VERIFIED
    assert obs.readings == {"llm-1-0": "label already absent", "llm-1-1": "label removed"}
    assert eligible(racing, "llm-1-0") is None and eligible(racing, "llm-1-1") is None


def test_disqualify_fails_on_a_replacement_between_read_and_write() -> None:
    racing = ConcurrentWriter(replace_uid="uid-new")
    _, target = admitted(kube=racing)
    racing.times = 1
    obs = disqualify(racing, target)
    assert obs.verdict is Verdict.FAILED
    assert obs.reason == "member llm-1 was replaced"
    assert racing.pods[(NS, "llm-1")]["metadata"]["uid"] == "uid-new"
    assert eligible(racing, "llm-1") == "true"  # the replacement is untouched


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("read_pod", Unavailable("read Pod", status=503)),
        ("read_pod", Forbidden("read Pod", status=403)),
        ("patch_pod", Unavailable("patch Pod", reason="TimeoutError")),
        ("patch_pod", Forbidden("patch Pod", status=403)),
    ],
    ids=["read-unavailable", "read-forbidden", "patch-unavailable", "patch-forbidden"],
)
def test_disqualify_raises_a_kubernetes_error_as_its_application_error(
    method: str, error: KubeError
) -> None:
    kube, target = admitted()
    kube.fail(method, error)
    with pytest.raises(ApplicationError) as info:
        disqualify(kube, target)
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not error.retryable
    assert eligible(kube, "llm-1") == "true"
    assert "delete_pod" not in writes(kube)


# ---------------------------------------------------------------- restore


def restore(
    kube: FakeKube,
    target: Target,
    *,
    seconds: float = 5.0,
    heartbeats: list[Any] | None = None,
    on_beat: Callable[[int], None] | None = None,
) -> RestoreResult:
    beats: list[Any] = [] if heartbeats is None else heartbeats
    env = recording_env(beats, on_beat=on_beat)
    result: RestoreResult = env.run(
        RetirementActivities(kube).restore, phase(target, seconds=seconds)
    )
    return result


def disqualified(
    *pods: dict[str, Any], size: int = 1, version: str = "0.29.0", kube: FakeKube | None = None
) -> tuple[FakeKube, Target]:
    """``admitted``, then the label taken off by ``disqualify``."""
    kube, target = admitted(*pods, size=size, version=version, kube=kube)
    assert disqualify(kube, target).verdict is Verdict.VERIFIED
    kube.calls.clear()
    return kube, target


def test_restore_puts_the_label_back_on_the_admitted_ready_member() -> None:
    kube, target = disqualified()
    beats: list[Any] = []
    result = restore(kube, target, heartbeats=beats)
    assert result == RestoreResult(restored=["llm-1"])
    assert eligible(kube, "llm-1") == "true"
    [patch] = kube.called("patch_pod")
    assert patch.args["ops"][:2] == [
        {"op": "test", "path": "/metadata/uid", "value": "uid-1"},
        {
            "op": "test",
            "path": f"/metadata/labels/{LABEL_ELIGIBLE.replace('/', '~1')}",
            "value": None,
        },
    ]
    assert [(b.verdict, b.polls) for b in beats] == [(Verdict.VERIFIED, 1)]


@pytest.mark.parametrize("how", ["replaced", "gone"])
def test_restore_never_touches_a_replacement(how: str) -> None:
    kube, target = disqualified()
    if how == "replaced":
        replace(kube, single(eligible=False))
    else:
        kube.remove_pod("llm-1")
    result = restore(kube, target)
    assert result.restored == [] and result.held == {}
    assert result.failed == {"llm-1": "gone or replaced: not the admitted UID"}
    assert writes(kube) == []
    if how == "replaced":
        assert eligible(kube, "llm-1") is None


def test_restore_holds_a_member_that_is_not_ready_then_restores_it_once_it_recovers() -> None:
    """PodReady False (an engine restarting during the incident that caused the abort) is
    not final: the member is held, and put back once it is Ready again."""
    kube, target = disqualified()
    restate(kube, single(eligible=False, ready="False"))
    beats: list[Any] = []

    def recovers(n: int) -> None:
        if n == 2:
            restate(kube, single(eligible=False, ready="True"))

    result = restore(kube, target, heartbeats=beats, on_beat=recovers)
    assert result == RestoreResult(restored=["llm-1"])
    assert beats[0].reason == "llm-1: PodReady is False"
    assert eligible(kube, "llm-1") == "true"


def test_restore_holds_while_ready_is_unknown_then_restores_when_ready() -> None:
    kube, target = disqualified()
    restate(kube, single(eligible=False, ready=None))  # no Ready condition
    beats: list[Any] = []

    def becomes_ready(n: int) -> None:
        if n == 2:
            restate(kube, single(eligible=False, ready="True"))

    result = restore(kube, target, heartbeats=beats, on_beat=becomes_ready)
    assert result == RestoreResult(restored=["llm-1"])
    assert eligible(kube, "llm-1") == "true"
    assert [b.verdict for b in beats] == [Verdict.UNKNOWN, Verdict.UNKNOWN, Verdict.VERIFIED]
    assert beats[0].reason == "llm-1: PodReady is Unknown"


def test_restore_holds_until_its_deadline() -> None:
    kube, target = disqualified()
    restate(kube, single(eligible=False, ready=None))
    started = time.monotonic()
    result = restore(kube, target, seconds=0.1)
    assert time.monotonic() - started < 2.0
    assert result.held == {"llm-1": "PodReady is Unknown"}
    assert result.restored == [] and result.failed == {}
    assert eligible(kube, "llm-1") is None


def test_a_restore_attempt_that_starts_past_its_deadline_still_makes_one_whole_pass() -> None:
    """An attempt that starts late (the API server slow around the abort, a worker
    restart, queue lag) used to return an empty result at once, which read as "every
    member back": it puts the label back, reads everything once, and reports what it
    could not confirm."""
    kube, target = disqualified()
    result = restore(kube, target, seconds=-1)
    assert result.restored == ["llm-1"] and not result.held
    assert eligible(kube, "llm-1") == "true"


def test_a_late_restore_attempt_reports_what_it_could_not_confirm_as_held() -> None:
    kube, target = disqualified()
    kube.add_service("llm", selector={LABEL_INSTANCE: MD}, namespace=NS)  # lists nothing yet
    result = restore(kube, target, seconds=-1)
    assert result.restored == [] and "llm-1" in result.held
    assert "service llm does not list it yet" in result.held["llm-1"]


def test_restore_skips_a_member_that_was_never_eligible_nor_measured() -> None:
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=2, size=1))
    kube.add_pod(single())
    kube.add_pod(
        member_pod(
            "llm-1-b", deployment=MD, ordinal=1, uid="uid-b", ip="198.18.1.30", eligible=False
        )
    )
    req = RetirementRequest(
        namespace=NS,
        deployment=MD,
        role="server",
        ordinal=1,
        intent=IntentKind.SURPLUS_SHED,
        members=["llm-1-b"],
    )
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    kube.calls.clear()
    result = restore(kube, admission.target)
    assert result == RestoreResult()
    assert eligible(kube, "llm-1-b") is None and writes(kube) == []


def test_restore_reads_again_after_a_concurrent_label_change() -> None:
    racing = ConcurrentWriter()
    _, target = disqualified(kube=racing)
    racing.times = 1
    beats: list[Any] = []
    result = restore(racing, target, heartbeats=beats)
    assert result.restored == ["llm-1"] and result.held == {}
    assert beats[0].verdict is Verdict.UNKNOWN
    assert "the label changed while restoring" in beats[0].reason
    assert eligible(racing, "llm-1") == "true"


def test_restore_fails_a_member_replaced_while_restoring() -> None:
    racing = ConcurrentWriter(replace_uid="uid-new")
    _, target = disqualified(kube=racing)
    racing.times = 1
    result = restore(racing, target)
    assert result.failed == {"llm-1": "replaced while restoring"}
    assert eligible(racing, "llm-1") is None  # the replacement is not labelled


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("read_pod", Unavailable("read Pod", status=503)),
        ("patch_pod", Forbidden("patch Pod", status=403)),
    ],
    ids=["read-unavailable", "patch-forbidden"],
)
def test_restore_raises_a_kubernetes_error_as_its_application_error(
    method: str, error: KubeError
) -> None:
    kube, target = disqualified()
    kube.fail(method, error)
    with pytest.raises(ApplicationError) as info:
        restore(kube, target)
    assert info.value.type == type(error).__name__
    assert info.value.non_retryable is not error.retryable
    assert eligible(kube, "llm-1") is None
    assert "delete_pod" not in writes(kube)


# ---------------------------------------------------------------- restore: a group


@pytest.fixture
def engines(
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Callable[[Callable[[httpx.Request], httpx.Response]], list[httpx.Request]]]:
    """Answer the identity probes through an ``httpx.MockTransport`` (``identity_probe``
    opens its own client: no seam, so the class is replaced for the test)."""
    real = http_client

    def install(handler: Callable[[httpx.Request], httpx.Response]) -> list[httpx.Request]:
        log: list[httpx.Request] = []

        def logged(request: httpx.Request) -> httpx.Response:
            log.append(request)
            return handler(request)

        monkeypatch.setattr(
            "activities.probes.http_client",
            lambda **kw: real(**{**kw, "transport": httpx.MockTransport(logged)}),
        )
        return log

    yield install


def vllm_echo(request: httpx.Request) -> httpx.Response:
    rid = json.loads(request.content)["request_id"]
    assert request.headers["X-Request-Id"] == rid
    return httpx.Response(200, json={"id": "cmpl-" + rid, "choices": [{"text": "pong"}]})


def test_restore_labels_a_group_member_only_after_its_identity_probe(engines: Any) -> None:
    log = engines(vllm_echo)
    kube, target = disqualified(group_member(0), group_member(1), size=2)
    result = restore(kube, target)
    assert sorted(result.restored) == ["llm-1-0", "llm-1-1"]
    assert eligible(kube, "llm-1-0") == "true" and eligible(kube, "llm-1-1") == "true"
    assert sorted(str(r.url) for r in log) == [
        "http://198.18.1.20:8000/v1/completions",
        "http://198.18.1.21:8000/v1/completions",
    ]
    for r in log:
        assert json.loads(r.content)["request_id"].startswith("gpustack-qualify-")


@pytest.mark.parametrize(
    ("answer", "held"),
    [
        (
            lambda r: httpx.Response(200, json={"id": "cmpl-someone-else"}),
            "identity probe echo mismatch",
        ),
        (lambda r: httpx.Response(503, text="busy"), "identity probe failed: HTTPStatusError"),
        (lambda r: httpx.Response(200, text="<html>"), "identity probe failed: JSONDecodeError"),
    ],
    ids=["mismatch", "503", "not-json"],
)
def test_restore_holds_a_group_member_whose_probe_does_not_echo(
    engines: Any, answer: Callable[[httpx.Request], httpx.Response], held: str
) -> None:
    engines(answer)
    kube, target = disqualified(group_member(0), group_member(1), size=2)
    result = restore(kube, target, seconds=0.05)
    assert result.held == {"llm-1-0": held, "llm-1-1": held}
    assert result.restored == []
    assert eligible(kube, "llm-1-0") is None and eligible(kube, "llm-1-1") is None


def test_restore_holds_a_group_whose_engine_version_cannot_be_probed(engines: Any) -> None:
    log = engines(vllm_echo)
    kube, target = disqualified(group_member(0), group_member(1), size=2, version="0.1.0")
    result = restore(kube, target, seconds=0.05)
    assert result.held == {
        "llm-1-0": "identity probe unsupported for vLLM 0.1.0",
        "llm-1-1": "identity probe unsupported for vLLM 0.1.0",
    }
    assert log == [] and writes(kube) == []


# ---------------------------------------------------------------- restore: read back


def test_restore_is_not_complete_until_the_services_list_the_member_again() -> None:
    kube, target = disqualified()
    kube.add_service("llm", selector={LABEL_ELIGIBLE: "true", "app.kubernetes.io/instance": MD})
    kube.set_endpoints("llm", [])  # the endpoints controller has not caught up yet
    result = restore(kube, target, seconds=0.05)
    assert eligible(kube, "llm-1") == "true"
    assert "llm-1" not in result.restored
    assert "llm-1" in result.held


def test_a_held_member_is_restored_as_soon_as_it_is_ready() -> None:
    """The restore is level-based: seen from outside, the label comes back while it runs."""
    kube, target = disqualified()
    restate(kube, single(eligible=False, ready=None))
    done: list[RestoreResult] = []
    thread = threading.Thread(
        target=lambda: done.append(restore(kube, target, seconds=5)), daemon=True
    )
    thread.start()
    restate(kube, single(eligible=False, ready="True"))
    assert (
        eventually(lambda: eligible(kube, "llm-1"), what="label restored", timeout=5, interval=0.01)
        == "true"
    )
    thread.join(5)
    assert done == [RestoreResult(restored=["llm-1"])]


def test_restore_probes_a_surplus_member_of_a_group_even_when_it_is_the_only_target(
    engines: Any,
) -> None:
    """A surplus shed of one duplicate leader of a two-member group binds one member, yet
    that member belongs to a group: the label goes back only after the identity probe (the
    watcher never labels it either).  Counted by the target's member count alone, it read
    as a single-member replica and was labelled with no probe at all."""
    log = engines(vllm_echo)
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=2, size=2, version="0.1.0"))
    kube.add_pod(group_member(0))
    kube.add_pod(group_member(1))
    kube.add_pod(
        member_pod("llm-1-0b", deployment=MD, ordinal=1, member=0, uid="uid-1-0b", ip="198.18.1.40")
    )
    req = RetirementRequest(
        namespace=NS,
        deployment=MD,
        role="server",
        ordinal=1,
        intent=IntentKind.SURPLUS_SHED,
        members=["llm-1-0b"],
    )
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    assert [m.pod for m in admission.target.members] == ["llm-1-0b"]
    assert disqualify(kube, admission.target).verdict is Verdict.VERIFIED
    kube.calls.clear()
    result = restore(kube, admission.target, seconds=0.05)
    assert result.held == {"llm-1-0b": "identity probe unsupported for vLLM 0.1.0"}
    assert result.restored == []
    assert eligible(kube, "llm-1-0b") is None and writes(kube) == [] and log == []


def test_a_lone_follower_of_a_departed_role_goes_back_only_after_the_identity_probe(
    engines: Any,
) -> None:
    """A departed role's last Pod is a follower (member index 1) of what was a group: its
    replica reads as one member of shape Single, but it belongs to a group (the
    member-index label, ``retirement.eligibility.in_group``), so the label goes back only
    after the identity probe; on an engine version the probe does not know, never."""
    log = engines(vllm_echo)
    kube = FakeKube()
    kube.add_deployment(model_deployment(MD, namespace=NS, replicas=1, size=1, version="0.1.0"))
    kube.add_pod(member_pod("llm-0", deployment=MD, ordinal=0, uid="u-0", ip="198.18.1.5"))
    kube.add_pod(member_pod("old-0-1", deployment=MD, role="old", ordinal=0, member=1, uid="u-old"))
    req = RetirementRequest(
        namespace=NS, deployment=MD, role="old", ordinal=0, intent=IntentKind.DEPARTED_ROLE
    )
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    assert admission.target.shape == "Single" and len(admission.target.members) == 1
    assert disqualify(kube, admission.target).verdict is Verdict.VERIFIED
    kube.calls.clear()
    result = restore(kube, admission.target, seconds=0.05)
    assert result.held == {"old-0-1": "identity probe unsupported for vLLM 0.1.0"}
    assert eligible(kube, "old-0-1") is None and writes(kube) == [] and log == []
