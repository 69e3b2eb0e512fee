"""The real ``Kube`` shares its namespace-wide lists between concurrent callers
(``kube.sharing``), against a loopback server: callers that arrive while a list request is
in flight get the next request's answer (sent after they asked), not the one in flight;
one request serves them all; each caller gets a list of its own."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kube.client import Kube
from tests.helpers.loopback_apiserver import Answer, loopback_kube

NS = "ns"
SERVICES = f"/api/v1/namespaces/{NS}/services"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def service(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"svc-{i}", "namespace": NS}, "spec": {"clusterIP": "None"}}


def endpoint_slice(i: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"es-{i}", "namespace": NS, "labels": {}},
        "endpoints": [{"addresses": [f"198.18.0.{i}"]}],
    }


def listing(items: list[dict[str, Any]], hold: threading.Event | None = None) -> Answer:
    return Answer(body=json.dumps({"items": items}).encode(), hold=hold)


LISTS: dict[str, tuple[str, Callable[[int], dict[str, Any]], Callable[[Kube], list[Any]]]] = {
    "services": (SERVICES, service, lambda k: k.list_services(namespace=NS)),
    "endpointslices": (
        SLICES,
        endpoint_slice,
        lambda k: k.list_namespace_endpoint_slices(namespace=NS),
    ),
}


def wait_for(cond: Callable[[], bool]) -> None:
    end = time.monotonic() + 5
    while not cond():
        assert time.monotonic() < end
        time.sleep(0.005)


@pytest.mark.parametrize("kind", sorted(LISTS))
def test_callers_during_a_request_share_the_next_one_not_the_one_in_flight(kind: str) -> None:
    path, item, list_ = LISTS[kind]
    gate = threading.Event()
    with loopback_kube(connections=8) as (server, kube):
        # the first request lists one object and is held; the next lists two
        server.answers[path] = [listing([item(1)], hold=gate), listing([item(1), item(2)])]
        answers: dict[str, list[Any]] = {}

        def run(name: str) -> None:
            answers[name] = list_(kube)

        first = threading.Thread(target=run, args=("first",))
        first.start()
        wait_for(lambda: len(server.requests) == 1)
        later = [threading.Thread(target=run, args=(f"later-{i}",)) for i in range(8)]
        for t in later:
            t.start()
        wait_for(lambda: kube.shared.asked == 9)
        time.sleep(0.1)
        assert len(server.requests) == 1  # nobody took the request already in flight
        gate.set()
        for t in [first, *later]:
            t.join(5)
        assert len(answers["first"]) == 1
        assert {len(v) for k, v in answers.items() if k != "first"} == {2}
        assert len(server.requests) == 2  # one request for the eight
        assert len({id(v) for v in answers.values()}) == 9  # a list of its own each


def test_services_and_endpointslices_and_namespaces_are_separate_reads() -> None:
    gate = threading.Event()
    with loopback_kube(connections=8) as (server, kube):
        server.answers[SERVICES] = listing([service(1)], hold=gate)
        server.answers[SLICES] = listing([endpoint_slice(1)])
        held = threading.Thread(target=lambda: kube.list_services(namespace=NS))
        held.start()
        wait_for(lambda: len(server.requests) == 1)
        # a Services list in flight does not hold back an EndpointSlice list
        assert len(kube.list_namespace_endpoint_slices(namespace=NS)) == 1
        gate.set()
        held.join(5)
        assert len(server.requests) == 2
