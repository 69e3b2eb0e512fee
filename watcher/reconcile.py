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

import hashlib
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.kube import Kube
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
    FIELD_MANAGER,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_ORDINAL,
    PLURAL,
    VERSION,
)
from retirement.phases import Outcome
from retirement.retry import parse_retry_annotation
from retirement.shape import MemberPod, read_shape, select_members
from watcher.metrics import WatcherMetrics
from workflows.retirement import RetirementWorkflow, initial_search_attributes

log = logging.getLogger("retire-watcher")
_KEY = LABEL_ELIGIBLE.replace("/", "~1")


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

    kube: Kube
    temporal: Client
    settings: WatcherSettings
    metrics: WatcherMetrics
    namespaces: list[str] | None = None  # None: every namespace

    async def reconcile_all(self) -> None:
        """One pass over every ModelDeployment."""
        with self.metrics.reconcile_seconds.time():
            for md in self._deployments():
                try:
                    await self.reconcile(md)
                except (ApiException, RPCError) as e:
                    log.warning("reconcile %s/%s: %s", md["metadata"]["namespace"],
                                md["metadata"]["name"], e)

    def _deployments(self) -> list[dict[str, Any]]:
        if self.namespaces is None:
            items: list[dict[str, Any]] = self.kube.custom.list_cluster_custom_object(
                GROUP, VERSION, PLURAL)["items"]
            return items
        out: list[dict[str, Any]] = []
        for ns in self.namespaces:
            out += self.kube.custom.list_namespaced_custom_object(GROUP, VERSION, ns,
                                                                  PLURAL)["items"]
        return out

    async def reconcile(self, md: dict[str, Any]) -> None:
        """One pass over one deployment."""
        ns, name = md["metadata"]["namespace"], md["metadata"]["name"]
        pods = self.kube.core.list_namespaced_pod(
            ns, label_selector=f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={name}").items
        roles = [RoleSpec(name=str(r.get("name")), replicas=int(r.get("replicas", 0)),
                          size=int(r.get("size", 1)))
                 for r in (md.get("spec") or {}).get("roles") or []]
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
            max(0, len(intents) - (1 if state is not None else 0)))
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
            namespace=ns, deployment=name, role=intent.role, ordinal=intent.ordinal,
            intent=intent.kind, members=list(intent.members), budgets=self.settings.budgets,
            routerless_policy=self.settings.routerless_policy,
            quiet_window_s=self.settings.quiet_window_s)
        wid = workflow_id_for(namespace=ns, deployment=name)
        try:
            handle = await self.temporal.start_workflow(
                RetirementWorkflow.run, req, id=wid, task_queue=self.settings.task_queue,
                search_attributes=initial_search_attributes(req))
        except WorkflowAlreadyStartedError:
            self.metrics.refused.labels(reason="already-running").inc()
            log.info("%s: a retirement is already running; %s %s:%d stays pending", wid,
                     intent.kind, intent.role, intent.ordinal)
            return None
        self.metrics.started.inc()
        log.info("%s: started retirement of %s %s:%d", wid, intent.kind, intent.role,
                 intent.ordinal)
        state: RetirementState = await handle.query(RetirementWorkflow.state)
        return state

    async def _cancel_if_redeclared(self, wid: str, state: RetirementState,
                                    roles: list[RoleSpec]) -> None:
        req = state.request
        if req.intent is not IntentKind.COUNT_TRIM or state.outcome not in (
                Outcome.RUNNING, Outcome.ABORTED):
            return
        role = next((r for r in roles if r.name == req.role), None)
        if role is not None and req.ordinal < role.replicas:
            await self.temporal.get_workflow_handle(wid).signal(
                RetirementWorkflow.cancel_intent,
                CancelIntent(reason=f"the spec re-declares {req.role} ordinal {req.ordinal}"))
            log.info("%s: ordinal re-declared: cancel-intent sent", wid)

    async def _retry_annotation(self, md: dict[str, Any],
                                state: RetirementState | None) -> None:
        value = (md["metadata"].get("annotations") or {}).get(ANNOTATION_RETRY)
        if value is None:
            return
        ns, name = md["metadata"]["namespace"], md["metadata"]["name"]
        try:
            ann = parse_retry_annotation(value)
        except ValueError as e:
            self._event(md, "RetryAnnotationInvalid", f"{ANNOTATION_RETRY}: {e}", value)
            return
        last = ((md.get("status") or {}).get("retirement") or {}).get("lastConsumedRetryToken")
        if state is None or (state.request.role, state.request.ordinal) != (ann.role,
                                                                             ann.ordinal):
            self._event(md, "RetryAnnotationIgnored",
                        f"no retirement of {ann.role}:{ann.ordinal} is running", value)
        elif ann.token == last or ann.token == state.last_consumed_retry_token:
            log.info("%s/%s: retry token %s is a replay: ignored", ns, name, ann.token)
        else:
            res = await self.temporal.get_workflow_handle(
                workflow_id_for(namespace=ns, deployment=name)).execute_update(
                RetirementWorkflow.retry, RetryRequest(token=ann.token))
            self._event(md, "RetryDelivered", f"token {ann.token}: {res.decision}", value)
        self._clear_annotation(md)

    # ------------------------------------------------------------ Kubernetes

    def _clear_annotation(self, md: dict[str, Any]) -> None:
        self.kube.custom.patch_namespaced_custom_object(
            GROUP, VERSION, md["metadata"]["namespace"], PLURAL, md["metadata"]["name"],
            {"metadata": {"annotations": {ANNOTATION_RETRY: None},
                          "resourceVersion": md["metadata"]["resourceVersion"]}})

    def _event(self, md: dict[str, Any], reason: str, message: str, key: str) -> None:
        ns, name = md["metadata"]["namespace"], md["metadata"]["name"]
        digest = hashlib.sha256(f"{reason}|{key}".encode()).hexdigest()[:16]
        now = datetime.now(UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(name=f"{name}.watch-{digest}", namespace=ns),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind=KIND, name=name, namespace=ns,
                uid=md["metadata"].get("uid")),
            reason=reason, message=message[:1000], type="Warning" if "Invalid" in reason
            else "Normal", source=client.V1EventSource(component=FIELD_MANAGER),
            first_timestamp=now, last_timestamp=now, count=1)
        try:
            self.kube.core.create_namespaced_event(ns, event)
        except ApiException as e:
            if e.status != 409:  # already said
                raise

    def _maintain_eligibility(self, md: dict[str, Any], pods: list[client.V1Pod],
                              state: RetirementState | None) -> None:
        spec = md.get("spec") or {}
        engine = (spec.get("engine") or {}).get("name", "")
        protected: set[str] = set()
        if state is not None:
            protected |= {m.uid for m in (state.target.members if state.target else [])}
            req = state.request
            protected |= {p.metadata.uid for p in pods
                          if (p.metadata.labels or {}).get(LABEL_COMPONENT) == req.role
                          and (p.metadata.labels or {}).get(LABEL_ORDINAL) == str(req.ordinal)}
        groups: dict[tuple[str, str], list[client.V1Pod]] = {}
        for p in pods:
            labels = p.metadata.labels or {}
            if p.metadata.deletion_timestamp is None:
                groups.setdefault((labels.get(LABEL_COMPONENT, ""),
                                   labels.get(LABEL_ORDINAL, "")), []).append(p)
        for (role_name, _ordinal), members in groups.items():
            role = next((r for r in spec.get("roles") or [] if r.get("name") == role_name), None)
            if role is None:
                continue  # a departed role: its retirement decides
            size = int(role.get("size", 1))
            if len(members) != size:
                continue  # surplus or incomplete: undecidable now, touch nothing
            shape = read_shape(engine=engine, role_kind=str(role.get("kind") or "Server"),
                               size=size, extra_args=[str(a) for a in role.get("extraArgs")
                                                      or []], command=role.get("command"))
            sel = select_members(shape=shape, size=size, members=[
                MemberPod(name=p.metadata.name, uid=p.metadata.uid,
                          labels=dict(p.metadata.labels or {})) for p in members])
            if not sel.ok:
                continue
            for p in members:
                if p.metadata.uid in protected:
                    continue
                should = p.metadata.name in sel.measured and _ready(p)
                has = (p.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true"
                if should != has:
                    self._set_label(p, should)

    def _set_label(self, pod: client.V1Pod, on: bool) -> None:
        op = ({"op": "add", "path": f"/metadata/labels/{_KEY}", "value": "true"} if on
              else {"op": "remove", "path": f"/metadata/labels/{_KEY}"})
        try:
            self.kube.core.patch_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace,
                [{"op": "test", "path": "/metadata/uid", "value": pod.metadata.uid}, op])
            self.metrics.labels_set.labels(value="true" if on else "removed").inc()
        except ApiException as e:
            if e.status not in (404, 422):
                raise


def _view(p: client.V1Pod) -> PodView:
    return PodView(name=p.metadata.name, labels=dict(p.metadata.labels or {}),
                   terminating=p.metadata.deletion_timestamp is not None)


def _ready(p: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
