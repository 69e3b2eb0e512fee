"""The fakes are as strict as the servers they stand for (their twins on
the bed: ``tests/bed/test_fake_kube_twin_on_bed.py``): a watch delivers every change after
its version and none before, in order, each with its own version; a version the server no
longer holds is 410 Gone; a Pod with finalizers lingers, marked, after its delete; the
EndpointSlices follow the Pods as the controller writes them, one pass at a time."""

from __future__ import annotations

import pytest

from kube.errors import Conflict, Expired, Unavailable
from kube.watching import WatchEvent
from retirement.names import LABEL_ELIGIBLE
from tests.helpers.fake_kube import FakeKube, member_pod
from tests.helpers.fake_source import FakeSource
from tests.helpers.manifests import model_deployment

POD = "md-server-0"


def world() -> tuple[FakeKube, FakeSource]:
    kube = FakeKube()
    kube.add_deployment(model_deployment("md"))
    kube.add_pod(member_pod(POD, deployment="md"))
    return kube, FakeSource(kube, watch_s=0.05, poll_s=0.001)


def summary(events: list[WatchEvent]) -> list[tuple[str, str, str | None]]:
    return [
        (e.type, e.body["metadata"]["name"], (e.body["metadata"].get("labels") or {}).get("a"))
        for e in events
    ]


def test_a_watch_delivers_the_changes_after_its_version_only() -> None:
    kube, src = world()
    _, rv = src.list("pods", "default")
    kube.set_label(POD, "a", "1")
    kube.set_label(POD, "a", "2")
    kube.remove_pod(POD)
    events = list(src.watch("pods", "default", rv))
    assert summary(events) == [
        ("MODIFIED", POD, "1"),
        ("MODIFIED", POD, "2"),
        ("DELETED", POD, "2"),
    ]
    versions = [int(e.resource_version) for e in events]
    assert versions == sorted(set(versions)) and versions[0] > int(rv)
    # Resuming from the last version seen delivers nothing again.
    assert list(src.watch("pods", "default", events[-1].resource_version)) == []
    # From before the listing: the creation too (the history is not compacted).
    assert summary(list(src.watch("pods", "default", "0")))[0] == ("ADDED", POD, None)


def test_a_watch_sees_only_its_resource_and_namespace() -> None:
    kube, src = world()
    _, rv = src.list("modeldeployments", "default")
    kube.set_label(POD, "a", "1")  # a Pod: not this watch's
    kube.add_pod(member_pod("x-server-0", deployment="x", namespace="other"))
    kube.patch_deployment(
        namespace="default", name="md", patch={"metadata": {"labels": {"a": "3"}}}
    )
    assert summary(list(src.watch("modeldeployments", "default", rv))) == [("MODIFIED", "md", "3")]


def test_a_version_older_than_the_compaction_is_gone() -> None:
    kube, src = world()
    _, rv = src.list("pods", "default")
    kube.set_label(POD, "a", "1")
    kube.compact()
    with pytest.raises(Expired):
        list(src.watch("pods", "default", rv))
    with pytest.raises(Unavailable):  # as the API server answers it: 500
        list(src.watch("pods", "default", "not-a-version"))
    _, fresh = src.list("pods", "default")
    kube.set_label(POD, "a", "2")
    assert summary(list(src.watch("pods", "default", fresh))) == [("MODIFIED", POD, "2")]


def test_a_recreated_pod_is_deleted_then_added() -> None:
    kube, src = world()
    _, rv = src.list("pods", "default")
    kube.add_pod(member_pod(POD, deployment="md"))  # a fresh UID under the same name
    events = list(src.watch("pods", "default", rv))
    assert [e.type for e in events] == ["DELETED", "ADDED"]
    assert events[0].body["metadata"]["uid"] != events[1].body["metadata"]["uid"]


def test_a_pod_with_a_finalizer_lingers_marked_after_its_delete() -> None:
    kube = FakeKube()
    body = member_pod(POD, deployment="md")
    body["metadata"]["finalizers"] = ["example.com/hold"]
    uid = kube.add_pod(body)["metadata"]["uid"]
    kube.delete_pod(namespace="default", name=POD, uid=uid)
    assert kube.read_pod(namespace="default", name=POD).terminating
    kube.delete_pod(namespace="default", name=POD, uid=uid)  # again: answered
    with pytest.raises(Conflict):
        kube.delete_pod(namespace="default", name=POD, uid="another")
    assert kube.pod_labels(POD).get(LABEL_ELIGIBLE) == "true"
    kube.remove_finalizers(POD)
    assert (("default", POD)) not in kube.pods


def test_endpoint_slices_lag_until_the_controller_pass() -> None:
    kube = FakeKube()
    kube.add_pod(member_pod(POD, deployment="md", ip="198.18.1.7"))
    kube.add_pod(member_pod("md-server-1", deployment="md", ip="198.18.1.8", ready="False"))
    kube.add_pod(member_pod("md-server-2", deployment="md", ip="", eligible=True))
    kube.add_service(
        "md", selector={LABEL_ELIGIBLE: "true"}, ports=[{"port": 80, "targetPort": 8000}]
    )
    assert kube.list_endpoint_slices(namespace="default", service="md") == []
    kube.sync_endpoint_slices()
    (eps,) = kube.list_endpoint_slices(namespace="default", service="md")
    assert [(e.addresses, e.target_name, e.ready) for e in eps.endpoints] == [
        (("198.18.1.7",), POD, True),
        (("198.18.1.8",), "md-server-1", False),  # listed, not ready; no address: not listed
    ]
    assert [p.port for p in eps.ports] == [8000]
    kube.set_label(POD, LABEL_ELIGIBLE, None)
    (eps,) = kube.list_endpoint_slices(namespace="default", service="md")
    assert eps.addresses == ("198.18.1.7", "198.18.1.8")  # lagging
    kube.sync_endpoint_slices()
    (eps,) = kube.list_endpoint_slices(namespace="default", service="md")
    assert eps.addresses == ("198.18.1.8",)


def test_a_deployment_write_is_pruned_to_the_crd_schema() -> None:
    kube = FakeKube()
    kube.add_deployment(model_deployment("md"))
    status = {"retirement": {"state": "Draining", "extra": 1}, "kept": {"x": 1}}
    md = kube.patch_deployment_status(namespace="default", name="md", patch={"status": status})
    assert md["status"] == {"retirement": {"state": "Draining"}, "kept": {"x": 1}}
    spec_patch = {"spec": {"roles": [{"name": "server", "replicas": 1, "anything": "kept"}]}}
    md = kube.patch_deployment(namespace="default", name="md", patch=spec_patch)
    assert md["spec"]["roles"][0]["anything"] == "kept"  # roles preserve unknown fields
