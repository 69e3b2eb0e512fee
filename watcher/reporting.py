"""How the watcher tells of a deployment it could not reconcile, and its Events.

Whatever one deployment's reconcile raises is logged and counted
(``retire_watcher_reconcile_errors_total{error}``) and, unless it is the API server or
Temporal being unreachable (no fact about the deployment), posted as a ``ReconcileFailed``
Warning Event on the ModelDeployment, once per distinct message; a ModelDeployment that
cannot be read gets one ``DeploymentInvalid`` Event per reason (``Failures``).  Every Event
of the watcher is posted once per key (``watch_event``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from kube.api import KubeApi
from kube.deployment import MalformedDeployment, parse_deployment
from kube.errors import KubeError
from kube.events import MESSAGE_CAP, post_event
from kube.objects import ObjectRef
from retirement.names import GROUP, KIND, VERSION
from watcher.fleet import Key
from watcher.metrics import WatcherMetrics
from watcher.retirements import TemporalError, error_name

log = logging.getLogger("retire-watcher")


def watch_event(
    kube: KubeApi, about: ObjectRef, reason: str, message: str, key: str, *, warning: bool = False
) -> bool:
    """Post the Event once; False when it had already been posted."""
    return post_event(
        kube,
        about=about,
        tag="watch",
        key=f"{reason}|{key}",
        reason=reason,
        message=message,
        warning=warning or "Invalid" in reason,
    )


@dataclass
class Failures:
    """The failures of deployments: logged, counted, posted once per distinct message."""

    kube: KubeApi
    metrics: WatcherMetrics
    #: Per deployment, the failure message last posted as an Event (posted once each).
    _posted: dict[Key, str] = field(default_factory=dict, init=False, repr=False)

    def forget(self, key: Key) -> None:
        """The deployment was reconciled (or is gone): a failure of it is news again."""
        self._posted.pop(key, None)

    def failed(self, about: ObjectRef | None, e: Exception) -> bool:
        """Log and count a deployment whose reconcile raised ``e``; post it as a Warning
        Event once per distinct message, unless the API server or Temporal was merely
        unreachable (that is no fact about the deployment).  Returns whether it was."""
        transient = unreachable(e)
        self.metrics.reconcile_errors.labels(error=error_name(e)).inc()
        where = f"{about.namespace}/{about.name}" if about is not None else "?"
        expected = isinstance(e, KubeError | TemporalError)
        log.warning(
            "reconcile %s failed: %s: %s",
            where,
            error_name(e),
            e,
            exc_info=None if expected else e,
        )
        if transient or about is None or not about.name or not about.namespace:
            return transient
        message = f"not reconciled: {error_name(e)}: {one_line(e)}"[:MESSAGE_CAP]
        key = (about.namespace, about.name)
        if self._posted.get(key) == message:
            return transient
        try:
            watch_event(self.kube, about, "ReconcileFailed", message, message, warning=True)
        except KubeError as err:
            log.warning("event for %s: %s", where, err)
            return transient
        self._posted[key] = message
        return transient

    def malformed(self, e: MalformedDeployment) -> None:
        """Touch nothing of a deployment that cannot be read; say why, once per reason."""
        if not e.name or not e.namespace:
            log.warning("%s: skipped", e)
            return
        key = (e.namespace, e.name)
        if self._posted.get(key) == e.reason:
            return
        log.warning("%s: skipped", e)
        about = ObjectRef(
            api_version=f"{GROUP}/{VERSION}",
            kind=KIND,
            namespace=e.namespace,
            name=e.name,
            uid=e.uid,
        )
        try:
            watch_event(
                self.kube, about, "DeploymentInvalid", f"not reconciled: {e.reason}", e.reason
            )
        except KubeError as err:
            log.warning("event for %s/%s: %s", e.namespace, e.name, err)
            return
        self._posted[key] = e.reason


def unreachable(e: Exception) -> bool:
    """Whether ``e`` says the API server or Temporal could not be reached (retry later)."""
    if isinstance(e, KubeError):
        return e.retryable
    if isinstance(e, TemporalError):
        return e.retryable
    return isinstance(e, ConnectionError | TimeoutError)


def one_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return validation_text(e)
    return " ".join(str(e).split()) or type(e).__name__


def validation_text(e: ValidationError) -> str:
    """A pydantic error on one line: ``field: message`` per error."""
    return "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or 'value'}: {err['msg']}" for err in e.errors()
    )


def ref_of(key: Key) -> ObjectRef:
    """The ModelDeployment ``key`` as an Event's object (the UID is optional)."""
    return ObjectRef(
        api_version=f"{GROUP}/{VERSION}", kind=KIND, namespace=key[0], name=key[1], uid=""
    )


def unkeyed(raw: Any) -> MalformedDeployment:
    """Why a listed object cannot even be keyed (no namespace or name)."""
    try:
        parse_deployment(raw)
    except MalformedDeployment as e:
        return e
    except Exception as e:
        return MalformedDeployment(f"cannot be decoded: {type(e).__name__}")
    return MalformedDeployment("metadata.namespace is missing")
