"""One level-based reconcile pass of the watcher over every ModelDeployment.

Each pass derives the complete set of intents from the live state, so a missed event, a
crash or a restart loses nothing.  Per deployment it:

1. delivers a valid ``retirement-retry`` annotation to the running retirement (then clears
   it); a malformed one gets a Warning Event and has no other effect;
2. tells a running retirement whose ordinal the spec re-declares to end (cancel-intent);
3. starts the retirement of the first intent; Temporal's refusal of a second start for the
   same workflow ID is the one-at-a-time rule, and the intent stays pending;
4. maintains the eligibility label: a Ready serving member that is not named by an active
   retirement gets it, a member that should not serve loses it; this also repairs orphans
   (members left disqualified by a terminated workflow).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from kube.api import KubeApi
from kube.deployment import MalformedDeployment, ModelDeployment, parse_deployment
from kube.errors import KubeError
from kube.events import post_event
from kube.members import LabelChange, set_eligibility
from kube.objects import ObjectRef, Pod, pod_ready
from retirement.budgets import Budgets
from retirement.intents import Intent, PodView, RoleSpec, derive_intents
from retirement.models import (
    CancelIntent,
    IntentKind,
    RetirementRequest,
    RetirementState,
    RetryRequest,
    RouterlessPolicy,
    workflow_id_for,
)
from retirement.names import (
    ANNOTATION_RETRY,
    APP_NAME,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_ORDINAL,
    VERSION,
)
from retirement.phases import Outcome
from retirement.retry import parse_retry_annotation
from retirement.shape import MemberPod, read_shape, select_members
from watcher.metrics import WatcherMetrics
from workflows.retirement import RetirementWorkflow, initial_search_attributes

log = logging.getLogger("retire-watcher")


@dataclass(frozen=True)
class WatcherSettings:
    """What every retirement the watcher starts is given."""

    task_queue: str = "retirement"
    budgets: Budgets = field(default_factory=Budgets)
    routerless_policy: RouterlessPolicy = RouterlessPolicy.HOLD
    quiet_window_s: float = 10.0


@dataclass
class Reconciler:
    """The watcher's reconcile logic over one cluster and one Temporal namespace."""

    kube: KubeApi
    temporal: Client
    settings: WatcherSettings
    metrics: WatcherMetrics
    namespaces: list[str] | None = None  # None: every namespace

    async def reconcile_all(self) -> None:
        """One pass over every ModelDeployment (a malformed one is reported and skipped)."""
        with self.metrics.reconcile_seconds.time():
            for raw in self._deployments():
                try:
                    md = parse_deployment(raw)
                except MalformedDeployment as e:
                    self._malformed(e)
                    continue
                try:
                    await self.reconcile(md)
                except (KubeError, RPCError) as e:
                    log.warning("reconcile %s/%s: %s", md.namespace, md.name, e)

    def _deployments(self) -> list[dict[str, Any]]:
        if self.namespaces is None:
            return self.kube.list_deployments()
        out: list[dict[str, Any]] = []
        for ns in self.namespaces:
            out += self.kube.list_deployments(namespace=ns)
        return out

    def _malformed(self, e: MalformedDeployment) -> None:
        """Touch nothing of a deployment that cannot be read; say why, once per reason."""
        log.warning("%s: skipped", e)
        if not e.name or not e.namespace:
            return
        about = ObjectRef(
            api_version=f"{GROUP}/{VERSION}",
            kind=KIND,
            namespace=e.namespace,
            name=e.name,
            uid=e.uid,
        )
        try:
            self._event(about, "DeploymentInvalid", f"not reconciled: {e.reason}", e.reason)
        except KubeError as err:
            log.warning("event for %s/%s: %s", e.namespace, e.name, err)

    async def reconcile(self, md: ModelDeployment) -> None:
        """One pass over one deployment."""
        ns, name = md.namespace, md.name
        pods = self.kube.list_pods(
            namespace=ns, selector=f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={name}"
        )
        roles = [RoleSpec(name=r.name, replicas=r.replicas, size=r.size) for r in md.roles]
        intents = derive_intents(roles, [_view(p) for p in pods])
        self.metrics.intents_seen.inc(len(intents))
        wid = workflow_id_for(namespace=ns, deployment=name)
        state = await self._running_state(wid)
        await self._retry_annotation(md, state)
        if state is not None:
            await self._cancel_if_redeclared(wid, state, roles)
        if intents and state is None:
            state = await self._start(ns, name, intents[0])
        self.metrics.pending.labels(deployment=f"{ns}/{name}").set(
            max(0, len(intents) - (1 if state is not None else 0))
        )
        self._maintain_eligibility(md, pods, state)

    # ------------------------------------------------------------ Temporal

    async def _running_state(self, wid: str) -> RetirementState | None:
        handle = self.temporal.get_workflow_handle(wid)
        try:
            desc = await handle.describe()
        except RPCError as e:
            if e.status is RPCStatusCode.NOT_FOUND:
                return None
            raise
        if desc.status is not WorkflowExecutionStatus.RUNNING:
            return None
        state: RetirementState = await handle.query(RetirementWorkflow.state)
        return state

    async def _start(self, ns: str, name: str, intent: Intent) -> RetirementState | None:
        req = RetirementRequest(
            namespace=ns,
            deployment=name,
            role=intent.role,
            ordinal=intent.ordinal,
            intent=intent.kind,
            members=list(intent.members),
            budgets=self.settings.budgets,
            routerless_policy=self.settings.routerless_policy,
            quiet_window_s=self.settings.quiet_window_s,
        )
        wid = workflow_id_for(namespace=ns, deployment=name)
        try:
            handle = await self.temporal.start_workflow(
                RetirementWorkflow.run,
                req,
                id=wid,
                task_queue=self.settings.task_queue,
                search_attributes=initial_search_attributes(req),
            )
        except WorkflowAlreadyStartedError:
            self.metrics.refused.labels(reason="already-running").inc()
            log.info(
                "%s: a retirement is already running; %s %s:%d stays pending",
                wid,
                intent.kind,
                intent.role,
                intent.ordinal,
            )
            return None
        self.metrics.started.inc()
        log.info(
            "%s: started retirement of %s %s:%d", wid, intent.kind, intent.role, intent.ordinal
        )
        state: RetirementState = await handle.query(RetirementWorkflow.state)
        return state

    async def _cancel_if_redeclared(
        self, wid: str, state: RetirementState, roles: list[RoleSpec]
    ) -> None:
        req = state.request
        if req.intent is not IntentKind.COUNT_TRIM or state.outcome not in (
            Outcome.RUNNING,
            Outcome.ABORTED,
        ):
            return
        role = next((r for r in roles if r.name == req.role), None)
        if role is not None and req.ordinal < role.replicas:
            await self.temporal.get_workflow_handle(wid).signal(
                RetirementWorkflow.cancel_intent,
                CancelIntent(reason=f"the spec re-declares {req.role} ordinal {req.ordinal}"),
            )
            log.info("%s: ordinal re-declared: cancel-intent sent", wid)

    async def _retry_annotation(self, md: ModelDeployment, state: RetirementState | None) -> None:
        value = md.annotations.get(ANNOTATION_RETRY)
        if value is None:
            return
        ns, name = md.namespace, md.name
        try:
            ann = parse_retry_annotation(value)
        except ValueError as e:
            self._event(md.ref, "RetryAnnotationInvalid", f"{ANNOTATION_RETRY}: {e}", value)
            return
        last = md.last_consumed_retry_token
        if state is None or (state.request.role, state.request.ordinal) != (ann.role, ann.ordinal):
            self._event(
                md.ref,
                "RetryAnnotationIgnored",
                f"no retirement of {ann.role}:{ann.ordinal} is running",
                value,
            )
        elif ann.token == last or ann.token == state.last_consumed_retry_token:
            log.info("%s/%s: retry token %s is a replay: ignored", ns, name, ann.token)
        else:
            res = await self.temporal.get_workflow_handle(
                workflow_id_for(namespace=ns, deployment=name)
            ).execute_update(RetirementWorkflow.retry, RetryRequest(token=ann.token))
            self._event(md.ref, "RetryDelivered", f"token {ann.token}: {res.decision}", value)
        self._clear_annotation(md)

    # ------------------------------------------------------------ Kubernetes

    def _clear_annotation(self, md: ModelDeployment) -> None:
        self.kube.patch_deployment(
            namespace=md.namespace,
            name=md.name,
            patch={
                "metadata": {
                    "annotations": {ANNOTATION_RETRY: None},
                    "resourceVersion": md.resource_version,
                }
            },
        )

    def _event(self, about: ObjectRef, reason: str, message: str, key: str) -> None:
        post_event(
            self.kube,
            about=about,
            tag="watch",
            key=f"{reason}|{key}",
            reason=reason,
            message=message,
            warning="Invalid" in reason,
        )

    def _maintain_eligibility(
        self, md: ModelDeployment, pods: list[Pod], state: RetirementState | None
    ) -> None:
        protected: set[str] = set()
        if state is not None:
            protected |= {m.uid for m in (state.target.members if state.target else [])}
            req = state.request
            protected |= {
                p.uid
                for p in pods
                if p.labels.get(LABEL_COMPONENT) == req.role
                and p.labels.get(LABEL_ORDINAL) == str(req.ordinal)
            }
        groups: dict[tuple[str, str], list[Pod]] = {}
        for p in pods:
            if not p.terminating:
                groups.setdefault(
                    (p.labels.get(LABEL_COMPONENT, ""), p.labels.get(LABEL_ORDINAL, "")), []
                ).append(p)
        for (role_name, _ordinal), members in groups.items():
            role = md.role(role_name)
            if role is None:
                continue  # a departed role: its retirement decides
            if len(members) != role.size:
                continue  # surplus or incomplete: undecidable now, touch nothing
            shape = read_shape(
                engine=md.engine.name,
                role_kind=role.kind,
                size=role.size,
                extra_args=role.extra_args,
                command=role.command,
            )
            sel = select_members(
                shape=shape,
                size=role.size,
                members=[MemberPod(name=p.name, uid=p.uid, labels=dict(p.labels)) for p in members],
            )
            if not sel.ok:
                continue
            for p in members:
                if p.uid in protected:
                    continue
                should = p.name in sel.measured and pod_ready(p) == "True"
                current = p.labels.get(LABEL_ELIGIBLE)
                if should != (current == "true"):
                    self._set_label(p, should, current)

    def _set_label(self, pod: Pod, on: bool, current: str | None) -> None:
        """Bound to the UID and the value just read; a Pod that changed meanwhile is left
        to the next pass."""
        change = set_eligibility(
            self.kube,
            namespace=pod.namespace,
            name=pod.name,
            uid=pod.uid,
            current=current,
            eligible=on,
        )
        if change is LabelChange.APPLIED:
            self.metrics.labels_set.labels(value="true" if on else "removed").inc()


def _view(p: Pod) -> PodView:
    return PodView(name=p.name, labels=dict(p.labels), terminating=p.terminating)
