"""The Kubernetes layer (``kube/``) offline: errors classified once, the UID- and
value-bound label patch, the typed views, Events, and that the fake used by the offline
tests of the activities and the watcher answers like the API server."""

from __future__ import annotations

import hashlib
import json
import socket
from datetime import UTC, datetime
from typing import Any

import pytest
import urllib3.exceptions
from kubernetes import client
from kubernetes.client.rest import ApiException

from activities.errors import application_error, application_errors
from activities.labels import disqualify
from activities.restore import restore_once
from kube.client import Kube
from kube.deployment import MalformedDeployment, parse_deployment
from kube.errors import (
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    Unavailable,
    classify,
    translated,
)
from kube.events import post_event
from kube.members import (
    Deletion,
    LabelChange,
    MemberGone,
    delete_member,
    eligibility_patch,
    json_pointer_escape,
    label_path,
    read_member,
    set_eligibility,
)
from kube.objects import ObjectRef, Pod, pod_ready
from retirement.models import IntentKind, MemberTarget, RestoreResult, Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict
from tests.helpers import model_deployment
from tests.helpers.fake_kube import FakeKube, apply_json_patch, matches, member_pod

NS = "default"

# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (400, Invalid, False),
        (401, Forbidden, False),
        (403, Forbidden, False),
        (404, NotFound, False),
        (405, Invalid, False),
        (408, Unavailable, True),
        (409, Conflict, False),
        (410, Expired, True),
        (422, Invalid, False),
        (429, Unavailable, True),
        (500, Unavailable, True),
        (503, Unavailable, True),
        (0, Unavailable, True),
    ],
)
def test_api_errors_are_classified_by_status(
    status: int, kind: type[KubeError], retryable: bool
) -> None:
    e = classify(ApiException(status=status, reason="Why"), what="read Pod default/a")
    assert type(e) is kind
    assert e.retryable is retryable
    assert e.status == status
    assert str(e).startswith("read Pod default/a: ")


@pytest.mark.parametrize(
    "error",
    [
        urllib3.exceptions.MaxRetryError(None, "/api", "refused"),  # type: ignore[arg-type]
        urllib3.exceptions.ReadTimeoutError(None, "/api", "read timed out"),  # type: ignore[arg-type]
        urllib3.exceptions.ProtocolError("connection reset"),
        ConnectionRefusedError(111, "refused"),
        TimeoutError("timed out"),
    ],
)
def test_transport_errors_are_unavailable(error: Exception) -> None:
    e = classify(error, what="list Pods")
    assert isinstance(e, Unavailable)
    assert e.retryable and e.status == 0
    assert type(error).__name__ in str(e)


def test_the_status_message_of_the_body_is_kept() -> None:
    ex = ApiException(status=422, reason="Unprocessable Entity")
    ex.body = '{"kind":"Status","message":"the server rejected our request: testing value failed"}'
    e = classify(ex, what="patch Pod default/a")
    assert isinstance(e, Invalid)
    assert e.detail.endswith("testing value failed")
    assert str(e) == (
        "patch Pod default/a: HTTP 422 Unprocessable Entity: the server "
        "rejected our request: testing value failed"
    )


def test_translated_reraises_classified_with_the_cause() -> None:
    original = ApiException(status=404, reason="Not Found")
    with pytest.raises(NotFound) as info, translated("read Pod default/a"):
        raise original
    assert info.value.__cause__ is original
    with pytest.raises(ValueError), translated("x"):  # not an API error: untouched
        raise ValueError("bug")


@pytest.mark.parametrize(
    ("error", "type_name", "non_retryable"),
    [
        (NotFound("x", status=404), "NotFound", True),
        (Conflict("x", status=409), "Conflict", True),
        (Invalid("x", status=422), "Invalid", True),
        (Forbidden("x", status=403), "Forbidden", True),
        (Unavailable("x", status=503), "Unavailable", False),
    ],
)
def test_activities_raise_the_type_names_the_retry_policies_use(
    error: KubeError, type_name: str, non_retryable: bool
) -> None:
    app = application_error(error)
    assert app.type == type_name
    assert app.non_retryable is non_retryable
    with pytest.raises(type(app)) as info, application_errors():
        raise error
    assert info.value.type == type_name and info.value.__cause__ is error


