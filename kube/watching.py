"""List and watch of the watcher's two resources, as raw JSON bodies.

The watcher keeps caches of ModelDeployments and Pods (``watcher.informer``); this module
is the Kubernetes side of that: one LIST (the bodies and the resourceVersion to watch
from) and one WATCH stream (each event's type and body), in every namespace or in one.

Bodies are decoded with ``json.loads`` straight from the response, not through the
generated client's model classes: a Pod decoded into ``V1Pod`` costs milliseconds, and
the watcher reads every Pod event of the fleet (``kube.objects.Pod.from_raw`` takes the
raw body).  Every request is bounded client-side; errors are classified once
(``kube.errors``): an expired resourceVersion (410 Gone, as a status or as an ERROR event)
raises ``Expired``, and the caller lists again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from kubernetes.watch.watch import iter_resp_lines

from kube.client import Kube
from kube.errors import Expired, KubeError, translated
from retirement.names import APP_NAME, GROUP, LABEL_NAME, PLURAL, VERSION

Resource = Literal["pods", "modeldeployments"]
#: Server-side length of one watch request, in seconds (then it is resumed, not re-listed).
WATCH_SECONDS = 60
#: Objects per page of a LIST (the API server's own default for clients that page is 500).
LIST_PAGE = 500
#: The label every Pod of a ModelDeployment carries: only those are listed and watched.
POD_SELECTOR = f"{LABEL_NAME}={APP_NAME}"


@dataclass(frozen=True)
class WatchEvent:
    """One event of a watch: ADDED, MODIFIED, DELETED or BOOKMARK, and the body."""

    type: str
    body: dict[str, Any]

    @property
    def resource_version(self) -> str:
        meta = self.body.get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


def _call(kube: Kube, resource: Resource, namespace: str | None, **kwargs: Any) -> Any:
    """One raw request (``_preload_content=False``): LIST, or WATCH with ``watch=True``."""
    if resource == "pods":
        if namespace is None:
            return kube.core.list_pod_for_all_namespaces(
                label_selector=POD_SELECTOR, _preload_content=False, **kwargs
            )
        return kube.core.list_namespaced_pod(
            namespace, label_selector=POD_SELECTOR, _preload_content=False, **kwargs
        )
    if namespace is None:
        return kube.custom.list_cluster_custom_object(
            GROUP, VERSION, PLURAL, _preload_content=False, **kwargs
        )
    return kube.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, _preload_content=False, **kwargs
    )


def list_objects(
    kube: Kube, resource: Resource, *, namespace: str | None = None, page: int = LIST_PAGE
) -> tuple[list[dict[str, Any]], str]:
    """Every object of ``resource`` (Pods: of a ModelDeployment) and the list's
    resourceVersion, read ``page`` objects at a time (``limit`` and ``continue``: the API
    server answers every page from one snapshot, so the pages add up to one consistent
    list; a continue token that expired is 410 Gone, ``Expired``, and the caller lists
    again).  Paged, neither the API server nor this process holds a fleet's whole list in
    one answer."""
    items: list[dict[str, Any]] = []
    rv = ""
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": page, "_request_timeout": kube.timeout_s}
        if token:
            kwargs["_continue"] = token
        with translated(f"list {resource} in {namespace or 'every namespace'}"):
            resp = _call(kube, resource, namespace, **kwargs)
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
        if not isinstance(body, dict):
            raise KubeError(f"list {resource}: the answer is not an object")
        items.extend(i for i in body.get("items") or [] if isinstance(i, dict))
        meta = body.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        rv = rv or str(meta.get("resourceVersion") or "")
        token = meta.get("continue") or None
        if not isinstance(token, str) or not token:
            return items, rv


def watch_objects(
    kube: Kube,
    resource: Resource,
    *,
    resource_version: str,
    namespace: str | None = None,
    seconds: int = WATCH_SECONDS,
) -> Iterator[WatchEvent]:
    """The events of ``resource`` after ``resource_version``, until the server ends the
    watch (after ``seconds``); raises ``Expired`` when the version is too old, and another
    ``KubeError`` on any other failure.  Bookmarks are yielded (their resourceVersion is
    where to resume)."""
    # Bounded read: longer than the server-side watch, so only a stalled stream times out.
    timeout = (kube.timeout_s, seconds + kube.timeout_s)
    what = f"watch {resource} in {namespace or 'every namespace'}"
    with translated(what):
        resp = _call(
            kube,
            resource,
            namespace,
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=seconds,
            _request_timeout=timeout,
        )
    try:
        with translated(what):
            for line in iter_resp_lines(resp):
                event = json.loads(line)
                if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
                    raise KubeError(f"{what}: an event is not an object")
                kind, body = str(event.get("type") or ""), event["object"]
                if kind == "ERROR":
                    code = body.get("code")
                    if code == 410:
                        raise Expired(f"{what}: {body.get('message') or 'resourceVersion expired'}")
                    raise KubeError(f"{what}: {body.get('message') or body}")
                yield WatchEvent(type=kind, body=body)
    finally:
        resp.close()
        resp.release_conn()
