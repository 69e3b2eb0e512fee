"""The kubelet's part in a graceful Pod deletion on the bed, for the stand-in operator's
emulated engines (test support, never the product).

kwok runs no containers, so nothing on the bed would run a preStop hook, send SIGTERM or
SIGKILL, or remove a terminating Pod once its container has stopped. This module does it
for the member Pods whose engine the stand-in operator emulates:

- :class:`PodTermination` puts a preStop sleep and a termination grace period on the
  Pods the operator creates (what the gpustack operator sets: settle 5 s, grace 30 s);
- :class:`EmulatedKubelet` sees a Pod with a ``deletionTimestamp`` (a deletion with a
  grace period above 0: the API server keeps such a Pod, and EndpointSlices and routers
  see it terminating), reads its preStop sleep and ``deletionGracePeriodSeconds``, and
  has the hub run the termination (:mod:`testbed.emulator.termination`: preStop, SIGTERM
  handled the real engine's way, SIGKILL at the end). Once the emulated process has
  exited it removes the Pod (grace 0, UID precondition), as the kubelet does when the
  Pod's containers have stopped.

kwok's pod-delete stage (``testbed/kwok/pod-delete.yaml``) removes a terminating Pod at
its ``deletionTimestamp`` (the end of the grace period) if nothing removed it sooner.
A Pod deleted with grace 0 is gone from the API at once; the operator then stops its
emulator at once, as before.
"""

from __future__ import annotations

import contextlib
import logging
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from retirement.names import ENGINE_CONTAINER

__all__ = [
    "EmulatedKubelet",
    "PodTermination",
    "prestop_sleep_seconds",
]

log = logging.getLogger(__name__)

HubCall = Callable[[str, str, "dict[str, Any] | None"], Any]
"""The emulator hub's control API: ``hub(method, path, body)`` -> the decoded answer."""


@dataclass(frozen=True)
class PodTermination:
    """What a Pod spec says about its end: a preStop sleep and the grace period."""

    prestop_seconds: int = 5
    grace_seconds: int = 30

    def apply(self, pod: client.V1Pod) -> None:
        """Put the grace period and the ``main`` container's preStop sleep on ``pod``."""
        pod.spec.termination_grace_period_seconds = self.grace_seconds
        for container in pod.spec.containers:
            if container.name == ENGINE_CONTAINER:
                container.lifecycle = self.lifecycle()

    def lifecycle(self) -> client.V1Lifecycle | None:
        """The ``main`` container's lifecycle: a preStop sleep action (none for 0 s)."""
        if self.prestop_seconds <= 0:
            return None
        return client.V1Lifecycle(
            pre_stop=client.V1LifecycleHandler(
                sleep=client.V1SleepAction(seconds=self.prestop_seconds)
            )
        )


def prestop_sleep_seconds(pod: client.V1Pod) -> float:
    """The preStop sleep of the Pod's ``main`` container: a ``sleep`` action, or an
    ``exec`` of ``sleep N`` (directly or through ``sh -c``); 0 without one."""
    for container in pod.spec.containers or []:
        if container.name != ENGINE_CONTAINER or container.lifecycle is None:
            continue
        hook = container.lifecycle.pre_stop
        if hook is None:
            return 0.0
        if hook.sleep is not None:
            return float(hook.sleep.seconds)
        action = hook.var_exec  # the client's name for the handler's ``exec``
        if action is not None and action.command:
            argv = list(action.command)
            if len(argv) == 3 and argv[0].endswith("sh") and argv[1] == "-c":
                argv = shlex.split(argv[2])
            if len(argv) == 2 and argv[0].rsplit("/", 1)[-1] == "sleep":
                with contextlib.suppress(ValueError):
                    return max(0.0, float(argv[1]))
    return 0.0


@dataclass
class EmulatedKubelet:
    """Runs the termination of each terminating Pod that has an emulated engine.

    Level-based, called from the stand-in operator's reconcile pass: the first call for a
    Pod starts its termination in the hub; later calls remove the Pod once the emulated
    process has exited.
    """

    _started: set[str] = field(default_factory=set)  # Pod UIDs
    _removed: set[str] = field(default_factory=set)

    def observe(
        self, core: client.CoreV1Api, hub: HubCall, pod: client.V1Pod, hub_name: str
    ) -> None:
        """One look at a terminating Pod whose engine is the hub's ``hub_name``. A failed
        call is logged and tried again at the next look."""
        try:
            self._observe(core, hub, pod, hub_name)
        except (OSError, ApiException) as exc:
            log.warning("emulated kubelet: %s: %s", pod.metadata.name, exc)

    def _observe(
        self, core: client.CoreV1Api, hub: HubCall, pod: client.V1Pod, hub_name: str
    ) -> None:
        uid = pod.metadata.uid
        if uid in self._removed:
            return
        if uid not in self._started:
            grace = float(pod.metadata.deletion_grace_period_seconds or 0)
            body = {"prestop_seconds": prestop_sleep_seconds(pod), "grace_seconds": grace}
            hub("POST", f"/pods/{hub_name}/terminate", body)
            self._started.add(uid)
            return
        status = hub("GET", f"/pods/{hub_name}", None)
        if status.get("state") != "stopped":
            return
        try:
            core.delete_namespaced_pod(
                pod.metadata.name,
                pod.metadata.namespace,
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
                ),
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise
        self._removed.add(uid)
        log.info(
            "emulated kubelet: %s exited (%s), Pod removed",
            pod.metadata.name,
            (status.get("termination") or {}).get("exit"),
        )
