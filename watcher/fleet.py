"""The watcher's cache of the fleet: every ModelDeployment and every Pod of one, as typed
views, indexed by deployment.

It is fed by list+watch (``watcher.informer``): a listing replaces one resource's
content, a watch event changes one object.  Each change answers which deployments it
touched, and only those are reconciled.  A Pod belongs to the deployment its
``app.kubernetes.io/instance`` label names (a Pod whose label moves touches both).

A watch event that changes nothing the reconcile reads (``watcher.changes``) is cached
but touches nothing; a Pod change of labels it does not read or of annotations only
touches its deployment when ``reads_every_label`` says the deployment's reconcile reads
them (the controller answers: a refusal is remembered, or a reconcile is under way).

The cache is owned by one thread (the watcher's event loop): informer threads hand it
their bodies already decoded, never mutate it themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kube.deployment import MalformedDeployment, ModelDeployment, parse_deployment
from kube.objects import Pod
from retirement.names import LABEL_INSTANCE
from watcher.changes import Change, deployment_changed, pod_change

#: A deployment: (namespace, name).
Key = tuple[str, str]


@dataclass(frozen=True)
class Broken:
    """A ModelDeployment body that could not be decoded for another reason than being
    malformed (a decoding bug): reported as that deployment's failure."""

    namespace: str
    name: str
    error: Exception


#: What the cache holds of one ModelDeployment.
Entry = ModelDeployment | MalformedDeployment | Broken


def decode_deployment(raw: Mapping[str, Any]) -> tuple[Key, Entry] | None:
    """The key and typed view of one ModelDeployment body (None: no name to key it by)."""
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    ns, name = meta.get("namespace"), meta.get("name")
    if not isinstance(ns, str) or not isinstance(name, str) or not ns or not name:
        return None
    try:
        entry: Entry = parse_deployment(raw)
    except MalformedDeployment as e:
        entry = e
    except Exception as e:  # a decoding bug: this deployment only
        entry = Broken(ns, name, e)
    return (ns, name), entry


def decode_pod(raw: Mapping[str, Any]) -> Pod | None:
    """The view of one Pod body the watcher keeps (None: no name or namespace), without
    its containers' specs: nothing the watcher decides reads them (a role's shape is read
    from the ModelDeployment, the intents and the label from labels and statuses), and a
    tenant's Pods may carry up to ~1.5 MB of command lines and environment each, which a
    cache of a fleet's Pods would otherwise hold whole (the security review's M2)."""
    pod = Pod.from_raw(raw)
    if not pod.name or not pod.namespace:
        return None
    return dataclasses.replace(pod, containers=())


@dataclass
class Fleet:
    """ModelDeployments by key; Pods by deployment, then by name."""

    deployments: dict[Key, Entry] = field(default_factory=dict)
    pods: dict[Key, dict[str, Pod]] = field(default_factory=dict)
    #: Where each Pod is filed: (namespace, Pod name) -> its deployment's key.
    _owner: dict[Key, Key] = field(default_factory=dict)
    #: Whether the reconcile of a deployment reads every label and annotation of its Pods
    #: now (then a change of any of them touches it); by default it always does.
    reads_every_label: Callable[[Key], bool] = field(default=lambda key: True, repr=False)

    # ------------------------------------------------------------ reading

    def known(self) -> set[Key]:
        """Every deployment known: listed, or with Pods (a deleted one's Pods may remain)."""
        return set(self.deployments) | set(self.pods)

    def deployment(self, key: Key) -> Entry | None:
        """What is cached of the deployment ``key`` (None: it does not exist)."""
        return self.deployments.get(key)

    def pods_of(self, key: Key) -> list[Pod]:
        """The Pods of the deployment ``key``, by name."""
        return [p for _, p in sorted(self.pods.get(key, {}).items())]

    # ------------------------------------------------------------ ModelDeployments

    def put_deployment(self, key: Key, entry: Entry) -> set[Key]:
        """An ADDED or MODIFIED ModelDeployment (touched unless it reads as the cached
        one: ``watcher.changes.deployment_changed``)."""
        before = self.deployments.get(key)
        self.deployments[key] = entry
        return {key} if before is None or deployment_changed(before, entry) else set()

    def drop_deployment(self, key: Key) -> set[Key]:
        """A DELETED ModelDeployment."""
        self.deployments.pop(key, None)
        return {key}

    def replace_deployments(
        self, entries: Iterable[tuple[Key, Entry]], *, namespace: str | None = None
    ) -> set[Key]:
        """A fresh listing of ``namespace`` (None: of every namespace): every deployment
        listed, and every one no longer listed, is touched (a listing after a watch gap
        may hide any change)."""
        before = {k for k in self.deployments if namespace is None or k[0] == namespace}
        for k in before:
            del self.deployments[k]
        listed = dict(entries)
        self.deployments.update(listed)
        return before | set(listed)

    # ------------------------------------------------------------ Pods

    def put_pod(self, pod: Pod) -> set[Key]:
        """An ADDED or MODIFIED Pod; touched: the deployments it left and joined, or the
        one it stays in unless the change reads the same to its reconcile
        (``watcher.changes.pod_change``)."""
        key = (pod.namespace, pod.labels.get(LABEL_INSTANCE, ""))
        if self._owner.get((pod.namespace, pod.name)) == key:
            filed = self.pods[key]
            change = pod_change(filed[pod.name], pod)
            filed[pod.name] = pod
            if change is Change.READ or (change is Change.FOREIGN and self.reads_every_label(key)):
                return {key}
            return set()
        touched = self._unfile(pod.namespace, pod.name)
        if key[1]:
            self.pods.setdefault(key, {})[pod.name] = pod
            self._owner[(pod.namespace, pod.name)] = key
            touched.add(key)
        return touched

    def drop_pod(self, namespace: str, name: str) -> set[Key]:
        """A DELETED Pod."""
        return self._unfile(namespace, name)

    def replace_pods(self, pods: Iterable[Pod], *, namespace: str | None = None) -> set[Key]:
        """A fresh listing of the Pods of ``namespace`` (None: of every namespace)."""
        touched: set[Key] = set()
        for ns, name in [k for k in self._owner if namespace is None or k[0] == namespace]:
            touched |= self._unfile(ns, name)
        for pod in pods:
            touched |= self.put_pod(pod)
        return touched

    def _unfile(self, namespace: str, name: str) -> set[Key]:
        key = self._owner.pop((namespace, name), None)
        if key is None:
            return set()
        filed = self.pods.get(key, {})
        filed.pop(name, None)
        if not filed:
            self.pods.pop(key, None)
        return {key}
