"""Pod addresses on the bed: many Pods created at once, deleted and recreated, never share
an address, and every address lies in the bed's Pod range (which bed tests and the
benchmarks rely on: an emulator bound to a shared address answers for the wrong Pod)."""

from __future__ import annotations

import ipaddress

import pytest
from kubernetes import client

from testbed import fleet
from testbed.bed import Bed

pytestmark = pytest.mark.bed

COUNT = 300


def check(bed: Bed, ips: dict[str, str], when: str) -> None:
    assert fleet.duplicates(ips) == {}, f"{when}: Pods share an address"
    assert fleet.outside(ips, bed.net.pod_cidr) == {}, f"{when}: outside {bed.net.pod_cidr}"
    for ip in ips.values():
        assert bed.net.owns(ip) and not ipaddress.ip_address(ip).is_loopback


def test_many_pods_created_deleted_and_recreated_never_share_an_address(
    bed: Bed, api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(api)
    names = [f"p-{i}" for i in range(COUNT)]
    fleet.create_pods(core, namespace, [fleet.plain_pod(n) for n in names])
    first = fleet.wait_running(core, namespace, COUNT, timeout=120)
    check(bed, first, "created")

    # Half deleted and at once recreated under the same names, while the other half lives.
    half = names[::2]
    fleet.delete_pods(core, namespace, half)
    fleet.create_pods(core, namespace, [fleet.plain_pod(n) for n in half])
    second = fleet.wait_running(core, namespace, COUNT, timeout=120)
    check(bed, second, "half recreated")
    kept = {n: first[n] for n in names[1::2]}
    assert {n: second[n] for n in kept} == kept  # a live Pod keeps its address

    # All deleted and recreated, plus new names on top.
    fleet.delete_pods(core, namespace, names)
    more = [*names, *(f"q-{i}" for i in range(COUNT // 3))]
    fleet.create_pods(core, namespace, [fleet.plain_pod(n) for n in more])
    third = fleet.wait_running(core, namespace, len(more), timeout=120)
    check(bed, third, "all recreated")
    fleet.delete_pods(core, namespace, more)
