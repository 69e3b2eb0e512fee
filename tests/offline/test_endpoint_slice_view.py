"""The typed views defect 8 (issue 8) needs: an EndpointSlice's owning Service, its
endpoints' ``targetRef`` and its ports, a Pod's every address; and the namespace-wide
EndpointSlice list of ``KubeApi`` (the fake's, as the real client's)."""

from __future__ import annotations

from typing import Any

from kube.objects import Endpoint, EndpointPort, EndpointSlice, Pod
from tests.helpers.fake_kube import FakeKube

SLICE: dict[str, Any] = {
    "apiVersion": "discovery.k8s.io/v1",
    "kind": "EndpointSlice",
    "metadata": {
        "name": "llm-abcde",
        "namespace": "demo",
        "labels": {
            "kubernetes.io/service-name": "llm",
            "endpointslice.kubernetes.io/managed-by": "x",
        },
    },
    "addressType": "IPv4",
    "endpoints": [
        {
            "addresses": ["198.18.1.11"],
            "conditions": {"ready": True},
            "targetRef": {"kind": "Pod", "name": "llm-1", "uid": "uid-1", "namespace": "demo"},
        },
        {"addresses": ["198.18.1.12"], "conditions": {"ready": False}},
    ],
    "ports": [{"name": "http", "port": 8000, "protocol": "TCP"}],
}


def test_an_endpoint_slice_reads_its_service_endpoints_and_ports() -> None:
    view = EndpointSlice.from_raw(SLICE)
    assert view.service == "llm"
    assert view.addresses == ("198.18.1.11", "198.18.1.12")
    assert view.endpoints == (
        Endpoint(
            addresses=("198.18.1.11",),
            target_kind="Pod",
            target_name="llm-1",
            target_uid="uid-1",
            ready=True,
        ),
        Endpoint(addresses=("198.18.1.12",), ready=False),
    )
    assert view.ports == (EndpointPort(port=8000, name="http", protocol="TCP"),)


def test_a_slice_lists_a_member_by_address_or_by_target_ref() -> None:
    view = EndpointSlice.from_raw(SLICE)
    assert view.listing({"198.18.1.12"}, set()) == ["198.18.1.12"]
    assert view.listing({"10.0.0.1"}, {"uid-1"}) == ["targetRef uid-1"]
    assert view.listing({"198.18.1.11"}, {"uid-1"}) == ["198.18.1.11", "targetRef uid-1"]
    assert view.listing({"10.0.0.1"}, {"uid-2"}) == []


def test_a_malformed_slice_reads_as_empty_not_an_error() -> None:
    view = EndpointSlice.from_raw(
        {"metadata": {"name": "x"}, "endpoints": [None, {"targetRef": 3}], "ports": "p"}
    )
    assert view.service == "" and view.ports == ()
    assert view.listing({"198.18.1.11"}, {"uid-1"}) == []


def test_a_pod_reads_every_address() -> None:
    pod = Pod.from_raw(
        {
            "metadata": {"name": "p", "uid": "u"},
            "status": {
                "podIP": "198.18.1.11",
                "podIPs": [{"ip": "198.18.1.11"}, {"ip": "fd00::11"}],
            },
        }
    )
    assert pod.pod_ips == ("198.18.1.11", "fd00::11")
    assert Pod.from_raw({"metadata": {"name": "p"}}).pod_ips == ()


def test_the_fake_lists_every_slice_of_a_namespace() -> None:
    kube = FakeKube()
    kube.set_endpoints("llm", ["198.18.1.11"], target_uids=["uid-1"], namespace="demo")
    kube.add_endpoint_slice(
        "orphan", service=None, endpoints=[{"addresses": ["198.18.1.12"]}], namespace="demo"
    )
    kube.set_endpoints("other", ["198.18.1.13"], namespace="elsewhere")
    slices = kube.list_namespace_endpoint_slices(namespace="demo")
    assert [(s.name, s.service, s.addresses) for s in slices] == [
        ("llm-slice", "llm", ("198.18.1.11",)),
        ("orphan", "", ("198.18.1.12",)),
    ]
    assert slices[0].endpoints[0].target_uid == "uid-1"
    assert [c.method for c in kube.calls] == ["list_namespace_endpoint_slices"]
