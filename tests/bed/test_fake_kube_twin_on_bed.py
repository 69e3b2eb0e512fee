"""``FakeKube`` and the real API server, side by side (issue 21: every strictness of a
fake has its twin).  The same calls of the product's Kubernetes layer (``kube.api.KubeApi``)
go to a ``FakeKube`` holding the same objects and to ``kube.client.Kube`` on the bed; each
case asserts that both answer alike (the same error class of ``kube.errors``, or the same
result) and that a refused call changed nothing on either."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from kube.api import KubeApi
from kube.client import Kube
from kube.errors import Conflict, Expired, Invalid, KubeError, NotFound, Unavailable
from kube.members import eligibility_patch
from kube.watching import WatchEvent
from retirement.names import GROUP, LABEL_ELIGIBLE, PLURAL, VERSION
from testbed.bed import Bed
from testbed.controlplane import NODE_NAME
from tests.helpers import eventually
from tests.helpers.fake_kube import FakeKube
from tests.helpers.fake_source import FakeSource
from tests.helpers.manifests import model_deployment
from watcher.informer import KubeSource

pytestmark = pytest.mark.bed

POD = "twin-0"
MD = "twin"
ELIGIBLE_PATH = "/metadata/labels/" + LABEL_ELIGIBLE.replace("/", "~1")


def pod_body(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": POD, "namespace": namespace, "labels": {LABEL_ELIGIBLE: "true"}},
        "spec": {"containers": [{"name": "main", "image": "engine"}]},
    }


class Twins:
    """The same objects on the bed and in a FakeKube; ``both`` runs a call on each."""

    def __init__(self, bed: Bed, namespace: str) -> None:
        self.ns = namespace
        self.real = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
        self.fake = FakeKube()
        api = bed.api_client()
        real_pod = client.CoreV1Api(api).create_namespaced_pod(namespace, pod_body(namespace))
        self.fake.add_pod({**pod_body(namespace), "metadata": {**pod_body(namespace)["metadata"]}})
        md = model_deployment(MD)
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, md
        )
        self.fake.add_deployment({**md, "metadata": {**md["metadata"], "namespace": namespace}})
        self.uids = {
            "real": real_pod.metadata.uid,
            "fake": self.fake.read_pod(namespace=namespace, name=POD).uid,
        }

    def both(self, call: Callable[[KubeApi, str], Any]) -> dict[str, Any]:
        """``call(api, uid)`` on each side: its result, or the ``kube.errors`` class it raised."""
        out: dict[str, Any] = {}
        for side, api in (("real", self.real), ("fake", self.fake)):
            try:
                out[side] = call(api, self.uids[side])
            except KubeError as e:
                out[side] = type(e)
        return out

    def labels(self) -> dict[str, dict[str, str]]:
        return {
            side: dict(api.read_pod(namespace=self.ns, name=POD).labels)
            for side, api in (("real", self.real), ("fake", self.fake))
        }


@pytest.fixture
def twins(bed: Bed, namespace: str) -> Iterator[Twins]:
    yield Twins(bed, namespace)


def test_a_failed_json_patch_test_is_invalid_on_both_and_changes_nothing(twins: Twins) -> None:
    before = twins.labels()
    ops = [
        {"op": "test", "path": ELIGIBLE_PATH, "value": "false"},
        {"op": "remove", "path": ELIGIBLE_PATH},
    ]
    got = twins.both(lambda api, _uid: api.patch_pod(namespace=twins.ns, name=POD, ops=ops))
    assert got == {"real": Invalid, "fake": Invalid}
    assert twins.labels() == before


def test_a_removal_bound_to_a_resource_version_written_since_is_invalid_on_both(
    twins: Twins,
) -> None:
    """The label is read, then taken off and put back (the Pod written since, the label as
    read): a removal testing the version it read is refused on both and changes nothing;
    one testing the version now is applied on both (``activities.labels``' fence)."""
    other = [{"op": "add", "path": "/metadata/labels/other", "value": "kept"}]
    twins.both(lambda api, _uid: api.patch_pod(namespace=twins.ns, name=POD, ops=other))
    read = {
        side: api.read_pod(namespace=twins.ns, name=POD).resource_version
        for side, api in (("real", twins.real), ("fake", twins.fake))
    }
    assert all(read.values())
    for eligible, current in ((False, "true"), (True, None)):
        got = twins.both(
            lambda api, uid, e=eligible, c=current: api.patch_pod(
                namespace=twins.ns,
                name=POD,
                ops=eligibility_patch(uid=uid, current=c, eligible=e),
            ).labels.get(LABEL_ELIGIBLE)
        )
        assert got == {"real": "true" if eligible else None, "fake": "true" if eligible else None}
    before = twins.labels()
    stale = {"real": Invalid, "fake": Invalid}
    got = {}
    for side, api in (("real", twins.real), ("fake", twins.fake)):
        try:
            api.patch_pod(
                namespace=twins.ns,
                name=POD,
                ops=eligibility_patch(
                    uid=twins.uids[side],
                    current="true",
                    eligible=False,
                    resource_version=read[side],
                ),
            )
            got[side] = "applied"
        except KubeError as e:
            got[side] = type(e)
    assert got == stale
    assert twins.labels() == before
    now = twins.both(
        lambda api, uid: api.patch_pod(
            namespace=twins.ns,
            name=POD,
            ops=eligibility_patch(
                uid=uid,
                current="true",
                eligible=False,
                resource_version=api.read_pod(namespace=twins.ns, name=POD).resource_version,
            ),
        ).labels.get(LABEL_ELIGIBLE)
    )
    assert now == {"real": None, "fake": None}


def test_removing_the_only_label_leaves_no_map_to_add_under_on_both(twins: Twins) -> None:
    """An empty label map is stored as absent: after the Pod's only label is removed, the
    restore's patch (a test against null, then an add under ``/metadata/labels``) is
    refused on both."""
    off = twins.both(
        lambda api, uid: (
            api.patch_pod(
                namespace=twins.ns,
                name=POD,
                ops=eligibility_patch(uid=uid, current="true", eligible=False),
            ).labels
        )
    )
    assert off == {"real": {}, "fake": {}}
    back = twins.both(
        lambda api, uid: api.patch_pod(
            namespace=twins.ns,
            name=POD,
            ops=eligibility_patch(uid=uid, current=None, eligible=True),
        )
    )
    assert back == {"real": Invalid, "fake": Invalid}


def test_removing_a_missing_label_is_invalid_on_both(twins: Twins) -> None:
    ops = [{"op": "remove", "path": "/metadata/labels/absent"}]
    got = twins.both(lambda api, _uid: api.patch_pod(namespace=twins.ns, name=POD, ops=ops))
    assert got == {"real": Invalid, "fake": Invalid}


def test_a_test_of_a_missing_label_against_null_passes_on_both(twins: Twins) -> None:
    ops = [
        {"op": "test", "path": "/metadata/labels/absent", "value": None},
        {"op": "add", "path": "/metadata/labels/added", "value": "yes"},
    ]
    got = twins.both(
        lambda api, _uid: api.patch_pod(namespace=twins.ns, name=POD, ops=ops).labels["added"]
    )
    assert got == {"real": "yes", "fake": "yes"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (LABEL_ELIGIBLE, "not valid!"),
        (LABEL_ELIGIBLE, "x" * 64),
        ("Bad_Prefix.example/name", "v"),
        ("a/" + "n" * 64, "v"),
        ("-starts-with-dash", "v"),
    ],
)
def test_a_label_the_server_refuses_is_invalid_on_both(twins: Twins, key: str, value: str) -> None:
    before = twins.labels()
    path = "/metadata/labels/" + key.replace("~", "~0").replace("/", "~1")
    ops = [{"op": "add", "path": path, "value": value}]
    got = twins.both(lambda api, _uid: api.patch_pod(namespace=twins.ns, name=POD, ops=ops))
    assert got == {"real": Invalid, "fake": Invalid}
    assert twins.labels() == before