# ---------------------------------------------------------------- the real accessor


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _kube(timeout_s: float = 2.0) -> Kube:
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{_closed_port()}"
    cfg.proxy = None
    cfg.retries = False
    return Kube(api=client.ApiClient(cfg), timeout_s=timeout_s)


def test_the_real_accessor_classifies_a_refused_connection() -> None:
    with pytest.raises(Unavailable) as info:
        _kube().read_pod(namespace=NS, name="a")
    assert "read Pod default/a" in str(info.value)


def test_every_call_of_the_real_accessor_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    kube = _kube(timeout_s=3.5)
    seen: list[Any] = []

    class Raw:
        """An unread response, as a generated method returns with ``_preload_content=False``."""

        def __init__(self, body: Any) -> None:
            self.data = json.dumps(body).encode()

        def release_conn(self) -> None:
            return

    def answer(result: Any) -> Any:
        def call(*_args: Any, **kwargs: Any) -> Any:
            seen.append(kwargs.get("_request_timeout"))
            return Raw(result) if kwargs.get("_preload_content") is False else result

        return call

    pod = {"metadata": {"name": "a", "namespace": NS, "uid": "u"}}
    listing = {"items": [pod]}
    monkeypatch.setattr(kube.core, "read_namespaced_pod", answer(pod))
    monkeypatch.setattr(kube.core, "list_namespaced_pod", answer(listing))
    monkeypatch.setattr(kube.core, "patch_namespaced_pod", answer(pod))
    monkeypatch.setattr(kube.core, "delete_namespaced_pod", answer(None))
    monkeypatch.setattr(kube.custom, "get_namespaced_custom_object", answer({"metadata": {}}))
    monkeypatch.setattr(kube.custom, "list_cluster_custom_object", answer({"items": []}))
    kube.read_pod(namespace=NS, name="a")
    kube.list_pods(namespace=NS, selector="x=y")
    kube.patch_pod(namespace=NS, name="a", ops=[])
    kube.delete_pod(namespace=NS, name="a", uid="u")
    kube.get_deployment(namespace=NS, name="md")
    kube.list_deployments()
    assert seen == [3.5] * 6
    with pytest.raises(ValueError):
        _kube(timeout_s=0)


def test_pod_view_reads_the_real_clients_bodies() -> None:
    """The view parses what the generated client serializes (camelCase JSON)."""
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(
            name="m-0",
            namespace=NS,
            uid="u-1",
            labels={LABEL_ELIGIBLE: "true"},
            annotations={"prometheus.io/port": "8000"},
            deletion_timestamp=datetime(2024, 1, 1, tzinfo=UTC),
        ),
        spec=client.V1PodSpec(
            containers=[
                client.V1Container(
                    name="main",
                    args=["--port", "8000"],
                    ports=[client.V1ContainerPort(container_port=8000, name="http")],
                )
            ]
        ),
        status=client.V1PodStatus(
            pod_ip="198.18.1.10",
            conditions=[client.V1PodCondition(type="Ready", status="False")],
            container_statuses=[
                client.V1ContainerStatus(
                    name="main",
                    container_id="containerd://abc",
                    restart_count=2,
                    ready=False,
                    image="i",
                    image_id="i",
                )
            ],
        ),
    )
    view = Pod.from_raw(client.ApiClient().sanitize_for_serialization(pod))
    assert (view.name, view.namespace, view.uid, view.pod_ip) == ("m-0", NS, "u-1", "198.18.1.10")
    assert view.terminating
    assert view.labels == {LABEL_ELIGIBLE: "true"}
    assert view.annotations == {"prometheus.io/port": "8000"}
    main = view.container("main")
    assert main is not None and main.args == ("--port", "8000")
    assert main.ports[0].container_port == 8000 and main.ports[0].name == "http"
    status = view.container_status("main")
    assert status is not None
    assert (status.container_id, status.restart_count) == ("containerd://abc", 2)
    assert pod_ready(view) == "False"
    assert view.container("sidecar") is None


