"""Informers: list+watch of one resource, decoded, handed to the cache's owner.

One thread per (resource, namespace scope) lists once, then follows the watch from the
listing's resourceVersion, resuming from the last version seen (a bookmark's or an
object's) each time the server ends a watch: the events themselves feed the cache, never a
re-list.  Only an expired version (410 Gone) or a failure lists again (after a pause that
doubles up to ``MAX_PAUSE_S`` while failures repeat).  Bodies are decoded in the thread;
the cache is changed only by ``deliver``, which the controller runs on its event loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from kube.client import Kube
from kube.errors import Expired, KubeError, classify
from kube.objects import Pod
from kube.watching import Resource, WatchEvent, list_objects, watch_objects
from watcher.fleet import Entry, Key, decode_deployment, decode_pod

log = logging.getLogger("retire-watcher")

FIRST_PAUSE_S = 0.5
MAX_PAUSE_S = 30.0


@dataclass(frozen=True)
class Listed:
    """A fresh listing of the informer's resource in its scope."""

    resource: Resource
    namespace: str | None
    deployments: tuple[tuple[Key, Entry], ...] = ()
    pods: tuple[Pod, ...] = ()


@dataclass(frozen=True)
class Changed:
    """One object changed (``gone``: deleted)."""

    resource: Resource
    key: Key  # (namespace, name) of the object
    gone: bool = False
    deployment: Entry | None = None
    pod: Pod | None = None


Delta = Listed | Changed


class Source(Protocol):
    """Where an informer lists and watches (``KubeSource`` on a cluster; tests give their
    own)."""

    def list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        """Every object and the listing's resourceVersion."""
        ...

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str
    ) -> Iterator[WatchEvent]:
        """The events after ``resource_version`` until the server ends the watch."""
        ...


@dataclass(frozen=True)
class KubeSource:
    """The informers' source on a real cluster (``kube.watching``)."""

    kube: Kube

    def list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        return list_objects(self.kube, resource, namespace=namespace)

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str
    ) -> Iterator[WatchEvent]:
        return watch_objects(
            self.kube, resource, namespace=namespace, resource_version=resource_version
        )


@dataclass
class Informer:
    """List+watch of ``resource`` in ``namespace`` (None: every namespace)."""

    source: Source
    resource: Resource
    namespace: str | None
    deliver: Callable[[Delta], None]
    on_restart: Callable[[], None] = lambda: None
    #: Whether the last listing or watch succeeded (readiness reads it).
    healthy: bool = field(default=False, init=False)
    #: Set once the first listing was delivered.
    synced: threading.Event = field(default_factory=threading.Event, init=False)
    events: int = field(default=0, init=False)

    def run(self, stop: threading.Event) -> None:
        """List, then watch, until ``stop``."""
        pause = FIRST_PAUSE_S
        while not stop.is_set():
            try:
                rv = self._list()
                pause = FIRST_PAUSE_S
                while not stop.is_set():
                    rv = self._watch(rv, stop)
            except Exception as e:
                error: KubeError = classify(e, what=f"watch {self.resource}")
                if isinstance(error, Expired):
                    log.info("%s: %s: listing again", self.resource, error)
                else:
                    self.healthy = False
                    log.warning("%s (listing again in %.1f s)", error, pause)
                    stop.wait(pause)
                    pause = min(pause * 2, MAX_PAUSE_S)
            self.on_restart()

    def _list(self) -> str:
        items, rv = self.source.list(self.resource, self.namespace)
        if self.resource == "pods":
            pods = tuple(p for p in (decode_pod(i) for i in items) if p is not None)
            self.deliver(Listed(self.resource, self.namespace, pods=pods))
        else:
            mds = tuple(d for d in (decode_deployment(i) for i in items) if d is not None)
            self.deliver(Listed(self.resource, self.namespace, deployments=mds))
        self.healthy = True
        self.synced.set()
        return rv

    def _watch(self, rv: str, stop: threading.Event) -> str:
        """Follow one watch from ``rv``; the version to resume from."""
        for event in self.source.watch(self.resource, self.namespace, rv):
            rv = event.resource_version or rv
            if event.type in ("ADDED", "MODIFIED", "DELETED"):
                delta = self._decode(event)
                if delta is not None:
                    self.events += 1
                    self.deliver(delta)
            if stop.is_set():
                break
        self.healthy = True
        return rv

    def _decode(self, event: WatchEvent) -> Changed | None:
        gone = event.type == "DELETED"
        if self.resource == "pods":
            pod = decode_pod(event.body)
            if pod is None:
                return None
            return Changed("pods", (pod.namespace, pod.name), gone=gone, pod=pod)
        decoded = decode_deployment(event.body)
        if decoded is None:
            return None
        key, entry = decoded
        return Changed("modeldeployments", key, gone=gone, deployment=entry)
