"""Kueue Workloads for the stand-in operator's replicas, made the way gpustack's operator and
Kueue make them together (tests and the demo only; never the product).

What gpustack's operator does (gpustack/gpustack-operator,
``pkg/worker/controllers/worker/model_deployment.go`` and ``model_deployment_group*.go``): every
replica is a Kueue *pod group* of its own.  Each member Pod carries the group's name in the
label ``kueue.x-k8s.io/pod-group-name`` (``gpustack-fnv64-`` and an FNV-64a hash of
namespace/deployment/role/ordinal: unique, never parsed back), the replica's size in the
annotation ``kueue.x-k8s.io/pod-group-total-count``, the role's name as
``kueue.x-k8s.io/role-hash`` (the PodSet's name) and ``kueue.x-k8s.io/pod-group-serving: "true"``
(a serving group never finishes).  The operator never creates the Workload itself: Kueue
composes it.  An earlier operator put every replica of a role into one group; ``per_role``
renders that shape, whose one Workload owns the Pods of several replicas.

What Kueue v0.17.0 does with such a group (``sigs.k8s.io/kueue``
``pkg/controller/jobs/pod/pod_webhook.go``, ``pod_controller.go``; the same module the bed
takes the Workload CRD from):
- its webhook labels each Pod ``kueue.x-k8s.io/managed=true`` and puts the finalizer
  ``kueue.x-k8s.io/managed`` on it (here: rendered into the Pod when it is created; the
  scheduling gate is left out: the API server refuses a gated Pod that names its node);
- once the group's declared total of runnable Pods exists, it composes one Workload named
  after the group, verbatim, in the Pods' namespace: every Pod of the group is an owner
  (``apiVersion: v1``, ``kind: Pod``, no controller reference), its finalizer
  ``kueue.x-k8s.io/resource-in-use``, the annotation ``kueue.x-k8s.io/is-group-workload``, the
  queue from the Pods' ``kueue.x-k8s.io/queue-name``, one PodSet per role-hash;
- a deleted member of a serving group keeps its finalizer for as long as the group's Workload
  exists: the Workload being deleted is what releases it;
- when the Workload is being deleted, Kueue stops the whole group (deletes every member still
  running), removes the Pods' finalizers and then its own from the Workload.

Not played: admission (quota, ``status.admission``, conditions), excess-Pod clean-up, the
gpustack operator's own release of a Workload whose replica it did not send away.  The
product reads none of it (``activities/admit.py`` binds the Workload that owns one of the
replica's Pods, by name and UID; ``activities/deletion.py`` deletes it only when it owns no
other Pod, and settles once it is gone), and leaving the last one out keeps what a test sees
the product's own doing.

The version written is the one the cluster prefers for Kueue's group, discovered each pass, as
Kueue's own clients write whatever the installed CRD serves.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

KUEUE_GROUP = "kueue.x-k8s.io"
WORKLOADS = "workloads"
GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED_LABEL = "kueue.x-k8s.io/managed"
TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"
SERVING_ANNOTATION = "kueue.x-k8s.io/pod-group-serving"
IS_GROUP_WORKLOAD_ANNOTATION = "kueue.x-k8s.io/is-group-workload"
POD_FINALIZER = "kueue.x-k8s.io/managed"
WORKLOAD_FINALIZER = "kueue.x-k8s.io/resource-in-use"
#: The LocalQueue the bed's replicas name (the bed runs no Kueue, so nothing admits them).
QUEUE = "bed-queue"
GROUP_PREFIX = "gpustack-fnv64-"
JSON_PATCH = "application/json-patch+json"


def fnv64a(text: str) -> int:
    """The 64-bit FNV-1a hash of ``text``'s UTF-8 bytes."""
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def group_name(namespace: str, md: str, role: str, ordinal: int | None) -> str:
    """The pod group (and so the Workload) name of one replica, or of a whole role
    (``ordinal`` None: the earlier per-role shape)."""
    parts = [namespace, md, role] + ([] if ordinal is None else [str(ordinal)])
    return f"{GROUP_PREFIX}{fnv64a('/'.join(parts)):016x}"