# ---------------------------------------------------------------- pod_ready


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ([{"type": "Ready", "status": "True"}], "True"),
        ([{"type": "Ready", "status": "False"}], "False"),
        ([{"type": "Ready", "status": "Unknown"}], "Unknown"),
        ([{"type": "Ready"}], "Unknown"),
        ([{"type": "Ready", "status": "yes"}], "Unknown"),
        ([{"type": "PodScheduled", "status": "True"}], "Unknown"),
        (None, "Unknown"),
        ("not a list", "Unknown"),
    ],
)
def test_pod_ready(conditions: Any, expected: str) -> None:
    raw: dict[str, Any] = {"metadata": {"name": "a"}, "status": {}}
    if conditions is not None:
        raw["status"]["conditions"] = conditions
    assert pod_ready(Pod.from_raw(raw)) == expected


# ---------------------------------------------------------------- label patches


@pytest.mark.parametrize(
    ("key", "escaped"),
    [
        (
            "modeldeployment.gpustack.ai/endpoint-eligible",
            "modeldeployment.gpustack.ai~1endpoint-eligible",
        ),
        ("a~b", "a~0b"),
        ("a/b~c", "a~1b~0c"),
        ("a~1b", "a~01b"),  # '~' first: a literal "~1" must not become "/"
        ("plain", "plain"),
    ],
)
def test_json_pointer_escaping(key: str, escaped: str) -> None:
    assert json_pointer_escape(key) == escaped
    assert label_path(key) == f"/metadata/labels/{escaped}"
    # and it round-trips through the API server's (the fake's) decoding
    doc = apply_json_patch(
        {"metadata": {"labels": {}}}, [{"op": "add", "path": label_path(key), "value": "v"}]
    )
    assert doc["metadata"]["labels"] == {key: "v"}


def test_the_removal_patch_tests_the_uid_and_the_value_first() -> None:
    path = "/metadata/labels/modeldeployment.gpustack.ai~1endpoint-eligible"
    assert eligibility_patch(uid="u-1", current="true", eligible=False) == [
        {"op": "test", "path": "/metadata/uid", "value": "u-1"},
        {"op": "test", "path": path, "value": "true"},
        {"op": "remove", "path": path},
    ]


def test_the_restore_patch_tests_that_the_label_is_absent() -> None:
    path = "/metadata/labels/modeldeployment.gpustack.ai~1endpoint-eligible"
    assert eligibility_patch(uid="u-1", current=None, eligible=True) == [
        {"op": "test", "path": "/metadata/uid", "value": "u-1"},
        {"op": "test", "path": path, "value": None},
        {"op": "add", "path": path, "value": "true"},
    ]


def test_a_removal_bound_to_a_resource_version_tests_it_too() -> None:
    ops = eligibility_patch(uid="u-1", current="true", eligible=False, resource_version="42")
    assert ops[2] == {"op": "test", "path": "/metadata/resourceVersion", "value": "42"}
    assert ops[-1]["op"] == "remove"


def test_a_removal_that_lands_after_the_label_was_put_back_changes_nothing() -> None:
    """Read (label on), then someone takes the label off and puts it back (a restore after
    an abort) before the removal lands: the label reads as it was, but the Pod was
    written since; the removal bound to the version it read is refused (CHANGED) and the
    label stays.  Without the version the late removal would have taken it off."""
    fake = _fake_with_member()
    read = fake.read_pod(namespace=NS, name="md-server-0")
    for eligible, current in ((False, "true"), (True, None)):  # off, then back on
        assert (
            set_eligibility(
                fake,
                namespace=NS,
                name="md-server-0",
                uid="u-1",
                current=current,
                eligible=eligible,
            )
            is LabelChange.APPLIED
        )
    late = set_eligibility(
        fake,
        namespace=NS,
        name="md-server-0",
        uid="u-1",
        current=read.labels[LABEL_ELIGIBLE],
        eligible=False,
        resource_version=read.resource_version,
    )
    assert late is LabelChange.CHANGED
    assert fake.pod_labels("md-server-0")[LABEL_ELIGIBLE] == "true"
    # The same late removal without the version lands: what the version guards against.
    assert (
        set_eligibility(
            fake,
            namespace=NS,
            name="md-server-0",
            uid="u-1",
            current=read.labels[LABEL_ELIGIBLE],
            eligible=False,
        )
        is LabelChange.APPLIED
    )


