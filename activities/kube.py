"""The Kubernetes context the activities share, and how API errors map to retry policy.

A 404, 409 or 422 is a fact about the world that retrying cannot change: it becomes a
non-retryable ``ApplicationError`` whose type the workflow names.  Anything else (5xx,
connection refused, timeouts) is raised as is and retried by the activity's policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NoReturn

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from temporalio.exceptions import ApplicationError

_NON_RETRYABLE = {404: "NotFound", 409: "Conflict", 422: "Invalid", 400: "Invalid"}


@dataclass(frozen=True)
class Kube:
    """API clients for one cluster."""

    api: client.ApiClient

    @classmethod
    def from_config(cls, *, kubeconfig: str | None = None) -> Kube:
        """From a kubeconfig file, or in-cluster configuration when none is given."""
        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
        cfg.proxy = None
        return cls(api=client.ApiClient(cfg))

    @property
    def core(self) -> client.CoreV1Api:
        """core/v1."""
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        """Custom resources."""
        return client.CustomObjectsApi(self.api)

    @property
    def discovery(self) -> client.DiscoveryV1Api:
        """discovery.k8s.io/v1 (EndpointSlices)."""
        return client.DiscoveryV1Api(self.api)


def raise_api_error(e: ApiException, what: str) -> NoReturn:
    """Re-raise an API error as non-retryable where retrying cannot help."""
    kind = _NON_RETRYABLE.get(int(e.status or 0))
    if kind is not None:
        raise ApplicationError(f"{what}: HTTP {e.status} {e.reason}", type=kind,
                               non_retryable=True) from e
    raise e


def status_of(e: Exception) -> int:
    """The HTTP status of an API error (0 when it is not one)."""
    return int(getattr(e, "status", 0) or 0)