@dataclass
class PodGroupWorkloads:
    """gpustack's pod-group metadata on each member Pod, and Kueue's part: the group's
    Workload composed, and its finalizers released when it is deleted."""

    api: client.ApiClient
    namespace: str
    #: One group per role (every replica's Pods under one Workload) instead of per replica.
    per_role: bool = False

    # ------------------------------------------------------------ gpustack's operator

    def join(
        self, pod: client.V1Pod, md: dict[str, Any], role: dict[str, Any], ordinal: int
    ) -> None:
        """Render the group metadata (and what Kueue's webhook adds) into a member Pod about
        to be created."""
        size = int(role.get("size", 1))
        total = size * int(role["replicas"]) if self.per_role else size
        meta = pod.metadata
        meta.labels = {
            **(meta.labels or {}),
            GROUP_NAME_LABEL: group_name(
                self.namespace,
                md["metadata"]["name"],
                role["name"],
                None if self.per_role else ordinal,
            ),
            QUEUE_LABEL: QUEUE,
            MANAGED_LABEL: "true",
        }
        meta.annotations = {
            **(meta.annotations or {}),
            TOTAL_COUNT_ANNOTATION: str(total),
            ROLE_HASH_ANNOTATION: role["name"],
            SERVING_ANNOTATION: "true",
        }
        meta.finalizers = [*(meta.finalizers or []), POD_FINALIZER]

    # ------------------------------------------------------------ Kueue

    def reconcile(self, pods: list[client.V1Pod]) -> None:
        """One level-based pass of Kueue's part over the namespace's grouped Pods."""
        version = self.served_version()
        if version is None:
            return  # Kueue is not installed: its webhook's finalizers stay (as they would)
        custom = client.CustomObjectsApi(self.api)
        listing = custom.list_namespaced_custom_object(
            KUEUE_GROUP, version, self.namespace, WORKLOADS
        )
        workloads = {w["metadata"]["name"]: w for w in listing.get("items") or []}
        groups: dict[str, list[client.V1Pod]] = defaultdict(list)
        for p in pods:
            name = (p.metadata.labels or {}).get(GROUP_NAME_LABEL)
            if name:
                groups[name].append(p)
        for name, members in groups.items():
            wl = workloads.get(name)
            if wl is not None and wl["metadata"].get("deletionTimestamp"):
                self._stop(members)
                self._finalize(members)
            elif wl is None and all(_terminating(p) for p in members):
                self._finalize(members)  # the Workload is gone: nothing holds them now
            elif wl is None:
                self._compose(version, name, members)
        for name, wl in workloads.items():
            if wl["metadata"].get("deletionTimestamp") and not any(
                not _terminating(p) or POD_FINALIZER in (p.metadata.finalizers or [])
                for p in groups.get(name, [])
            ):
                _remove_finalizer_of_workload(custom, version, self.namespace, wl)

    def served_version(self) -> str | None:
        """The version of Kueue's group the cluster prefers, or None when it serves none."""
        groups = client.ApisApi(self.api).get_api_versions().groups or []
        for g in groups:
            if g.name == KUEUE_GROUP and g.preferred_version is not None:
                return str(g.preferred_version.version)
        return None

    def _compose(self, version: str, name: str, members: list[client.V1Pod]) -> None:
        """The group's Workload, once its declared total of runnable members exists."""
        runnable = [p for p in members if not _terminating(p) and p.status.phase != "Failed"]
        if not runnable:
            return
        total = int(runnable[0].metadata.annotations.get(TOTAL_COUNT_ANNOTATION, "1"))
        if len(runnable) < total:
            return  # a group short of its total composes no Workload
        roles: dict[str, list[client.V1Pod]] = defaultdict(list)
        for p in runnable:
            roles[p.metadata.annotations.get(ROLE_HASH_ANNOTATION, "main")].append(p)
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{version}",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "finalizers": [WORKLOAD_FINALIZER],
                "annotations": {IS_GROUP_WORKLOAD_ANNOTATION: "true"},
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "name": p.metadata.name,
                        "uid": p.metadata.uid,
                    }
                    for p in runnable
                ],
            },
            "spec": {
                "queueName": runnable[0].metadata.labels.get(QUEUE_LABEL, QUEUE),
                "podSets": [
                    {
                        "name": role,
                        "count": len(ps),
                        "template": {"spec": {"containers": _containers(ps[0])}},
                    }
                    for role, ps in sorted(roles.items())
                ],
            },
        }
        with contextlib.suppress(ApiException):  # AlreadyExists: composed by another pass
            client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                KUEUE_GROUP, version, self.namespace, WORKLOADS, body
            )

    def _stop(self, members: list[client.V1Pod]) -> None:
        """A deleted Workload stops its whole group: every member still running is deleted."""
        core = client.CoreV1Api(self.api)
        for p in members:
            if not _terminating(p):
                with contextlib.suppress(ApiException):
                    core.delete_namespaced_pod(
                        p.metadata.name,
                        self.namespace,
                        body=client.V1DeleteOptions(
                            preconditions=client.V1Preconditions(uid=p.metadata.uid)
                        ),
                    )

    def _finalize(self, members: list[client.V1Pod]) -> None:
        """Release Kueue's finalizer on the members (a terminating one then goes)."""
        core = client.CoreV1Api(self.api)
        for p in members:
            fins = list(p.metadata.finalizers or [])
            if POD_FINALIZER not in fins:
                continue
            with contextlib.suppress(ApiException):  # changed meanwhile: next pass
                core.patch_namespaced_pod(
                    p.metadata.name,
                    self.namespace,
                    _remove_at(fins.index(POD_FINALIZER), POD_FINALIZER, p.metadata.uid),
                    _content_type=JSON_PATCH,
                )


def _remove_finalizer_of_workload(
    custom: client.CustomObjectsApi, version: str, namespace: str, wl: dict[str, Any]
) -> None:
    fins = list(wl["metadata"].get("finalizers") or [])
    if WORKLOAD_FINALIZER not in fins:
        return
    with contextlib.suppress(ApiException):
        custom.patch_namespaced_custom_object(
            KUEUE_GROUP,
            version,
            namespace,
            WORKLOADS,
            wl["metadata"]["name"],
            _remove_at(fins.index(WORKLOAD_FINALIZER), WORKLOAD_FINALIZER, wl["metadata"]["uid"]),
            _content_type=JSON_PATCH,
        )


def _remove_at(index: int, value: str, uid: str) -> list[dict[str, Any]]:
    """A JSON patch removing one finalizer, applied only to that object and only if the list
    still holds it there."""
    path = f"/metadata/finalizers/{index}"
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]


def _containers(p: client.V1Pod) -> list[dict[str, Any]]:
    return [{"name": c.name, "image": c.image} for c in p.spec.containers]


def _terminating(p: client.V1Pod) -> bool:
    return p.metadata.deletion_timestamp is not None