def test_removing_an_absent_label_only_verifies() -> None:
    ops = eligibility_patch(uid="u-1", current=None, eligible=False)
    assert [op["op"] for op in ops] == ["test", "test"]


def _fake_with_member(*, eligible: bool = True, uid: str = "u-1") -> FakeKube:
    fake = FakeKube()
    fake.add_pod(member_pod("md-server-0", deployment="md", uid=uid, eligible=eligible))
    return fake


def test_set_eligibility_applies_on_the_admitted_uid() -> None:
    fake = _fake_with_member()
    assert (
        set_eligibility(
            fake, namespace=NS, name="md-server-0", uid="u-1", current="true", eligible=False
        )
        is LabelChange.APPLIED
    )
    assert LABEL_ELIGIBLE not in fake.pod_labels("md-server-0")
    assert (
        set_eligibility(
            fake, namespace=NS, name="md-server-0", uid="u-1", current=None, eligible=True
        )
        is LabelChange.APPLIED
    )
    assert fake.pod_labels("md-server-0")[LABEL_ELIGIBLE] == "true"


def test_set_eligibility_never_touches_a_replacement() -> None:
    fake = _fake_with_member(uid="u-2")  # same name, another UID
    assert (
        set_eligibility(
            fake, namespace=NS, name="md-server-0", uid="u-1", current="true", eligible=False
        )
        is LabelChange.REPLACED
    )
    assert fake.pod_labels("md-server-0")[LABEL_ELIGIBLE] == "true"


def test_set_eligibility_on_a_gone_pod() -> None:
    fake = FakeKube()
    assert (
        set_eligibility(
            fake, namespace=NS, name="md-server-0", uid="u-1", current=None, eligible=True
        )
        is LabelChange.GONE
    )


def test_a_concurrent_label_change_is_not_a_replacement() -> None:
    """The label was removed by someone else after it was read: the 422 of the value test
    reads as CHANGED (re-read: same UID), and nothing is written."""
    fake = _fake_with_member(eligible=False)
    assert (
        set_eligibility(
            fake, namespace=NS, name="md-server-0", uid="u-1", current="true", eligible=False
        )
        is LabelChange.CHANGED
    )
    # read absent, but someone added it meanwhile: restoring must not overwrite blindly
    fake = _fake_with_member(eligible=True)
    fake.add_pod(
        member_pod("md-server-0", deployment="md", uid="u-1", labels={LABEL_ELIGIBLE: "false"})
    )
    assert (
        set_eligibility(
            fake, namespace=NS, name="md-server-0", uid="u-1", current=None, eligible=True
        )
        is LabelChange.CHANGED
    )
    assert fake.pod_labels("md-server-0")[LABEL_ELIGIBLE] == "false"
    assert [c.method for c in fake.calls] == ["patch_pod", "read_pod"]


def test_read_member_is_bound_to_the_uid() -> None:
    fake = _fake_with_member()
    pod = read_member(fake, namespace=NS, name="md-server-0", uid="u-1")
    assert isinstance(pod, Pod) and pod.uid == "u-1"
    replaced = read_member(fake, namespace=NS, name="md-server-0", uid="u-0")
    assert replaced == MemberGone("md-server-0", "u-1")
    assert replaced.replaced and replaced.describe() == "md-server-0 was replaced (UID u-1)"
    gone = read_member(fake, namespace=NS, name="other", uid="u-1")
    assert gone == MemberGone("other") and not gone.replaced
    assert gone.describe() == "other is gone"


