"""Which watch events reach a reconcile (``watcher.changes``, applied by the cache in
``watcher.fleet`` and the controller's ``apply``): an event that changes something a
deployment's reconcile reads queues the deployment; status noise, a ModelDeployment's new
resourceVersion alone, and a Pod's other labels and annotations (while no refusal of the
deployment is remembered and no reconcile of it is under way) are cached without one;
and what is dropped leaves the reconcile with the same actions."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from kube.deployment import MalformedDeployment
from kube.objects import Pod
from retirement.names import ANNOTATION_RETRY, LABEL_ELIGIBLE, LABEL_ROLE_KIND
from tests.helpers.fake_source import FakeSource
from tests.helpers.watcher_world import (
    MD,
    NS,
    Clock,
    World,
    add_md,
    add_replicas,
    make_world,
)
from watcher.changes import LABELS_READ, Change, pod_change
from watcher.controller import Controller
from watcher.fleet import decode_deployment
from watcher.informer import Changed, Listed
from watcher.metrics import Health
from watcher.refusals import Refusal
from watcher.workqueue import WorkQueue

Body = dict[str, Any]
POD = f"{MD}-server-1"


def loaded(w: World) -> Controller:
    """A controller whose cache holds what FakeKube holds, with an empty queue (no
    informer, no loop: ``apply`` is called by hand)."""
    ctl = Controller(rec=w.rec, source=FakeSource(w.kube), health=Health())
    mds = tuple(d for d in map(decode_deployment, w.kube.deployments.values()) if d)
    ctl.apply(Listed("modeldeployments", None, deployments=mds))
    ctl.apply(Listed("pods", None, pods=tuple(Pod.from_raw(p) for p in w.kube.pods.values())))
    ctl.queue = WorkQueue()
    return ctl


def world() -> World:
    w = make_world()
    add_md(w, replicas=2)
    add_replicas(w, range(2))
    return w


def pod_event(w: World, mutate: Callable[[Body], object], name: str = POD) -> Changed:
    """The MODIFIED event of Pod ``name`` after ``mutate`` (with a new resourceVersion)."""
    body = copy.deepcopy(w.kube.pods[(NS, name)])
    mutate(body)
    body["metadata"]["resourceVersion"] = "999999"
    return Changed("pods", (NS, name), pod=Pod.from_raw(body))


def applied(mutate: Callable[[Body], object], expected: Change) -> tuple[World, Controller, Pod]:
    """A loaded controller after the MODIFIED event of ``mutate`` on the Pod, checked to
    be the ``expected`` kind of change; returns the world, the controller and the new Pod."""
    w = world()
    ctl = loaded(w)
    event = pod_event(w, mutate)
    assert event.pod is not None
    assert pod_change(Pod.from_raw(w.kube.pods[(NS, POD)]), event.pod) is expected
    ctl.apply(event)
    return w, ctl, event.pod


def md_event(w: World, mutate: Callable[[Body], object]) -> Changed:
    body = copy.deepcopy(w.kube.deployments[(NS, MD)])
    mutate(body)
    body["metadata"]["resourceVersion"] = "999999"
    decoded = decode_deployment(body)
    assert decoded is not None
    return Changed("modeldeployments", decoded[0], deployment=decoded[1])


def labels(b: Body) -> dict[str, str]:
    out: dict[str, str] = b["metadata"].setdefault("labels", {})
    return out


def annotations(b: Body) -> dict[str, str]:
    out: dict[str, str] = b["metadata"].setdefault("annotations", {})
    return out


def condition(b: Body, status: str) -> None:
    b["status"]["conditions"][0]["status"] = status


NOISE: dict[str, Callable[[Body], object]] = {
    "resourceVersion": lambda b: None,
    "managed fields": lambda b: b["metadata"].update(managedFields=[{"manager": "kwok"}]),
    "condition timestamp": lambda b: b["status"]["conditions"][0].update(
        lastTransitionTime="2026-12-03T15:00:00Z"
    ),
    "phase": lambda b: b["status"].update(phase="Running"),
}
FOREIGN: dict[str, Callable[[Body], object]] = {
    "label added": lambda b: labels(b).update({"example.com/churn": "1"}),
    "role-kind label": lambda b: labels(b).update({LABEL_ROLE_KIND: "Decode"}),
    "annotation": lambda b: annotations(b).update({"example.com/churn": "1"}),
    "annotation removed": lambda b: annotations(b).clear(),
}
READ: dict[str, Callable[[Body], object]] = {
    **{
        f"label {k}": (lambda key: lambda b: labels(b).update({key: "7"}))(k)
        for k in sorted(LABELS_READ)
    },
    "eligibility removed": lambda b: labels(b).pop(LABEL_ELIGIBLE),
    "not ready": lambda b: condition(b, "False"),
    "address": lambda b: b["status"].update(podIP="198.18.1.99"),
    "container restarted": lambda b: b["status"]["containerStatuses"][0].update(
        containerID="containerd://main-2", restartCount=1
    ),
    "terminating": lambda b: b["metadata"].update(deletionTimestamp="2026-12-03T15:00:00Z"),
}


@pytest.mark.parametrize("mutate", NOISE.values(), ids=list(NOISE))
def test_status_noise_is_cached_without_a_reconcile(mutate: Callable[[Body], object]) -> None:
    _, ctl, _ = applied(mutate, Change.NONE)
    assert len(ctl.queue) == 0


@pytest.mark.parametrize("mutate", FOREIGN.values(), ids=list(FOREIGN))
def test_other_labels_and_annotations_reach_only_a_deployment_that_reads_them(
    mutate: Callable[[Body], object],
) -> None:
    w, ctl, pod = applied(mutate, Change.FOREIGN)
    assert len(ctl.queue) == 0  # no refusal, no reconcile under way: nothing reads them
    assert ctl.rec.fleet.pods_of((NS, MD))[1] == pod  # the cache has the new Pod
    # A refusal of the deployment depends on every label and annotation of its replica.
    w.rec.refusals[(NS, MD, "server", 1)] = Refusal("no", (), 30.0, until=2000.0)
    ctl.apply(pod_event(w, lambda b: (mutate(b), labels(b).update({"again": "1"}))))
    assert len(ctl.queue) == 1
    # A reconcile under way may be recording a refusal from the Pods it read before.
    w.rec.refusals.clear()
    ctl.queue = WorkQueue()
    ctl.queue._processing.add((NS, MD))
    ctl.apply(pod_event(w, lambda b: (mutate(b), labels(b).update({"again": "2"}))))
    assert ctl.queue.in_flight((NS, MD)) and (NS, MD) in ctl.queue._dirty


@pytest.mark.parametrize("mutate", READ.values(), ids=list(READ))
def test_a_change_the_reconcile_reads_queues_the_deployment(
    mutate: Callable[[Body], object],
) -> None:
    _, ctl, _ = applied(mutate, Change.READ)
    assert len(ctl.queue) >= 1
    assert (NS, MD) in ctl.queue._dirty  # a Pod moved away touches the deployment it left


def test_a_deployment_is_queued_unless_only_its_resource_version_moved() -> None:
    w = world()
    ctl = loaded(w)
    status = md_event(w, lambda b: b.update(status={"phase": "Ready"}))
    ctl.apply(status)
    assert len(ctl.queue) == 0
    cached = ctl.rec.fleet.deployment((NS, MD))
    assert cached is not None and not isinstance(cached, MalformedDeployment | Exception)
    assert getattr(cached, "resource_version", "") == "999999"  # the new version is cached
    changes: list[Callable[[Body], object]] = [
        lambda b: b["spec"]["roles"][0].update(replicas=1),
        lambda b: b.update(status={"retryTokens": {"server:1": "t1"}}),
        lambda b: b.update(status={"retirement": {"lastConsumedRetryToken": "t1"}}),
        lambda b: annotations(b).update({"example.com/other": "1"}),
        lambda b: b["metadata"].update(generation=7),
        lambda b: b["metadata"].update(uid="re-created"),
        # A retry annotation is cleared bound to the resourceVersion: the new one matters.
        lambda b: annotations(b).update({ANNOTATION_RETRY: "server:1:tok"}),
        lambda b: b["spec"]["roles"][0].update(replicas=None),  # malformed
    ]
    for mutate in changes:
        ctl.apply(status)  # back to the plain deployment
        ctl.queue = WorkQueue()
        ctl.apply(md_event(w, mutate))
        assert len(ctl.queue) == 1
    ctl.queue = WorkQueue()
    ctl.apply(md_event(w, lambda b: annotations(b).update({ANNOTATION_RETRY: "server:1:tok"})))
    assert len(ctl.queue) == 1  # the same object again: it carries the annotation


async def test_what_is_dropped_leaves_the_reconcile_with_the_same_actions() -> None:
    """Two fleets that differ only in other labels and annotations of their Pods: the
    reconcile starts the same retirement, repairs the same labels and posts the same
    Events (no refusal is remembered in either)."""

    def scene(churn: bool) -> World:
        w = make_world(clock=Clock())
        add_md(w, replicas=2)
        add_replicas(w, [0])
        add_replicas(w, [1], eligible=False)  # an orphan: the label is put back
        add_replicas(w, [2], ready="False")  # not ready, labelled: the label comes off
        add_replicas(w, [3])  # a count trim
        if churn:
            for name in [f"{MD}-server-{o}" for o in range(4)]:
                with w.kube._lock:
                    meta = w.kube.pods[(NS, name)]["metadata"]
                    meta["labels"]["example.com/churn"] = name
                    meta["annotations"] = {"example.com/note": "x", **meta["annotations"]}
        return w

    plain, churned = scene(False), scene(True)
    acted: list[tuple[object, ...]] = []
    for w in (plain, churned):
        await w.pass_(times=2)
        patches = [(c.args["name"], repr(c.args["ops"])) for c in w.kube.called("patch_pod")]
        reasons = sorted(e["reason"] for e in w.events())
        acted.append((w.starts(), patches, reasons))
    assert acted[0] == acted[1]
    starts, patches, _ = acted[0]
    assert [r.ordinal for r in starts] == [3] and len(patches) == 2  # the scene acts
