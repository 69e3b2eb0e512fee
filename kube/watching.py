"""List+watch of the watcher's two resources, as a change trigger.

The watcher is level-based: it only needs to know *that* something changed, so each
event (bookmarks aside) just sets a trigger.  Watches resume from the listing's
resourceVersion with bookmarks on; an expired version (410) lists again at once, any
other failure after a one-second pause.  Every request is bounded client-side.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Literal

from kubernetes import watch

from kube.client import Kube
from kube.errors import Expired, KubeError, classify
from retirement.names import APP_NAME, GROUP, LABEL_NAME, PLURAL, VERSION

log = logging.getLogger("retire-watcher")

Resource = Literal["pods", "modeldeployments"]
#: Server-side length of one watch request, in seconds.
WATCH_SECONDS = 60


def watch_changes(
    kube: Kube,
    resource: Resource,
    *,
    on_change: Callable[[], None],
    stop: threading.Event,
    on_restart: Callable[[], None],
) -> None:
    """List+watch ``resource`` in every namespace, calling ``on_change`` after each listing
    and on every change, and ``on_restart`` each time the watch starts over; until ``stop``."""
    # Bounded read: longer than the server-side watch, so only a stalled stream times out.
    timeout = (kube.timeout_s, WATCH_SECONDS + kube.timeout_s)
    while not stop.is_set():
        try:
            if resource == "pods":
                lister: Any = kube.core.list_pod_for_all_namespaces
                kwargs: dict[str, Any] = {"label_selector": f"{LABEL_NAME}={APP_NAME}"}
            else:
                lister = kube.custom.list_cluster_custom_object
                kwargs = {"group": GROUP, "version": VERSION, "plural": PLURAL}
            listing = lister(_request_timeout=kube.timeout_s, **kwargs)
            rv = (
                listing.metadata.resource_version
                if resource == "pods"
                else listing["metadata"]["resourceVersion"]
            )
            on_change()
            w = watch.Watch()
            for event in w.stream(
                lister,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_SECONDS,
                _request_timeout=timeout,
                **kwargs,
            ):
                if event.get("type") != "BOOKMARK":
                    on_change()
                if stop.is_set():
                    w.stop()
        except Exception as e:
            error: KubeError = classify(e, what=f"watch {resource}")
            if not isinstance(error, Expired):  # 410 Gone: list again from scratch
                log.warning("%s", error)
                stop.wait(1)
        on_restart()