def test_delete_member_has_a_uid_precondition() -> None:
    fake = _fake_with_member(uid="u-2")
    assert delete_member(fake, namespace=NS, name="md-server-0", uid="u-1") is Deletion.REPLACED
    assert ("default", "md-server-0") in fake.pods  # the replacement survives
    assert delete_member(fake, namespace=NS, name="md-server-0", uid="u-2") is Deletion.DELETED
    assert delete_member(fake, namespace=NS, name="md-server-0", uid="u-2") is Deletion.GONE


def test_an_unavailable_api_server_is_not_read_as_gone() -> None:
    fake = _fake_with_member()
    fake.fail("read_pod", Unavailable("read Pod", status=503))
    with pytest.raises(Unavailable):
        read_member(fake, namespace=NS, name="md-server-0", uid="u-1")


# ---------------------------------------------------------------- the activities' label rule


def _target(*members: MemberTarget) -> Target:
    return Target(
        namespace=NS,
        deployment="md",
        role="server",
        ordinal=0,
        intent=IntentKind.COUNT_TRIM,
        engine="vLLM",
        shape="Single",
        members=list(members),
    )


def _member(uid: str = "u-1") -> MemberTarget:
    return MemberTarget(
        pod="md-server-0",
        uid=uid,
        container_id="containerd://main-1",
        ip="198.18.1.10",
        measured=True,
        eligible_at_admission=True,
    )


def test_disqualify_and_restore_through_the_layer() -> None:
    fake = _fake_with_member()
    obs = disqualify(fake, _target(_member()))
    assert obs.verdict is Verdict.VERIFIED
    assert obs.readings == {"md-server-0": "label removed"}
    assert LABEL_ELIGIBLE not in fake.pod_labels("md-server-0")
    again = disqualify(fake, _target(_member()))
    assert again.readings == {"md-server-0": "label already absent"}
    result = restore_once(fake, _target(_member()), RestoreResult())
    assert result.restored == ["md-server-0"] and not result.held and not result.failed
    assert fake.pod_labels("md-server-0")[LABEL_ELIGIBLE] == "true"


def test_disqualify_fails_on_a_replacement_and_leaves_it_alone() -> None:
    fake = _fake_with_member(uid="u-2")
    obs = disqualify(fake, _target(_member(uid="u-1")))
    assert obs.verdict is Verdict.FAILED
    assert "gone or replaced" in obs.reason
    assert fake.pod_labels("md-server-0")[LABEL_ELIGIBLE] == "true"
    assert not fake.called("patch_pod")


# ---------------------------------------------------------------- the ModelDeployment view


def _md(**spec: Any) -> dict[str, Any]:
    body = model_deployment("md", namespace=NS)
    body["metadata"].update(
        uid="md-uid", generation=3, resourceVersion="42", annotations={"a": "b"}
    )
    body["spec"].update(spec)
    return body


def test_a_good_deployment_is_read() -> None:
    body = _md(router={"kind": "sglang-gateway"})
    body["spec"]["roles"].append(
        {
            "name": "draft.v2",
            "replicas": 0,
            "size": 2,
            "extraArgs": ["--x"],
            "command": ["python3", "-m", "y"],
        }
    )
    body["status"] = {"observedGeneration": 2, "retirement": {"lastConsumedRetryToken": "tok-1"}}
    md = parse_deployment(body)
    assert (md.namespace, md.name, md.uid, md.generation) == (NS, "md", "md-uid", 3)
    assert md.observed_generation == 2 and md.resource_version == "42"
    assert md.engine.name == "vLLM" and md.engine.version == "0.29.0"
    assert md.router == "sglang-gateway"
    assert md.annotations == {"a": "b"}
    assert md.last_consumed_retry_token == "tok-1"
    assert [r.name for r in md.roles] == ["server", "draft.v2"]
    server = md.role("server")
    assert server is not None and (server.replicas, server.size, server.kind) == (2, 1, "Server")
    assert server.command is None
    draft = md.role("draft.v2")
    assert draft is not None and draft.extra_args == ("--x",)
    assert draft.command == ("python3", "-m", "y")
    assert md.role("gone") is None
    assert md.ref == ObjectRef(
        api_version="worker.gpustack.ai/v1alpha1",
        kind="ModelDeployment",
        namespace=NS,
        name="md",
        uid="md-uid",
    )