def test_a_delete_under_another_uid_is_a_conflict_on_both_and_deletes_nothing(
    twins: Twins,
) -> None:
    wrong = "00000000-0000-0000-0000-000000000000"
    got = twins.both(lambda api, _uid: api.delete_pod(namespace=twins.ns, name=POD, uid=wrong))
    assert got == {"real": Conflict, "fake": Conflict}
    assert set(twins.labels()) == {"real", "fake"}  # both still there


def test_a_missing_pod_is_not_found_on_both(twins: Twins) -> None:
    got = twins.both(lambda api, _uid: api.read_pod(namespace=twins.ns, name="absent"))
    assert got == {"real": NotFound, "fake": NotFound}
    got = twins.both(lambda api, _uid: api.delete_pod(namespace=twins.ns, name="absent", uid="u"))
    assert got == {"real": NotFound, "fake": NotFound}


def test_a_merge_patch_on_a_stale_resource_version_is_a_conflict_on_both(twins: Twins) -> None:
    def stale(api: KubeApi, _uid: str) -> Any:
        md = api.get_deployment(namespace=twins.ns, name=MD)
        rv = md["metadata"]["resourceVersion"]
        api.patch_deployment(
            namespace=twins.ns, name=MD, patch={"metadata": {"labels": {"a": "1"}}}
        )
        patch = {"metadata": {"resourceVersion": rv, "annotations": {"b": "2"}}}
        return api.patch_deployment(namespace=twins.ns, name=MD, patch=patch)

    assert twins.both(stale) == {"real": Conflict, "fake": Conflict}


