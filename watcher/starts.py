"""Starting the next retirement of a deployment, and remembering refused intents.

The first derived intent that is not backing off after a refusal (``watcher.refusals``)
is started, after one GET that the API server's spec still declares it (the cache may lag
behind a scale back up).  An intent that cannot even be requested (a hostile ordinal
label) is refused here with an ``IntentInvalid`` Warning Event.  Temporal's refusal of a
second start for the same workflow ID is the one-at-a-time rule: the intent stays
pending, and the deployment is looked at again at once to read what runs.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass

from pydantic import ValidationError

from kube.api import KubeApi
from kube.deployment import ModelDeployment, parse_deployment
from kube.errors import KubeError, NotFound
from kube.objects import Pod
from retirement.intents import Intent, RoleSpec, derive_intents, view_of
from retirement.models import RetirementRequest, workflow_id_for
from watcher.fleet import Key
from watcher.labels import Active
from watcher.metrics import WatcherMetrics
from watcher.refusals import RefusalKey, Refusals, depends_on
from watcher.reporting import validation_text, watch_event
from watcher.retirements import AlreadyRunning, Retirements
from watcher.running import RunningSet
from watcher.settings import WatcherSettings

log = logging.getLogger("retire-watcher")


@dataclass
class Starts:
    """Starts retirements and records refusals, for the reconciler."""

    kube: KubeApi
    retirements: Retirements
    running: RunningSet
    metrics: WatcherMetrics
    settings: WatcherSettings
    refusals: Refusals
    #: Deployments to reconcile again at once (the reconciler's; a start was refused).
    look_again: set[Key]

    def refuse(self, key: RefusalKey, on: Hashable, reason: str, *, metric: str) -> None:
        """Remember a refusal of ``key`` and back off (doubling while it recurs)."""
        backoff = self.refusals.refuse(key, on, reason).backoff_s
        self.metrics.refused.labels(reason=metric).inc()
        ns, name, role, ordinal = key
        log.info(
            "%s/%s: %s:%d refused (%s): not tried again for %.0f s unless it changes",
            ns,
            name,
            role,
            ordinal,
            reason,
            backoff,
        )

    async def start_next(
        self, md: ModelDeployment, pods: list[Pod], intents: list[Intent]
    ) -> Active | None:
        """Start the first intent that is not backing off after a refusal."""
        for intent in intents:
            key: RefusalKey = (md.namespace, md.name, intent.role, intent.ordinal)
            on = depends_on(md, pods, intent.kind, intent.role, intent.ordinal, intent.members)
            if self.refusals.holds_back(key, on):
                continue
            try:
                req = self._request(md, intent)
            except ValidationError as e:
                reason = (
                    f"{intent.kind} {intent.role}:{intent.ordinal} cannot be requested: "
                    f"{validation_text(e)}"
                )
                self.refuse(key, on, reason, metric="invalid-request")
                try:
                    watch_event(
                        self.kube,
                        md.ref,
                        "IntentInvalid",
                        reason,
                        f"{intent.role}:{intent.ordinal}",
                        warning=True,
                    )
                except KubeError as err:
                    log.warning("event for %s/%s: %s", md.namespace, md.name, err)
                continue
            if not self._still_declared(md, pods, intent):
                return None  # the watch event of the change reconciles it again
            return await self._start(req, intent)
        return None

    def _still_declared(self, md: ModelDeployment, pods: list[Pod], intent: Intent) -> bool:
        """Whether the ModelDeployment as the API server has it now still declares
        ``intent`` (one GET before a start): the cache may lag behind a scale back up,
        e.g. after the watcher was paused, and a retirement started on a spec already
        rewritten would be refused at admission, but it should not start at all."""
        try:
            raw = self.kube.get_deployment(namespace=md.namespace, name=md.name)
        except NotFound:
            return False
        fresh = parse_deployment(raw)  # MalformedDeployment: the pass reports it
        if fresh.uid != md.uid:
            return False
        if fresh.resource_version and fresh.resource_version == md.resource_version:
            return True
        roles = [RoleSpec(name=r.name, replicas=r.replicas, size=r.size) for r in fresh.roles]
        same = (intent.kind, intent.role, intent.ordinal, tuple(intent.members))
        return any(
            (i.kind, i.role, i.ordinal, tuple(i.members)) == same
            for i in derive_intents(roles, [view_of(p) for p in pods])
        )

    def _request(self, md: ModelDeployment, intent: Intent) -> RetirementRequest:
        return RetirementRequest(
            namespace=md.namespace,
            deployment=md.name,
            role=intent.role,
            ordinal=intent.ordinal,
            intent=intent.kind,
            members=list(intent.members),
            budgets=self.settings.budgets,
            routerless_policy=self.settings.routerless_policy,
            quiet_window_s=self.settings.quiet_window_s,
            # The role:ordinal's last consumed token, from any earlier retirement.
            last_consumed_retry_token=md.consumed_token(intent.role, intent.ordinal),
        )

    async def _start(self, req: RetirementRequest, intent: Intent) -> Active | None:
        wid = workflow_id_for(namespace=req.namespace, deployment=req.deployment)
        key = (req.namespace, req.deployment)
        try:
            await self.retirements.start(req, workflow_id=wid, task_queue=self.settings.task_queue)
        except AlreadyRunning:
            self.running.started(key, wid)  # the next reconcile reads it
            self.look_again.add(key)
            self.metrics.refused.labels(reason="already-running").inc()
            log.info(
                "%s: a retirement is already running; %s %s:%d stays pending",
                wid,
                intent.kind,
                intent.role,
                intent.ordinal,
            )
            return Active(role="", ordinal=-1, unknown=True)
        self.running.started(key, wid)
        self.metrics.started.inc()
        log.info(
            "%s: started retirement of %s %s:%d", wid, intent.kind, intent.role, intent.ordinal
        )
        return Active(role=req.role, ordinal=req.ordinal)
