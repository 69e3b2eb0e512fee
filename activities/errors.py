"""How a classified Kubernetes error leaves an activity: as a Temporal ``ApplicationError``
whose type the workflow's retry policies name.

A NotFound, Conflict, Invalid or Forbidden is a fact about the world (or the RBAC) that
retrying cannot change: non-retryable.  An Unavailable API server (or an expired watch
version) may answer later: retryable, under the activity's policy.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from contextlib import contextmanager

from temporalio.exceptions import ApplicationError

from kube.errors import KubeError


def application_error(error: KubeError, *, retryable: Collection[str] = ()) -> ApplicationError:
    """The ``ApplicationError`` for ``error`` (its type: the error's class name);
    ``retryable``: the kinds this activity retries even though they are final elsewhere."""
    kind = type(error).__name__
    return ApplicationError(
        str(error), type=kind, non_retryable=not (error.retryable or kind in retryable)
    )


@contextmanager
def application_errors(*, retryable: Collection[str] = ()) -> Iterator[None]:
    """Run an activity body, re-raising a ``KubeError`` as its ``ApplicationError``."""
    try:
        yield
    except KubeError as e:
        raise application_error(e, retryable=retryable) from e
