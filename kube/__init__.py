"""The one Kubernetes layer of llm-retire, shared by the activities and the watcher.

- ``kube.api``: ``KubeApi``, every call the project makes, as one typed interface;
- ``kube.client``: ``Kube``, the real accessor (kubeconfig or in-cluster, timeouts);
- ``kube.errors``: API errors classified once (``NotFound``, ``Conflict``, ``Invalid``,
  ``Forbidden``, ``Expired``, ``Unavailable``);
- ``kube.objects``: typed views of Pods, Services, EndpointSlices, Workloads; ``pod_ready``;
- ``kube.deployment``: the typed ModelDeployment view, rejecting malformed objects;
- ``kube.members``: UID-bound member operations (read, eligibility label, delete);
- ``kube.events``: Events, posted once each;
- ``kube.watching``: raw list and watch streams (the watcher's informers).
"""

from __future__ import annotations

from kube.api import ExecResult, KubeApi
from kube.client import Kube
from kube.deployment import MalformedDeployment, ModelDeployment, Role, parse_deployment
from kube.errors import (
    Conflict,
    Expired,
    Forbidden,
    Invalid,
    KubeError,
    NotFound,
    Unavailable,
)
from kube.objects import Pod, pod_ready

__all__ = [
    "Conflict",
    "ExecResult",
    "Expired",
    "Forbidden",
    "Invalid",
    "Kube",
    "KubeApi",
    "KubeError",
    "MalformedDeployment",
    "ModelDeployment",
    "NotFound",
    "Pod",
    "Role",
    "Unavailable",
    "parse_deployment",
    "pod_ready",
]
