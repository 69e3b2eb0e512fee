"""The watcher's paged LIST against the real API server (the twin of
``tests/offline/test_kube_list_pages.py``): 25 Pods read 7 at a time are the same 25 Pods,
with one resourceVersion, that one unpaged LIST returns, and a watch from that version
sees the next change."""

from __future__ import annotations

import pytest
from kubernetes import client

from kube.client import Kube
from kube.watching import list_objects, watch_objects
from retirement.names import APP_NAME, LABEL_NAME
from testbed.bed import Bed

pytestmark = pytest.mark.bed


def test_the_watcher_lists_pods_a_page_at_a_time(bed: Bed, namespace: str) -> None:
    core = client.CoreV1Api(bed.api_client())
    for i in range(25):
        core.create_namespaced_pod(
            namespace,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name=f"p{i:02d}", labels={LABEL_NAME: APP_NAME}),
                spec=client.V1PodSpec(containers=[client.V1Container(name="main", image="i")]),
            ),
        )
    kube = Kube.from_config(kubeconfig=str(bed.cp.kubeconfig))
    calls: list[dict[str, object]] = []
    real = kube.core.list_namespaced_pod

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return real(*args, **kwargs)

    kube.core.list_namespaced_pod = counted  # type: ignore[method-assign]
    items, rv = list_objects(kube, "pods", namespace=namespace, page=7)
    names = sorted(i["metadata"]["name"] for i in items)
    assert names == [f"p{i:02d}" for i in range(25)]
    assert len(calls) == 4 and all(c["limit"] == 7 for c in calls)
    assert [bool(c.get("_continue")) for c in calls] == [False, True, True, True]
    whole = core.list_namespaced_pod(namespace, label_selector=f"{LABEL_NAME}={APP_NAME}")
    assert sorted(p.metadata.name for p in whole.items) == names
    assert rv  # the snapshot's version: a watch resumes from it
    core.delete_namespaced_pod("p00", namespace, grace_period_seconds=0)
    seen = [
        (e.type, e.body["metadata"]["name"])
        for e in watch_objects(kube, "pods", namespace=namespace, resource_version=rv, seconds=2)
        if e.type != "BOOKMARK"
    ]
    assert ("DELETED", "p00") in seen or ("MODIFIED", "p00") in seen, seen