@pytest.mark.parametrize(
    ("router", "kind"),
    [
        (None, None),
        ("vllm-router", "vllm-router"),
        ("", None),
        ({"kind": "llm-d"}, "llm-d"),
        ({}, None),
        ({"kind": None}, None),
    ],
)
def test_router_in_string_or_object_form(router: Any, kind: str | None) -> None:
    body = _md()
    if router is not None:
        body["spec"]["router"] = router
    assert parse_deployment(body).router == kind


def test_role_defaults() -> None:
    body = _md(roles=[{"name": "s", "replicas": 1, "kind": None, "size": None, "extraArgs": None}])
    r = parse_deployment(body).roles[0]
    assert (r.kind, r.size, r.extra_args, r.command) == ("Server", 1, (), None)


def _with_role(**fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "server", "replicas": 1}
    entry.update(fields)
    return _md(roles=[entry])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (_with_role(replicas=None), "replicas is missing"),
        ({**_md(roles=[{"name": "server"}])}, "replicas is missing"),
        (_with_role(replicas="2"), "replicas must be an integer, not str"),
        (_with_role(replicas=True), "replicas must be an integer, not bool"),
        (_with_role(replicas=-1), "replicas must be at least 0"),
        (_with_role(replicas=1.5), "replicas must be an integer, not float"),
        (_with_role(size=0), "size must be at least 1"),
        (_with_role(size="one"), "size must be an integer"),
        (_with_role(name="Server"), "not a valid role name"),
        (_with_role(name="a_b"), "not a valid role name"),
        (_with_role(name="-a"), "not a valid role name"),
        (_with_role(name="a" * 64), "not a valid role name"),
        (_with_role(name=""), "not a valid role name"),
        (_with_role(name="rôle"), "not a valid role name"),
        (_with_role(name=None), "name must be a string, not null"),
        (_with_role(name=7), "name must be a string, not int"),
        (_with_role(kind=3), "kind must be a string"),
        (_with_role(extraArgs="--x"), "extraArgs must be a list of strings, not str"),
        (_with_role(extraArgs=["--x", 1]), "extraArgs[1] must be a string, not int"),
        (_with_role(command="python3"), "command must be a list of strings"),
        (_md(roles=[{"name": "a", "replicas": 1}, {"name": "a", "replicas": 2}]), "declared twice"),
        (_md(roles=None), "spec.roles is missing"),
        (_md(roles={"name": "a"}), "spec.roles must be a list, not dict"),
        (_md(roles=["server"]), "spec.roles[0] must be an object, not str"),
        (_md(engine="vLLM"), "spec.engine must be an object, not str"),
        (_md(engine={"name": 1}), "spec.engine.name must be a string"),
        (_md(engine={"name": "vLLM", "version": 0.5}), "spec.engine.version must be a string"),
        (_md(router=["sglang-gateway"]), "spec.router must be an object, not list"),
        (_md(router={"kind": 1}), "spec.router.kind must be a string"),
    ],
)
def test_a_malformed_deployment_is_rejected_with_a_reason(
    body: dict[str, Any], reason: str
) -> None:
    with pytest.raises(MalformedDeployment) as info:
        parse_deployment(body)
    assert reason in info.value.reason
    assert (info.value.namespace, info.value.name, info.value.uid) == (NS, "md", "md-uid")
    assert str(info.value).startswith("ModelDeployment default/md: ")


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (None, "the object must be a mapping, not null"),
        ([], "the object must be a mapping, not list"),
        ({"spec": {}}, "metadata.name is missing"),
        ({"metadata": {"name": 5}}, "metadata.name is missing"),
        ({"metadata": {"name": "md"}}, "spec must be an object, not null"),
        (
            {"metadata": {"name": "md"}, "spec": {"roles": []}, "status": "x"},
            "status must be an object",
        ),
        (
            {"metadata": {"name": "md", "annotations": {"a": 1}}, "spec": {"roles": []}},
            "metadata.annotations['a'] must be a string",
        ),
        (
            {"metadata": {"name": "md", "generation": "3"}, "spec": {"roles": []}},
            "metadata.generation must be an integer",
        ),
    ],
)
def test_malformed_objects_and_metadata(body: Any, reason: str) -> None:
    with pytest.raises(MalformedDeployment) as info:
        parse_deployment(body)
    assert reason in info.value.reason


