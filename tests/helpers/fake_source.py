"""An informer source over ``FakeKube`` (``watcher.informer.Source``), for offline tests of
the watcher's controller, as strict as the API server about versions.

``list`` copies what FakeKube holds (Pods of a ModelDeployment only, as the real source
selects) with the store's current resourceVersion; ``watch(resource_version)`` delivers
every change after that version from FakeKube's history, in order (ADDED, MODIFIED,
DELETED, each body carrying its own version), then follows new changes until ``watch_s``
ends it, as a server ends a watch.  A version older than FakeKube's compaction
(``FakeKube.compact``) is answered 410 Gone (``Expired``), as the real API server answers
a version its watch cache no longer holds; one that is not a number, HTTP 500 (measured:
the API server fails to parse it and answers 500, not 400).  The twins:
``tests/bed/test_fake_kube_twin_on_bed.py``.  ``fail_lists`` makes the next listings
raise, ``expire`` makes the next watches answer 410 Gone.  Not imitated: a Pod whose
``app.kubernetes.io/name`` label changes away from the product's (the real watch reports
it DELETED; here it falls silent): no test and nothing in the product changes that label.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator
from typing import Any

from kube.errors import Expired, Unavailable
from kube.watching import Resource, WatchEvent
from retirement.names import APP_NAME, LABEL_NAME
from tests.helpers.fake_kube import FakeKube


def _selected(resource: Resource, namespace: str | None, body: dict[str, Any]) -> bool:
    """Whether the real source's LIST/WATCH of ``resource`` in ``namespace`` covers it."""
    meta = body["metadata"]
    if namespace is not None and meta.get("namespace") != namespace:
        return False
    return resource != "pods" or (meta.get("labels") or {}).get(LABEL_NAME) == APP_NAME


class FakeSource:
    """List+watch of a FakeKube."""

    def __init__(self, kube: FakeKube, *, poll_s: float = 0.01, watch_s: float = 0.5) -> None:
        self.kube, self.poll_s, self.watch_s = kube, poll_s, watch_s
        self.lists: list[tuple[Resource, str | None]] = []
        self.watches: list[tuple[Resource, str | None, str]] = []
        self._fail_lists = 0
        self._expire = 0
        self._lock = threading.Lock()

    def fail_lists(self, times: int) -> None:
        with self._lock:
            self._fail_lists = times

    def expire(self, times: int = 1) -> None:
        with self._lock:
            self._expire = times

    def list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        with self._lock:
            self.lists.append((resource, namespace))
            if self._fail_lists > 0:
                self._fail_lists -= 1
                raise Unavailable(f"list {resource}", status=503, reason="ServiceUnavailable")
        with self.kube._lock:
            store = self.kube.pods if resource == "pods" else self.kube.deployments
            objs = [copy.deepcopy(v) for v in store.values() if _selected(resource, namespace, v)]
            return objs, self.kube.resource_version

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str
    ) -> Iterator[WatchEvent]:
        with self._lock:
            self.watches.append((resource, namespace, resource_version))
            expire = self._expire > 0
            self._expire -= expire
        if not resource_version.isdigit():  # measured on the bed: a 500, not a 400
            raise Unavailable(
                f"watch {resource}",
                status=500,
                reason="Internal Server Error",
                detail=f'resourceVersion: Invalid value: "{resource_version}"',
            )
        after = int(resource_version)
        with self.kube._lock:
            too_old = after < self.kube.compacted_to
        if expire or too_old:
            raise Expired(
                f"watch {resource}: too old resource version {resource_version}",
                status=410,
                reason="Gone",
            )
        end = time.monotonic() + self.watch_s
        while time.monotonic() < end:
            with self.kube._lock:
                if after < self.kube.compacted_to:  # compacted while the watch ran
                    raise Expired(f"watch {resource}", status=410, reason="Gone")
                news = [c for c in self.kube.history if c[0] > after]
            for rv, res, kind, body in news:
                after = rv
                if res == resource and _selected(resource, namespace, body):
                    yield WatchEvent(kind, copy.deepcopy(body))
            time.sleep(self.poll_s)
