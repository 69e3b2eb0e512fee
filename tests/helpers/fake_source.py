"""An informer source over ``FakeKube`` (``watcher.informer.Source``), for offline tests of
the watcher's controller.

``list`` copies what FakeKube holds (Pods of a ModelDeployment only, as the real source
selects); ``watch`` polls FakeKube every ``poll_s`` and yields ADDED / MODIFIED / DELETED
events for what changed since the last listing or event (by resourceVersion), then ends
after ``watch_s`` as a server ends a watch.  ``fail_lists`` makes the next listings raise,
``expire`` makes the next watch answer 410 Gone.
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

Key = tuple[str, str]


class FakeSource:
    """List+watch of a FakeKube."""

    def __init__(self, kube: FakeKube, *, poll_s: float = 0.01, watch_s: float = 0.5) -> None:
        self.kube, self.poll_s, self.watch_s = kube, poll_s, watch_s
        self.lists: list[tuple[Resource, str | None]] = []
        self.watches: list[tuple[Resource, str | None, str]] = []
        self._seen: dict[tuple[Resource, str | None], dict[Key, str]] = {}
        self._fail_lists = 0
        self._expire = 0
        self._lock = threading.Lock()

    def fail_lists(self, times: int) -> None:
        with self._lock:
            self._fail_lists = times

    def expire(self, times: int = 1) -> None:
        with self._lock:
            self._expire = times

    def _objects(self, resource: Resource, namespace: str | None) -> dict[Key, dict[str, Any]]:
        with self.kube._lock:
            store = self.kube.pods if resource == "pods" else self.kube.deployments
            out = {
                k: copy.deepcopy(v)
                for k, v in store.items()
                if namespace is None or k[0] == namespace
            }
        if resource == "pods":
            out = {
                k: v
                for k, v in out.items()
                if (v["metadata"].get("labels") or {}).get(LABEL_NAME) == APP_NAME
            }
        return out

    def list(self, resource: Resource, namespace: str | None) -> tuple[list[dict[str, Any]], str]:
        with self._lock:
            self.lists.append((resource, namespace))
            if self._fail_lists > 0:
                self._fail_lists -= 1
                raise Unavailable(f"list {resource}", status=503, reason="ServiceUnavailable")
        objs = self._objects(resource, namespace)
        self._seen[(resource, namespace)] = {
            k: v["metadata"]["resourceVersion"] for k, v in objs.items()
        }
        return list(objs.values()), str(len(self.lists))

    def watch(
        self, resource: Resource, namespace: str | None, resource_version: str
    ) -> Iterator[WatchEvent]:
        with self._lock:
            self.watches.append((resource, namespace, resource_version))
            if self._expire > 0:
                self._expire -= 1
                raise Expired(f"watch {resource}", status=410, reason="Gone")
        seen = self._seen.setdefault((resource, namespace), {})
        end = time.monotonic() + self.watch_s
        while time.monotonic() < end:
            objs = self._objects(resource, namespace)
            for k in [k for k in seen if k not in objs]:
                del seen[k]
                gone = {"metadata": {"namespace": k[0], "name": k[1], "labels": {}}}
                yield WatchEvent("DELETED", gone)
            for k, v in objs.items():
                rv = v["metadata"]["resourceVersion"]
                if seen.get(k) != rv:
                    kind = "MODIFIED" if k in seen else "ADDED"
                    seen[k] = rv
                    yield WatchEvent(kind, v)
            time.sleep(self.poll_s)
