"""Kubernetes API errors, classified once into the few kinds a caller decides on.

Every call of the layer raises one of these and nothing else, so no caller inspects an
HTTP status or a transport exception: a 404 is ``NotFound`` wherever it happens.  Only
``Unavailable`` (and ``Expired``, which a re-list mends) is worth retrying; the others are
facts about the world or about the request that a retry cannot change.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import urllib3.exceptions
from kubernetes.client.rest import ApiException

__all__ = [
    "Conflict",
    "Expired",
    "Forbidden",
    "Invalid",
    "KubeError",
    "NotFound",
    "Unavailable",
    "classify",
    "translated",
]

_DETAIL_CAP = 300


class KubeError(Exception):
    """A failed API call: what was attempted, the HTTP status (0: no answer) and why."""

    #: Whether trying the same call again later can succeed.
    retryable: ClassVar[bool] = False

    def __init__(self, what: str, *, status: int = 0, reason: str = "", detail: str = "") -> None:
        self.what, self.status, self.reason, self.detail = what, status, reason, detail
        head = f"{what}: HTTP {status} {reason}".rstrip() if status else f"{what}: {reason}"
        super().__init__(f"{head}: {detail}" if detail else head)


class NotFound(KubeError):
    """404: the object (or its kind) does not exist."""


class Conflict(KubeError):
    """409: a precondition failed (UID, resourceVersion) or the object already exists."""


class Invalid(KubeError):
    """400/422 and other 4xx: the server refused the request as written (a JSON-patch
    ``test`` that failed is one)."""


class Forbidden(KubeError):
    """401/403: not authenticated, or RBAC does not allow the call."""


class Expired(KubeError):
    """410 Gone: a watch's resourceVersion is too old; list again."""

    retryable = True


class Unavailable(KubeError):
    """5xx, 408, 429, no connection, a timeout: the server may answer later."""

    retryable = True


_BY_STATUS: dict[int, type[KubeError]] = {
    400: Invalid,
    401: Forbidden,
    403: Forbidden,
    404: NotFound,
    408: Unavailable,
    409: Conflict,
    410: Expired,
    422: Invalid,
    429: Unavailable,
}


def _status_class(status: int) -> type[KubeError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if 400 <= status < 500:
        return Invalid
    return Unavailable  # 5xx, or no HTTP status at all


def _detail(body: object) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, when the error carries one."""
    if not isinstance(body, str | bytes) or not body:
        return ""
    try:
        status = json.loads(body)
    except ValueError:
        return ""
    message = status.get("message") if isinstance(status, dict) else None
    return str(message)[:_DETAIL_CAP] if message else ""


def classify(error: BaseException, *, what: str) -> KubeError:
    """The typed error for an exception raised by the kubernetes client or its transport."""
    if isinstance(error, KubeError):
        return error
    if isinstance(error, ApiException):
        status = int(error.status or 0)
        return _status_class(status)(
            what, status=status, reason=str(error.reason or ""), detail=_detail(error.body)
        )
    # urllib3 errors (connection refused, read timeout, protocol) and OSError (socket,
    # TLS, TimeoutError): the server did not answer.
    return Unavailable(what, reason=f"{type(error).__name__}: {error}"[:_DETAIL_CAP])


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Run one API call, re-raising its failure as the classified ``KubeError``."""
    try:
        yield
    except (ApiException, urllib3.exceptions.HTTPError, OSError) as e:
        raise classify(e, what=what) from e