# ---------------------------------------------------------------- deletes that linger

HELD = "twin-held"
FINALIZER = "retire.test/hold"


def test_a_pod_with_a_finalizer_lingers_terminating_after_its_delete_on_both(
    bed: Bed, twins: Twins
) -> None:
    body = pod_body(twins.ns)
    body["metadata"] = {**body["metadata"], "name": HELD, "finalizers": [FINALIZER]}
    real = client.CoreV1Api(bed.api_client())
    real.create_namespaced_pod(twins.ns, body)
    twins.fake.add_pod(body)
    uid = {
        side: api.read_pod(namespace=twins.ns, name=HELD).uid
        for side, api in (("real", twins.real), ("fake", twins.fake))
    }

    def on_both(call: Callable[[KubeApi, str], Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for side, api in (("real", twins.real), ("fake", twins.fake)):
            try:
                out[side] = call(api, uid[side])
            except KubeError as e:
                out[side] = type(e)
        return out

    def delete(api: KubeApi, u: str) -> None:
        api.delete_pod(namespace=twins.ns, name=HELD, uid=u)

    def terminating(api: KubeApi, _u: str) -> bool:
        return api.read_pod(namespace=twins.ns, name=HELD).terminating

    assert on_both(delete) == {"real": None, "fake": None}
    assert on_both(terminating) == {"real": True, "fake": True}  # still there, marked
    assert on_both(delete) == {"real": None, "fake": None}  # again: answered, not refused
    wrong = "00000000-0000-0000-0000-000000000000"
    got = on_both(lambda api, _u: api.delete_pod(namespace=twins.ns, name=HELD, uid=wrong))
    assert got == {"real": Conflict, "fake": Conflict}
    # The finalizer taken off: the marked Pod goes.
    real.patch_namespaced_pod(HELD, twins.ns, [{"op": "remove", "path": "/metadata/finalizers"}])
    twins.fake.remove_finalizers(HELD, namespace=twins.ns)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and on_both(terminating)["real"] is True:
        time.sleep(0.1)
    assert on_both(terminating) == {"real": NotFound, "fake": NotFound}


# ---------------------------------------------------------------- watches and versions


def _events(events: Iterator[WatchEvent], until_deleted: str) -> list[tuple[str, str | None]]:
    """(type, label ``a``) of each event up to the DELETED of ``until_deleted``; bookmarks
    (the real server's, asked for) are left out."""
    out: list[tuple[str, str | None]] = []
    for e in events:
        if e.type == "BOOKMARK":
            continue
        out.append((e.type, (e.body["metadata"].get("labels") or {}).get("a")))
        if e.type == "DELETED" and e.body["metadata"]["name"] == until_deleted:
            break
    return out


def test_a_watch_delivers_every_change_after_its_version_and_none_before_on_both(
    bed: Bed, twins: Twins
) -> None:
    real_src = KubeSource(twins.real)
    fake_src = FakeSource(twins.fake, watch_s=5)
    got: dict[str, list[tuple[str, str | None]]] = {}
    for side, src, api in (("real", real_src, twins.real), ("fake", fake_src, twins.fake)):
        listed, rv = src.list("modeldeployments", twins.ns)
        assert [o["metadata"]["name"] for o in listed] == [MD]
        for value in ("1", "2"):
            api.patch_deployment(
                namespace=twins.ns, name=MD, patch={"metadata": {"labels": {"a": value}}}
            )
        if side == "real":
            client.CustomObjectsApi(bed.api_client()).delete_namespaced_custom_object(
                GROUP, VERSION, twins.ns, PLURAL, MD
            )
        else:
            twins.fake.remove_deployment(MD, namespace=twins.ns)
        got[side] = _events(src.watch("modeldeployments", twins.ns, rv), MD)
    # The creation before the listing's version is not delivered; both changes and the
    # deletion after it are, in order, each once.
    assert got["real"] == got["fake"] == [("MODIFIED", "1"), ("MODIFIED", "2"), ("DELETED", "2")]


def test_a_watch_from_a_version_the_server_no_longer_holds_is_gone_on_both(
    twins: Twins,
) -> None:
    # The real API server's watch cache starts at its own start-up, long after version 1;
    # the fake's history is compacted to stand for it.
    twins.fake.compact()
    got: dict[str, Any] = {}
    for side, src in (("real", KubeSource(twins.real)), ("fake", FakeSource(twins.fake))):
        try:
            got[side] = next(iter(src.watch("modeldeployments", twins.ns, "1")))
        except KubeError as e:
            got[side] = type(e)
    assert got == {"real": Expired, "fake": Expired}


# ---------------------------------------------------------------- EndpointSlices


def _slice_endpoints(raw_slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the product can read of a Service's slices (the UID aside: each side has its
    own): per endpoint its addresses, conditions, node and target, and the ports."""
    out = []
    for s in raw_slices:
        ports = sorted(
            (p.get("name"), p.get("port"), p.get("protocol")) for p in s.get("ports") or []
        )
        for e in s.get("endpoints") or []:
            ref = e.get("targetRef") or {}
            out.append(
                {
                    "addresses": e.get("addresses"),
                    "conditions": e.get("conditions"),
                    "nodeName": e.get("nodeName"),
                    "target": (ref.get("kind"), ref.get("name")),
                    "ports": ports,
                }
            )
    return out


def test_endpoint_slices_follow_the_pods_as_the_controller_writes_them_on_both(
    bed: Bed, twins: Twins
) -> None:
    """One pass of the fake's EndpointSlice controller writes what the real one writes for
    a ready Pod on a node; after the Pod's label comes off, both drop it: the real one
    when its controller gets to it, the fake one at its next pass (until then it lags)."""
    api = bed.api_client()
    core, discovery = client.CoreV1Api(api), client.DiscoveryV1Api(api)
    labels = {LABEL_ELIGIBLE: "true", "twin": "ep"}
    body = pod_body(twins.ns)
    body["metadata"] = {"name": "twin-ep", "namespace": twins.ns, "labels": labels}
    body["spec"] = {
        "nodeName": NODE_NAME,
        "containers": [{"name": "main", "image": "engine", "ports": [{"containerPort": 8000}]}],
    }
    core.create_namespaced_pod(twins.ns, body)

    def ready_pod() -> dict[str, Any] | None:
        raw = api.sanitize_for_serialization(core.read_namespaced_pod("twin-ep", twins.ns))
        st = raw.get("status") or {}
        ok = st.get("podIP") and any(
            c["type"] == "Ready" and c["status"] == "True" for c in st.get("conditions") or []
        )
        return raw if ok else None

    raw_pod = eventually(ready_pod, what="the Pod ready with an address", timeout=60)
    ports = [{"name": "http", "port": 80, "targetPort": 8000, "protocol": "TCP"}]
    svc = {
        "metadata": {"name": "twin-ep", "namespace": twins.ns},
        "spec": {"selector": labels, "ports": ports},
    }
    core.create_namespaced_service(twins.ns, svc)
    twins.fake.add_pod(raw_pod)
    twins.fake.add_service("twin-ep", selector=labels, namespace=twins.ns, ports=ports)

    def real() -> list[dict[str, Any]]:
        got = discovery.list_namespaced_endpoint_slice(
            twins.ns, label_selector="kubernetes.io/service-name=twin-ep"
        )
        return _slice_endpoints([api.sanitize_for_serialization(s) for s in got.items])

    def fake() -> list[dict[str, Any]]:
        with twins.fake._lock:
            raws = [
                b
                for (ns, _), b in twins.fake.endpoint_slices.items()
                if ns == twins.ns
                and (b["metadata"].get("labels") or {}).get("kubernetes.io/service-name")
                == "twin-ep"
            ]
            return _slice_endpoints(copy.deepcopy(raws))

    listed = eventually(real, what="the real controller's slice", timeout=30)
    assert fake() == []  # the fake's controller has not run: its slices lag
    twins.fake.sync_endpoint_slices(namespace=twins.ns)
    assert fake() == listed
    assert listed[0]["addresses"] == [raw_pod["status"]["podIP"]]
    assert listed[0]["conditions"] == {"ready": True, "serving": True, "terminating": False}

    off = [{"op": "remove", "path": ELIGIBLE_PATH}]
    for side_api in (twins.real, twins.fake):
        side_api.patch_pod(namespace=twins.ns, name="twin-ep", ops=off)
    assert fake() == listed  # lagging until its next pass
    twins.fake.sync_endpoint_slices(namespace=twins.ns)
    assert fake() == []
    eventually(real, accept=lambda v: v == [], what="the real slice without the Pod", timeout=30)
    core.delete_namespaced_pod("twin-ep", twins.ns, grace_period_seconds=0)


def test_a_watch_from_a_version_that_is_not_one_is_refused_alike_on_both(
    twins: Twins,
) -> None:
    got: dict[str, Any] = {}
    for side, src in (("real", KubeSource(twins.real)), ("fake", FakeSource(twins.fake))):
        try:
            got[side] = next(iter(src.watch("modeldeployments", twins.ns, "not-a-version")))
        except KubeError as e:
            got[side] = (type(e), e.status)
    # Measured: the API server cannot parse it and answers 500 (Unavailable), not 400.
    assert got["real"] == got["fake"] == (Unavailable, 500), got


# ---------------------------------------------------------------- ModelDeployment writes


def test_a_status_write_keeps_what_the_crd_knows_and_prunes_the_rest_on_both(
    twins: Twins,
) -> None:
    """What the product writes (``activities.publish``) is kept whole; a field the schema
    of ``status.retirement`` does not name is pruned; ``status`` itself preserves unknown
    fields."""
    retirement = {
        "roleName": "server",
        "replicaOrdinal": 1,
        "targetMemberUIDs": ["u-1"],
        "state": "Draining",
        "reason": "draining",
        "startedAt": "2026-12-05T04:00:00Z",
        "workflowID": "retirement/ns/twin",
        "notInTheSchema": "dropped",
    }
    patch = {"status": {"retirement": retirement, "retryTokens": {"server:1": "t"}, "other": 1}}

    def written(api: KubeApi, _uid: str) -> Any:
        return api.patch_deployment_status(namespace=twins.ns, name=MD, patch=patch)["status"]

    got = twins.both(written)
    assert got["real"] == got["fake"], got
    expected = {k: v for k, v in retirement.items() if k != "notInTheSchema"}
    assert got["real"]["retirement"] == expected
    assert got["real"]["other"] == 1 and got["real"]["retryTokens"] == {"server:1": "t"}


def test_a_merge_patch_of_a_missing_deployment_is_not_found_on_both(twins: Twins) -> None:
    patch = {"metadata": {"labels": {"a": "1"}}}
    for call in (
        lambda api, _uid: api.patch_deployment(namespace=twins.ns, name="absent", patch=patch),
        lambda api, _uid: api.patch_deployment_status(
            namespace=twins.ns, name="absent", patch={"status": {"other": 1}}
        ),
    ):
        assert twins.both(call) == {"real": NotFound, "fake": NotFound}


def test_a_status_write_naming_another_uid_is_written_on_both(twins: Twins) -> None:
    """Measured: the status subresource takes nothing but ``status`` from a patch, so a
    ``metadata.uid`` there fences nothing (``activities.publish`` checks the UID it reads
    and writes with that read's resourceVersion instead)."""
    patch = {"metadata": {"uid": "00000000-0000-0000-0000-000000000000"}, "status": {"other": 2}}
    got = twins.both(
        lambda api, _uid: api.patch_deployment_status(namespace=twins.ns, name=MD, patch=patch)[
            "status"
        ]["other"]
    )
    assert got == {"real": 2, "fake": 2}


def test_a_status_write_on_a_stale_resource_version_is_a_conflict_on_both(twins: Twins) -> None:
    def stale(api: KubeApi, _uid: str) -> Any:
        rv = api.get_deployment(namespace=twins.ns, name=MD)["metadata"]["resourceVersion"]
        api.patch_deployment(
            namespace=twins.ns, name=MD, patch={"metadata": {"labels": {"a": "1"}}}
        )
        patch = {"metadata": {"resourceVersion": rv}, "status": {"other": 3}}
        return api.patch_deployment_status(namespace=twins.ns, name=MD, patch=patch)

    assert twins.both(stale) == {"real": Conflict, "fake": Conflict}


def test_a_merge_patch_naming_another_uid_is_invalid_on_both(twins: Twins) -> None:
    patch = {"metadata": {"uid": "00000000-0000-0000-0000-000000000000", "labels": {"b": "1"}}}
    got = twins.both(
        lambda api, _uid: api.patch_deployment(namespace=twins.ns, name=MD, patch=patch)
    )
    # Measured: 422 (the UID is immutable), not a 409 precondition failure.
    assert got == {"real": Invalid, "fake": Invalid}, got
