"""``KubeApi``: every Kubernetes call this project makes, as one typed interface.

The real accessor (``kube.client.Kube``) and the offline fake (``tests/helpers/fake_kube``)
both satisfy it, so activities and the watcher are written and tested against the same
surface.  Each method is one API request (an exec is one stream): it returns typed views
(``kube.objects``) or raw custom-object bodies, and raises only ``kube.errors`` types.
The rules built on top of these calls (UID-bound member operations, Events) live in
``kube.members`` and ``kube.events``, once, for both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kube.objects import EndpointSlice, Pod, Service, Workload


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one bounded exec: stdout, or why there is none (``error``).

    ``exit_code`` is None when the stream reported none.
    """

    stdout: str = ""
    error: str = ""
    exit_code: int | None = None


class KubeApi(Protocol):
    """The Kubernetes operations of llm-retire, on one cluster."""

    # ModelDeployments (raw bodies: parse them with kube.deployment.parse_deployment)
    def get_deployment(self, *, namespace: str, name: str) -> dict[str, Any]:
        """Read one ModelDeployment."""
        ...

    def list_deployments(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every ModelDeployment of ``namespace`` (None: of every namespace)."""
        ...

    def patch_deployment(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch a ModelDeployment; a ``metadata.resourceVersion`` in ``patch`` is a
        precondition (Conflict when stale)."""
        ...

    def patch_deployment_status(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch the status subresource; returns the object."""
        ...

    # Pods
    def list_pods(self, *, namespace: str, selector: str) -> list[Pod]:
        """The Pods of ``namespace`` matching the label ``selector``."""
        ...

    def read_pod(self, *, namespace: str, name: str) -> Pod:
        """Read one Pod."""
        ...

    def patch_pod(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> Pod:
        """Apply a JSON patch (RFC 6902); a failed ``test`` op is Invalid (HTTP 422)."""
        ...

    def delete_pod(self, *, namespace: str, name: str, uid: str) -> None:
        """Delete a Pod only if it has ``uid`` (Conflict otherwise)."""
        ...

    def exec_pod(
        self,
        *,
        namespace: str,
        name: str,
        container: str,
        argv: list[str],
        timeout_s: float,
        output_cap: int,
        tick: Callable[[], None] | None = None,
    ) -> ExecResult:
        """Run ``argv`` in a container, bounded in time and output; never raises (but what
        ``tick`` raises).  ``tick``: called at least once a second while the exec waits for
        output (a long exec heartbeats its activity through it)."""
        ...

    # Services and EndpointSlices
    def list_services(self, *, namespace: str) -> list[Service]:
        """Every Service of ``namespace``."""
        ...

    def list_endpoint_slices(self, *, namespace: str, service: str) -> list[EndpointSlice]:
        """The EndpointSlices of one Service."""
        ...

    def list_namespace_endpoint_slices(self, *, namespace: str) -> list[EndpointSlice]:
        """Every EndpointSlice of ``namespace``, whichever Service (or none) owns it."""
        ...

    # Kueue Workloads
    def get_workload(self, *, namespace: str, name: str) -> Workload:
        """Read one Workload."""
        ...

    def list_workloads(self, *, namespace: str) -> list[Workload]:
        """Every Workload of ``namespace`` (NotFound: Kueue is not installed)."""
        ...

    def delete_workload(self, *, namespace: str, name: str, uid: str) -> None:
        """Delete a Workload only if it has ``uid`` (Conflict otherwise)."""
        ...

    # Events
    def create_event(self, *, namespace: str, event: dict[str, Any]) -> None:
        """Create a core/v1 Event (Conflict when one of that name exists)."""
        ...