def test_an_empty_role_list_is_a_valid_deployment() -> None:
    """Every role departed: the watcher then retires replica by replica (SPEC section 3)."""
    assert parse_deployment(_md(roles=[])).roles == ()


# ---------------------------------------------------------------- Events


def test_an_event_is_posted_once_under_a_deterministic_name() -> None:
    fake = FakeKube()
    about = ObjectRef(
        api_version="worker.gpustack.ai/v1alpha1",
        kind="ModelDeployment",
        namespace=NS,
        name="md",
        uid="md-uid",
    )
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert post_event(
        fake,
        about=about,
        tag="retire",
        key="k",
        reason="RetirementDraining",
        message="m" * 5000,
        warning=True,
        now=now,
    )
    assert not post_event(fake, about=about, tag="retire", key="k", reason="x", message="y")
    [(key, event)] = fake.events.items()
    assert key == (NS, f"md.retire-{hashlib.sha256(b'k').hexdigest()[:16]}")
    assert event["type"] == "Warning" and event["reason"] == "RetirementDraining"
    assert len(event["message"]) == 1000
    assert event["involvedObject"] == {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "ModelDeployment",
        "name": "md",
        "namespace": NS,
        "uid": "md-uid",
    }
    assert event["firstTimestamp"] == event["lastTimestamp"] == "2024-05-06T07:08:09Z"
    assert event["source"] == {"component": "llm-retire"}
    # the body is one the generated client accepts (what the real accessor sends)
    assert client.CoreV1Event.from_dict(event).involved_object.uid == "md-uid"


def test_a_failed_event_post_is_not_swallowed() -> None:
    fake = FakeKube()
    fake.fail("create_event", Forbidden("create Event", status=403))
    about = ObjectRef(api_version="v1", kind="Pod", namespace=NS, name="p")
    with pytest.raises(Forbidden):
        post_event(fake, about=about, tag="watch", key="k", reason="r", message="m")


# ---------------------------------------------------------------- the fake is an API server


def test_json_patch_test_semantics_match_the_api_server() -> None:
    doc = {"metadata": {"uid": "u", "labels": {"a": "1"}}}
    # testing a missing key with null passes; testing a present one with null fails
    apply_json_patch(doc, [{"op": "test", "path": "/metadata/labels/b", "value": None}])
    with pytest.raises(Exception, match="testing value"):
        apply_json_patch(doc, [{"op": "test", "path": "/metadata/labels/a", "value": None}])
    with pytest.raises(Exception, match="testing value"):
        apply_json_patch(doc, [{"op": "test", "path": "/metadata/labels/b", "value": "1"}])
    # a missing parent fails, whatever the value
    with pytest.raises(Exception, match="missing path"):
        apply_json_patch(doc, [{"op": "test", "path": "/metadata/annotations/a", "value": None}])
    with pytest.raises(Exception, match="nonexistent key"):
        apply_json_patch(doc, [{"op": "remove", "path": "/metadata/labels/b"}])


def test_a_failed_patch_changes_nothing() -> None:
    fake = _fake_with_member()
    before = fake.pods[(NS, "md-server-0")]
    with pytest.raises(Invalid) as info:
        fake.patch_pod(
            namespace=NS,
            name="md-server-0",
            ops=[
                {"op": "add", "path": "/metadata/labels/x", "value": "y"},
                {"op": "test", "path": "/metadata/uid", "value": "other"},
            ],
        )
    assert info.value.status == 422
    assert fake.pods[(NS, "md-server-0")] == before
    with pytest.raises(NotFound):
        fake.patch_pod(namespace=NS, name="nope", ops=[])


