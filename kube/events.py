"""Kubernetes Events, posted once each.

An Event's name is derived from what it says (``<object>.<tag>-<digest of key>``), so a
retried activity or a second watcher pass posting the same note gets a Conflict from the
API server and the note appears once.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from kube.api import KubeApi
from kube.errors import Conflict
from kube.objects import ObjectRef
from retirement.names import FIELD_MANAGER

MESSAGE_CAP = 1000


def event_name(about: ObjectRef, *, tag: str, key: str) -> str:
    """The deterministic name of the Event ``key`` about ``about``."""
    return f"{about.name}.{tag}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def event_body(
    *, about: ObjectRef, name: str, reason: str, message: str, warning: bool, now: datetime
) -> dict[str, Any]:
    """A core/v1 Event body."""
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved: dict[str, Any] = {
        "apiVersion": about.api_version,
        "kind": about.kind,
        "name": about.name,
        "namespace": about.namespace,
    }
    if about.uid:
        involved["uid"] = about.uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": about.namespace},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:MESSAGE_CAP],
        "type": "Warning" if warning else "Normal",
        "source": {"component": FIELD_MANAGER},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def post_event(
    api: KubeApi,
    *,
    about: ObjectRef,
    tag: str,
    key: str,
    reason: str,
    message: str,
    warning: bool = False,
    now: datetime | None = None,
) -> bool:
    """Post the Event ``key`` about ``about`` once; False when it was already posted."""
    name = event_name(about, tag=tag, key=key)
    body = event_body(
        about=about,
        name=name,
        reason=reason,
        message=message,
        warning=warning,
        now=now or datetime.now(UTC),
    )
    try:
        api.create_event(namespace=about.namespace, event=body)
    except Conflict:
        return False
    return True
