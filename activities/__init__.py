"""The retirement's activities: each bounded, idempotent, heartbeating where it polls.

``RetirementActivities(kube)`` binds them to one cluster (any ``kube.KubeApi``: the real
``kube.Kube``, or the offline fake); register ``RetirementActivities(...).all()`` on a
worker with a thread-pool activity executor (the Kubernetes client is synchronous).  A
classified Kubernetes error leaves every activity as an ``ApplicationError`` whose type
the workflow's retry policies name (``activities.errors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from temporalio import activity

from activities import bodies as _bodies
from activities.fairslots import WorkerSlots
from kube.api import KubeApi
from kube.client import Kube
from retirement.models import (
    Admission,
    AdmitInput,
    DeleteResult,
    Observation,
    PhaseInput,
    PublishInput,
    RestoreResult,
)

# ``Kube`` stays importable from here for the bed tests, the demo and the benchmark.
__all__ = ["Kube", "RetirementActivities"]


class RetirementActivities:
    """The activities of RetirementWorkflow, bound to one cluster.  Each method is the
    activity's registration only; its body is in ``activities.bodies``."""

    def __init__(
        self,
        kube: KubeApi,
        *,
        router_transport: httpx.BaseTransport | None = None,
        slots: WorkerSlots | None = None,
    ) -> None:
        self._kube = kube
        #: The HTTP transport of every router call (None: the network; tests answer offline).
        self._router_transport = router_transport
        #: The worker's exec and poll slots (None: the process's default pools).
        self._slots = slots

    @activity.defn(name="admit")
    def admit(self, inp: AdmitInput) -> Admission:
        """Bind the target or refuse (reads only)."""
        return _bodies.admit(self._kube, inp)

    @activity.defn(name="disqualify")
    def disqualify(self, inp: PhaseInput) -> Observation:
        """Remove the eligibility label from the admitted members."""
        return _bodies.disqualify(self._kube, inp)

    @activity.defn(name="withdraw")
    def withdraw(self, inp: PhaseInput) -> Observation:
        """Poll Services and routers until the target is withdrawn."""
        return _bodies.withdraw(self._kube, inp, self._router_transport, self._slots)

    @activity.defn(name="drain")
    def drain(self, inp: PhaseInput) -> Observation:
        """Poll the measured members until drained."""
        return _bodies.drain(self._kube, inp, self._slots)

    @activity.defn(name="delete")
    def delete(self, inp: PhaseInput) -> DeleteResult:
        """Confirm everything once more, then delete the admitted Pods (UID preconditions)
        and the Workload if it is theirs; or refuse, touching nothing."""
        return _bodies.delete(self._kube, inp, self._router_transport, self._slots)

    @activity.defn(name="settle")
    def settle(self, inp: PhaseInput) -> Observation:
        """Poll until the Pods are gone and the capacity released."""
        return _bodies.settle(self._kube, inp, self._slots)

    @activity.defn(name="restore")
    def restore(self, inp: PhaseInput) -> RestoreResult:
        """Put the label back on members that still qualify, and every router's selection of
        them (read back, with the Services'), until decided or the deadline."""
        return _bodies.restore(self._kube, inp, self._router_transport, self._slots)

    @activity.defn(name="publish")
    def publish(self, inp: PublishInput) -> None:
        """Mirror the state on the ModelDeployment, with an Event."""
        _bodies.publish(self._kube, inp)

    def all(self) -> list[Callable[..., Any]]:
        """Every activity, for a Worker."""
        return [
            self.admit,
            self.disqualify,
            self.withdraw,
            self.drain,
            self.delete,
            self.settle,
            self.restore,
            self.publish,
        ]