def test_merge_patches_are_optimistic_on_the_resource_version() -> None:
    fake = FakeKube()
    stored = fake.add_deployment(_md())
    rv = stored["metadata"]["resourceVersion"]
    with pytest.raises(Conflict):
        fake.patch_deployment(
            namespace=NS,
            name="md",
            patch={"metadata": {"annotations": {"a": None}, "resourceVersion": "stale"}},
        )
    out = fake.patch_deployment(
        namespace=NS,
        name="md",
        patch={"metadata": {"annotations": {"a": None}, "resourceVersion": rv}},
    )
    assert "a" not in (out["metadata"].get("annotations") or {})
    assert out["metadata"]["resourceVersion"] != rv
    status = fake.patch_deployment_status(
        namespace=NS,
        name="md",
        patch={"status": {"retirement": {"state": "Draining"}}, "spec": {"roles": []}},
    )
    assert status["status"]["retirement"] == {"state": "Draining"}
    assert status["spec"]["roles"]  # the status subresource ignores the spec
    cleared = fake.patch_deployment_status(
        namespace=NS, name="md", patch={"status": {"retirement": None}}
    )
    assert "retirement" not in cleared["status"]
    with pytest.raises(NotFound):
        fake.patch_deployment_status(namespace=NS, name="gone", patch={"status": {}})


def test_lists_filter_by_namespace_and_selector() -> None:
    fake = FakeKube()
    fake.add_pod(member_pod("a-0", deployment="a"))
    fake.add_pod(member_pod("b-0", deployment="b"))
    fake.add_pod(member_pod("a-x", deployment="a", namespace="other"))
    names = [p.name for p in fake.list_pods(namespace=NS, selector="app.kubernetes.io/instance=a")]
    assert names == ["a-0"]
    assert matches({"a": "1", "b": "2"}, "a=1,b")
    assert matches({"a": "1"}, "a==1,!b,c!=3")
    assert not matches({"a": "1"}, "a!=1")
    assert not matches({"a": "1"}, "b")
    assert not matches({"a": "1", "b": ""}, "!b")


def test_workloads_and_endpoint_slices() -> None:
    fake = FakeKube()
    fake.add_workload("w", owners=[("Pod", "u-1")], uid="w-uid")
    assert [o.uid for o in fake.list_workloads(namespace=NS)[0].owners] == ["u-1"]
    with pytest.raises(Conflict):
        fake.delete_workload(namespace=NS, name="w", uid="other")
    fake.delete_workload(namespace=NS, name="w", uid="w-uid")
    with pytest.raises(NotFound):
        fake.get_workload(namespace=NS, name="w")
    with pytest.raises(NotFound):
        FakeKube(kueue_installed=False).list_workloads(namespace=NS)
    fake.add_service("svc", selector={"a": "b"})
    fake.add_service("headless", selector={"a": "b"}, headless=True)
    fake.set_endpoints("svc", ["198.18.1.10", "198.18.1.11"])
    assert [(s.name, s.headless) for s in fake.list_services(namespace=NS)] == [
        ("headless", True),
        ("svc", False),
    ]
    [slice_] = fake.list_endpoint_slices(namespace=NS, service="svc")
    assert slice_.addresses == ("198.18.1.10", "198.18.1.11")
    assert fake.list_endpoint_slices(namespace=NS, service="headless") == []


def test_exec_results_are_scripted_per_pod() -> None:
    from kube.api import ExecResult

    fake = _fake_with_member()
    fake.script_exec(
        "md-server-0",
        ExecResult(stdout="one\n", exit_code=0),
        lambda argv: ExecResult(stdout=" ".join(argv), exit_code=0),
    )

    def run(name: str = "md-server-0", cap: int = 100) -> ExecResult:
        return fake.exec_pod(
            namespace=NS, name=name, container="main", argv=["x", "y"], timeout_s=5, output_cap=cap
        )

    assert run().stdout == "one\n"
    assert run().stdout == "x y"
    assert run().stdout == "x y"  # the last script repeats
    assert run(cap=1).error == "exec output over its cap"
    assert run(name="nope").error.startswith("exec failed")
