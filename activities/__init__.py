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

from activities import admit as _admit
from activities import deletion as _deletion
from activities import drain as _drain
from activities import labels as _labels
from activities import publish as _publish
from activities import restore as _restore
from activities import withdrawal as _withdrawal
from activities.errors import application_errors
from activities.fencing import held
from activities.polling import poll_until
from activities.routers import TIMEOUT_S as ROUTER_TIMEOUT_S
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
from retirement.phases import Verdict

#: Errors the delete retries although they are final elsewhere: past the point of no return
#: the deletes must finish, and RBAC without ``pods delete`` is mended by a person (the
#: attempt's failure says so in the UI meanwhile).
FORBIDDEN_RETRIED = frozenset({"Forbidden"})

# ``Kube`` stays importable from here for the bed tests, the demo and the benchmark.
__all__ = ["Kube", "RetirementActivities"]


class RetirementActivities:
    """The activities of RetirementWorkflow, bound to one cluster."""

    def __init__(
        self, kube: KubeApi, *, router_transport: httpx.BaseTransport | None = None
    ) -> None:
        self._kube = kube
        #: The HTTP transport of every router call (None: the network; tests answer offline).
        self._router_transport = router_transport

    @activity.defn(name="admit")
    def admit(self, inp: AdmitInput) -> Admission:
        """Bind the target or refuse (reads only)."""
        with application_errors():
            return _admit.admit(self._kube, inp)

    @activity.defn(name="disqualify")
    def disqualify(self, inp: PhaseInput) -> Observation:
        """Remove the eligibility label from the admitted members."""
        with application_errors(), held():
            return _labels.disqualify(self._kube, inp.target)

    @activity.defn(name="withdraw")
    def withdraw(self, inp: PhaseInput) -> Observation:
        """Poll Services and routers until the target is withdrawn."""
        with application_errors(), held():
            return _withdrawal.withdraw(self._kube, inp, transport=self._router_transport)

    @activity.defn(name="drain")
    def drain(self, inp: PhaseInput) -> Observation:
        """Poll the measured members until drained."""
        with application_errors(), held():
            return _drain.drain(self._kube, inp)

    @activity.defn(name="delete")
    def delete(self, inp: PhaseInput) -> DeleteResult:
        """Confirm everything once more, then delete the admitted Pods (UID preconditions)
        and the Workload if it is theirs; or refuse, touching nothing."""
        with application_errors(retryable=FORBIDDEN_RETRIED), held():
            return _deletion.delete(
                self._kube,
                inp,
                retried=activity.info().attempt > 1,
                transport=self._router_transport,
            )

    @activity.defn(name="settle")
    def settle(self, inp: PhaseInput) -> Observation:
        """Poll until the Pods are gone and the capacity released."""
        with application_errors(), held():
            return _deletion.settle(self._kube, inp)

    @activity.defn(name="restore")
    def restore(self, inp: PhaseInput) -> RestoreResult:
        """Put the label back on members that still qualify, and every router's selection of
        them (read back, with the Services'), until decided or the deadline."""
        state = [RestoreResult()]
        asked: dict[str, tuple[float, str]] = {}
        since: dict[str, float] = {}

        # Always at least one whole pass, however late the attempt starts (past its
        # deadline: one pass, then it ends): a late attempt that did nothing would read as
        # every member back.  What it could not confirm is reported held.
        with (
            application_errors(),
            held(),
            httpx.Client(
                trust_env=False, timeout=ROUTER_TIMEOUT_S, transport=self._router_transport
            ) as http,
        ):

            def once() -> Observation:
                state[0] = _restore.restore_once(
                    self._kube,
                    inp.target,
                    state[0],
                    http=http,
                    removals=inp.router_removals,
                    asked=asked,
                    since=since,
                )
                waiting = state[0].held
                return Observation(
                    verdict=Verdict.UNKNOWN if waiting else Verdict.VERIFIED,
                    reason="; ".join(f"{k}: {v}" for k, v in waiting.items()),
                )

            poll_until(
                deadline=inp.deadline,
                interval=inp.poll_interval_s,
                once=once,
                tenant=inp.target.namespace,
            )
        return state[0]

    @activity.defn(name="publish")
    def publish(self, inp: PublishInput) -> None:
        """Mirror the state on the ModelDeployment, with an Event."""
        with application_errors():
            _publish.publish(self._kube, inp)

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
