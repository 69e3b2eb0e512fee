"""One level-based reconcile pass of the watcher over every ModelDeployment.

Each pass derives the complete set of intents from the live state, so a missed event, a
crash or a restart loses nothing.  Per deployment it:

1. reads what runs; a retirement that ended since the last pass is read once, and a
   refusal (admission refused it) is remembered with its reason, what it depended on (the
   deployment's UID and generation, the intent, the replica's Pods) and a back-off (30 s
   doubling to 10 min); a change of what it depended on ends the back-off.  A run that was
   terminated skipped its restore and its last mirror write: its ``status.retirement`` is
   cleared (only while it names that run) and a ``RetirementTerminated`` Warning Event
   names the admitted members it left without the eligibility label;
2. delivers a valid ``retirement-retry`` annotation to the running retirement (then clears
   it); a malformed one gets a Warning Event and has no other effect;
3. tells a running or held retirement whose intent went away to end (cancel-intent): its
   request is no longer one of the intents derived from the live spec and Pods (the rule
   admission applies, ``retirement.intents.intent_refusal``), or the ModelDeployment's UID
   is not the one admission bound;
4. starts the retirement of the first intent that is not backing off (an intent that cannot
   even be requested, such as a hostile ordinal label, is refused here with a Warning
   Event); Temporal's refusal of a second start for the same workflow ID is the
   one-at-a-time rule, and the intent stays pending;
5. maintains the eligibility label: a Ready serving member that is not named by an active
   retirement gets it, a member that should not serve loses it; this also repairs orphans
   (members left disqualified by a terminated workflow).

Every deployment is isolated: whatever its reconcile raises is logged, counted
(``retire_watcher_reconcile_errors_total``) and, unless it is the API server or Temporal
being unreachable, posted once per distinct message as a Warning Event on the
ModelDeployment; the pass goes on with the others.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus

from kube.api import KubeApi
from kube.deployment import MalformedDeployment, ModelDeployment, Role, parse_deployment
from kube.errors import Conflict, Forbidden, KubeError, NotFound
from kube.events import MESSAGE_CAP, post_event
from kube.members import LabelChange, set_eligibility
from kube.objects import ObjectRef, Pod, pod_ready
from retirement.budgets import Budgets
from retirement.eligibility import in_group, label_repair
from retirement.intents import Intent, RoleSpec, derive_intents, intent_refusal, view_of
from retirement.models import (
    IntentKind,
    RetirementRequest,
    RetirementState,
    RetryRequest,
    RouterlessPolicy,
    Target,
    workflow_id_for,
)
from retirement.names import (
    APP_NAME,
    GROUP,
    KIND,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_MEMBER_INDEX,
    LABEL_NAME,
    LABEL_ORDINAL,
    VERSION,
)
from retirement.phases import Outcome, abortable
from retirement.shape import ShapeReading, read_shape
from watcher import retry_annotation
from watcher.fleet import Broken, Fleet, Key, decode_deployment
from watcher.metrics import WatcherMetrics
from watcher.refusals import RefusalKey, Refusals, depends_on
from watcher.retirements import (
    AlreadyRunning,
    Retirements,
    TemporalError,
    WorkflowNotFound,
    error_name,
)
from watcher.retry_annotation import Answer
from watcher.running import RunningSet

log = logging.getLogger("retire-watcher")

#: How long the state of a terminated run is waited for (a worker replays its history).
TERMINATED_QUERY_TIMEOUT = timedelta(seconds=5)
#: What became of a terminated run's ``status.retirement`` (``Reconciler._clear_mirror``).
CLEARED, FORBIDDEN = "cleared", "forbidden"


@dataclass(frozen=True)
class WatcherSettings:
    """What every retirement the watcher starts is given."""

    task_queue: str = "retirement"
    budgets: Budgets = field(default_factory=Budgets)
    routerless_policy: RouterlessPolicy = RouterlessPolicy.HOLD
    quiet_window_s: float = 10.0
    #: A refused intent waits this long before it is tried again, doubling up to the max.
    refusal_backoff_s: float = 30.0
    refusal_backoff_max_s: float = 600.0


@dataclass
class PassResult:
    """What reconciling some deployments did: reconciled, failed, and failed because the
    API server or Temporal could not be reached."""

    reconciled: int = 0
    failed: int = 0
    unreachable: int = 0

    @property
    def healthy(self) -> bool:
        """Healthy unless nothing could be reconciled because the API server or Temporal
        was unreachable (a deployment that fails on its own does not make the watcher
        unready: it is reported on the object)."""
        return self.reconciled > 0 or self.unreachable == 0


@dataclass(frozen=True)
class Active:
    """The replica a running (or held) retirement names: its members are left alone."""

    role: str
    ordinal: int
    uids: tuple[str, ...] = ()  # the admitted member UIDs, once admission bound them
    #: A retirement runs, but which replica it names is not known yet (Temporal refused a
    #: start because one runs that the running set did not know of): protect everything.
    unknown: bool = False

    @classmethod
    def of(cls, state: RetirementState) -> Active:
        members = state.target.members if state.target is not None else []
        return cls(state.request.role, state.request.ordinal, tuple(m.uid for m in members))


@dataclass
class Reconciler:
    """The watcher's reconcile of one deployment at a time, over the fleet cache
    (``watcher.fleet``) and the cached running set (``watcher.running``)."""

    kube: KubeApi
    temporal: Client
    settings: WatcherSettings
    metrics: WatcherMetrics
    namespaces: list[str] | None = None  # None: every namespace
    clock: Callable[[], float] = time.monotonic  # for the refusal back-off
    fleet: Fleet = field(default_factory=Fleet)
    running: RunningSet = field(default_factory=RunningSet)
    retirements: Retirements = field(init=False, repr=False)  # ``temporal``, wrapped
    #: Remembered refusals (in memory: a restarted watcher tries each intent once more).
    refusals: Refusals = field(init=False, repr=False)
    #: Per workflow ID, the closed run already read (each ended run is read once).
    _examined: dict[str, str] = field(default_factory=dict, init=False, repr=False)
    #: Per deployment, the failure message last posted as an Event (posted once each).
    _failures: dict[Key, str] = field(default_factory=dict, init=False, repr=False)
    #: Retirements of a deleted deployment already sent cancel-intent.
    _orphans_told: set[str] = field(default_factory=set, init=False, repr=False)
    #: Deployments to reconcile again at once (a running retirement found, not yet read).
    _look_again: set[Key] = field(default_factory=set, init=False, repr=False)

    def __post_init__(self) -> None:
        self.retirements = Retirements(
            self.temporal, count=lambda call: self.metrics.temporal_calls.labels(call=call).inc()
        )
        self.refusals = Refusals(
            clock=self.clock,
            backoff_s=self.settings.refusal_backoff_s,
            backoff_max_s=self.settings.refusal_backoff_max_s,
        )
        if self.namespaces is not None and self.running.namespaces is None:
            self.running.namespaces = frozenset(self.namespaces)

    # ------------------------------------------------------------ entry points

    async def reconcile_all(self) -> PassResult:
        """A full pass from fresh listings: every ModelDeployment and its Pods are listed
        into the cache, the running set is refreshed, then every deployment is reconciled.
        The controller (``watcher.controller``) keeps the cache by list+watch instead and
        reconciles only the deployments an event touched; this pass is for tests, tools
        and a watcher run without informers."""
        result = PassResult()
        entries = []
        for raw in self._deployments():
            decoded = decode_deployment(raw)
            if decoded is None:  # cannot even be keyed: say so, skip it
                self._malformed(_unkeyed(raw))
            else:
                entries.append(decoded)
        self.fleet.replace_deployments(entries)
        pods: list[Pod] = []
        unlisted: set[Key] = set()
        for key, entry in entries:
            if not isinstance(entry, ModelDeployment):
                continue  # reported by its reconcile; nothing of it is read
            try:
                pods += self.kube.list_pods(
                    namespace=key[0], selector=f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={key[1]}"
                )
            except KubeError as e:  # this deployment only: not reconciled on a partial view
                unlisted.add(key)
                self._failed(_ref_of(key), e, result)
        self.fleet.replace_pods(pods)
        try:
            await self.refresh_running()
        except Exception as e:  # the reconciles below describe what they must
            self._failed(None, e, result)
        for key in sorted(self.fleet.known() | set(self.running.running)):
            if key not in unlisted:
                await self.reconcile_key(key, result)
        if result.healthy:
            self.metrics.last_healthy_pass.set_to_current_time()
        return result

    async def refresh_running(self) -> set[Key]:
        """Refresh the running set from visibility; the deployments to look at again."""
        return await self.running.refresh(self.retirements)

    async def reconcile_key(self, key: Key, result: PassResult | None = None) -> float | None:
        """Reconcile the deployment ``key`` from the cache; whatever fails is reported
        (``_failed``) and counted in ``result``.  Returns when to look at it again (a
        refusal's back-off ending), None when only a change needs to bring it back."""
        result = result if result is not None else PassResult()
        entry = self.fleet.deployment(key)
        with self.metrics.reconcile_seconds.time():
            try:
                if entry is None:
                    await self._gone(key)
                elif isinstance(entry, MalformedDeployment):
                    self._malformed(entry)
                    return None
                elif isinstance(entry, Broken):
                    raise entry.error
                else:
                    await self.reconcile(entry, self.fleet.pods_of(key))
            except Exception as e:
                self._failed(_ref_of(key), e, result)
                return None
        result.reconciled += 1
        self._failures.pop(key, None)
        self.metrics.reconciles.inc()
        return self._next_look(key)

    def has_refusals(self, key: Key) -> bool:
        """Whether a refusal of an intent of the deployment ``key`` is remembered."""
        return self.refusals.has(key)

    def _next_look(self, key: Key) -> float | None:
        """Seconds until the earliest refusal of ``key`` stops backing off, or at once when
        a retirement was found running whose replica is not known yet."""
        if key in self._look_again:
            self._look_again.discard(key)
            return 0.0
        return self.refusals.next_wait(key)

    async def _gone(self, key: Key) -> None:
        """The deployment ``key`` is not (or no longer) listed: forget it, and tell a
        retirement of it that still runs that there is nothing left to retire (it would
        otherwise hold for ever, and keep a re-created deployment of that name from
        retiring anything)."""
        ns, name = key
        wid = workflow_id_for(namespace=ns, deployment=name)
        self.refusals.forget_deployment(key)
        self._examined.pop(wid, None)
        self._failures.pop(key, None)
        for gauge in (self.metrics.pending, self.metrics.backing_off):
            with contextlib.suppress(KeyError):  # no series of a deployment never seen
                gauge.remove(f"{ns}/{name}")
        if not self.running.may_run(key) or wid in self._orphans_told:
            return
        try:
            desc = await self.retirements.describe(wid)
        except WorkflowNotFound:
            self.running.forget(key)
            return
        if not desc.running:
            self.running.forget(key)
            return
        try:  # the cache may lag behind a re-creation: read it to be sure
            self.kube.get_deployment(namespace=ns, name=name)
            return
        except NotFound:
            pass
        reason = f"the ModelDeployment {ns}/{name} was deleted"
        await self.retirements.cancel_intent(wid, reason)
        self._orphans_told.add(wid)
        log.info("%s: %s: cancel-intent sent", wid, reason)

    def _deployments(self) -> list[dict[str, Any]]:
        if self.namespaces is None:
            return self.kube.list_deployments()
        out: list[dict[str, Any]] = []
        for ns in self.namespaces:
            out += self.kube.list_deployments(namespace=ns)
        return out

    def _failed(self, about: ObjectRef | None, e: Exception, result: PassResult) -> None:
        """Log and count a deployment whose reconcile raised ``e``; post it as a Warning
        Event once per distinct message, unless the API server or Temporal was merely
        unreachable (that is no fact about the deployment)."""
        result.failed += 1
        transient = _unreachable(e)
        result.unreachable += int(transient)
        self.metrics.reconcile_errors.labels(error=error_name(e)).inc()
        where = f"{about.namespace}/{about.name}" if about is not None else "?"
        expected = isinstance(e, KubeError | TemporalError)
        log.warning(
            "reconcile %s failed: %s: %s",
            where,
            error_name(e),
            e,
            exc_info=None if expected else e,
        )
        if transient or about is None or not about.name or not about.namespace:
            return
        message = f"not reconciled: {error_name(e)}: {_one_line(e)}"[:MESSAGE_CAP]
        key = (about.namespace, about.name)
        if self._failures.get(key) == message:
            return
        try:
            self._event(about, "ReconcileFailed", message, message, warning=True)
        except KubeError as err:
            log.warning("event for %s: %s", where, err)
            return
        self._failures[key] = message

    def _malformed(self, e: MalformedDeployment) -> None:
        """Touch nothing of a deployment that cannot be read; say why, once per reason."""
        if not e.name or not e.namespace:
            log.warning("%s: skipped", e)
            return
        key = (e.namespace, e.name)
        if self._failures.get(key) == e.reason:
            return
        log.warning("%s: skipped", e)
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
            return
        self._failures[key] = e.reason

    async def reconcile(self, md: ModelDeployment, pods: list[Pod]) -> None:
        """Reconcile one deployment, given its Pods."""
        ns, name = md.namespace, md.name
        key = (ns, name)
        roles = [RoleSpec(name=r.name, replicas=r.replicas, size=r.size) for r in md.roles]
        intents = derive_intents(roles, [view_of(p) for p in pods])
        self.metrics.intents_seen.inc(len(intents))
        wid = workflow_id_for(namespace=ns, deployment=name)
        # A retry annotation is answered from Temporal itself, never from the cached running
        # set alone: the set is a hint that may not know of a retirement yet (before the
        # first visibility query after a start or a failover, or one started a moment ago).
        ask = retry_annotation.wants_retry(md)
        asked = ask or self.running.may_run(key)  # then Temporal is asked now, not the cache
        state = await self._running_state(key, wid, md, pods, ask=ask)
        await self._retry_annotation(md, state)
        active: Active | None = None
        if state is not None:
            await self._cancel_if_vanished(wid, md, pods, state)
            active = Active.of(state)
        else:
            active = await self._start_next(md, pods, intents)
            asked = asked or (active is not None and not active.unknown)
        backing_off = self._prune_refusals(md, intents)
        dep = f"{ns}/{name}"
        self.metrics.pending.labels(deployment=dep).set(
            max(0, len(intents) - (1 if active is not None else 0))
        )
        self.metrics.backing_off.labels(deployment=dep).set(backing_off)
        await self._maintain_eligibility(md, pods, active, asked=asked)

    # ------------------------------------------------------------ Temporal

    async def _running_state(
        self, key: Key, wid: str, md: ModelDeployment, pods: list[Pod], *, ask: bool = False
    ) -> RetirementState | None:
        """The state of the running retirement, or None.  Temporal is asked when the
        running set says one may run, or when ``ask`` (the cached set may not know of it
        yet); a run that ended since it was last looked at is read once (``_examine``)."""
        if not ask and not self.running.may_run(key):
            return None
        try:
            desc = await self.retirements.describe(wid)
        except WorkflowNotFound:
            self.running.not_running(key)
            return None
        if not desc.running:
            if self._examined.get(wid) != desc.run_id:
                if desc.status is WorkflowExecutionStatus.COMPLETED:
                    await self._examine(wid, desc.run_id, md, pods)
                elif desc.status is WorkflowExecutionStatus.TERMINATED:
                    await self._terminated(wid, desc.run_id, md, pods)
            self.running.not_running(key)
            return None
        self.running.started(key, wid)
        return await self.retirements.state(wid)

    async def _examine(self, wid: str, run_id: str, md: ModelDeployment, pods: list[Pod]) -> None:
        """Read how the ended run ``run_id`` ended: remember a refusal, forget one of the
        same intent otherwise."""
        try:
            final = await self.retirements.result(
                wid, run_id=run_id, rpc_timeout=timedelta(seconds=10)
            )
        except TemporalError:
            raise  # not read: the next pass reads it again
        except Exception as e:  # e.g. a result an earlier build wrote that does not decode
            log.warning("%s: the result of run %s cannot be read: %s", wid, run_id, e)
            self._examined[wid] = run_id
            return
        self._examined[wid] = run_id
        req = final.request
        key: RefusalKey = (md.namespace, md.name, req.role, req.ordinal)
        if final.outcome is not Outcome.REFUSED:
            self.refusals.pop(key, None)
            return
        reason = final.reason or "admission refused"
        self._refuse(
            key,
            depends_on(md, pods, req.intent, req.role, req.ordinal, req.members),
            reason,
            metric="admission",
        )

    async def _terminated(
        self, wid: str, run_id: str, md: ModelDeployment, pods: list[Pod]
    ) -> None:
        """The run ``run_id`` was terminated: its restore and its last mirror write were
        skipped.  Clear ``status.retirement`` while it names that run, and post one
        Warning Event naming the admitted members it left without the eligibility label:
        single members get it back from this watcher's label repair; members of a group
        need the identity probe, which the watcher cannot run, so a person must act.
        Raises (and is read again on the next reconcile) when the status could not be
        written."""
        final = await self._terminated_state(wid, run_id)
        target = final.target if final is not None else None
        mirrored, cleared = await self._clear_mirror(wid, run_id, md, target)
        single, group = _left_unlabelled(md, pods, target, mirrored)
        left = "group" if group else "single" if single else "none"
        role = final.request.role if final is not None else str(mirrored.get("roleName", "?"))
        ordinal = (
            str(final.request.ordinal)
            if final is not None
            else str(mirrored.get("replicaOrdinal", "?"))
        )
        message = _terminated_message(
            wid,
            run_id,
            md=md,
            replica=f"{role}:{ordinal}",
            cleared=cleared,
            single=single,
            group=group,
            source="" if final is not None else "status.retirement" if mirrored else "nothing",
        )
        posted = self._event(
            md.ref, "RetirementTerminated", message, f"{wid}|{run_id}", warning=True
        )
        self._examined[wid] = run_id
        if posted:  # counted once per run, even when a restarted watcher reads it again
            self.metrics.terminated.labels(left_unlabelled=left).inc()
            log.warning("%s/%s: %s", md.namespace, md.name, message)

    async def _terminated_state(self, wid: str, run_id: str) -> RetirementState | None:
        """The last state of the terminated run (a worker replays its history to answer),
        or None when it cannot be read (no worker answers in time, a history an earlier
        build wrote): ``status.retirement`` is read instead."""
        try:
            return await self.retirements.state(
                wid, run_id=run_id, rpc_timeout=TERMINATED_QUERY_TIMEOUT
            )
        except Exception as e:
            log.warning(
                "%s: the state of terminated run %s cannot be read (%s: %s): "
                "reading status.retirement instead",
                wid,
                run_id,
                error_name(e),
                _one_line(e),
            )
            return None

    async def _clear_mirror(
        self, wid: str, run_id: str, md: ModelDeployment, target: Target | None
    ) -> tuple[dict[str, Any], str]:
        """Remove ``status.retirement`` if it still mirrors the terminated run ``run_id``:
        it names ``wid``, the deployment is the one the run admitted (its UID), and no
        newer run of ``wid`` exists (asked after the read, so a newer run's status is
        never taken for this one's).  The status subresource's merge patch carries the
        version read and the admitted UID as preconditions: a write in between is a
        Conflict, and the whole check is made again.  Returns what ``status.retirement``
        said when read, and ``CLEARED``, ``FORBIDDEN`` (RBAC does not let the watcher
        write the status: said in the Event, never retried in a loop) or "" (not this
        run's to clear)."""
        admitted_uid = target.deployment_uid if target is not None else ""
        for _ in range(3):
            try:
                raw = self.kube.get_deployment(namespace=md.namespace, name=md.name)
            except NotFound:
                return {}, ""
            mirrored = _retirement_status(raw)
            meta = raw.get("metadata") or {}
            if mirrored.get("workflowID") != wid:
                return {}, ""  # not this workflow's (or already cleared)
            if admitted_uid and meta.get("uid") != admitted_uid:
                return {}, ""  # re-created since: the status is another run's
            latest = await self.retirements.describe(wid)
            if latest.run_id != run_id:
                return {}, ""  # a newer run: the status may be its own
            precondition: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
            if admitted_uid:
                precondition["uid"] = admitted_uid
            try:
                self.kube.patch_deployment_status(
                    namespace=md.namespace,
                    name=md.name,
                    patch={"metadata": precondition, "status": {"retirement": None}},
                )
            except NotFound:
                return mirrored, ""
            except Forbidden as e:
                log.warning("%s: status.retirement not cleared: %s", wid, e)
                return mirrored, FORBIDDEN
            except Conflict:
                continue  # written in between (or re-created): read and check again
            return mirrored, CLEARED
        raise Conflict(
            f"clear status.retirement of ModelDeployment {md.namespace}/{md.name}",
            status=409,
            reason="Conflict",
        )

    def _refuse(self, key: RefusalKey, on: Hashable, reason: str, *, metric: str) -> None:
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

    def _prune_refusals(self, md: ModelDeployment, intents: list[Intent]) -> int:
        """Forget the refusals of intents no longer derived; how many still back off."""
        return self.refusals.prune((md.namespace, md.name), [(i.role, i.ordinal) for i in intents])

    async def _start_next(
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
                    f"{_validation_text(e)}"
                )
                self._refuse(key, on, reason, metric="invalid-request")
                try:
                    self._event(
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
            self._look_again.add(key)
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

    async def _cancel_if_vanished(
        self, wid: str, md: ModelDeployment, pods: list[Pod], state: RetirementState
    ) -> None:
        """Send cancel-intent to a running or held retirement whose intent went away."""
        if state.outcome not in (Outcome.RUNNING, Outcome.ABORTED):
            return  # its outcome is decided
        if state.cancel_intent is not None:
            return  # already told
        reason = _vanished(md, pods, state)
        if not reason:
            return
        await self.retirements.cancel_intent(wid, reason[:256])
        log.info("%s: %s: cancel-intent sent", wid, reason)

    async def _retry_annotation(self, md: ModelDeployment, state: RetirementState | None) -> None:
        """Apply the answer to a ``retirement-retry`` annotation (``watcher.retry_annotation``)."""
        ans = retry_annotation.answer(md, state)
        if ans is None:
            return
        if ans.answer is Answer.INVALID:
            self._event(md.ref, "RetryAnnotationInvalid", ans.message, ans.value)
            return
        if ans.answer is Answer.IGNORED:
            self._event(md.ref, "RetryAnnotationIgnored", ans.message, ans.value)
        elif ans.answer is Answer.REPLAY:
            log.info("%s/%s: retry token %s is a replay: ignored", md.namespace, md.name, ans.token)
        else:
            res = await self.retirements.retry(
                workflow_id_for(namespace=md.namespace, deployment=md.name),
                RetryRequest(token=ans.token),
            )
            self._event(md.ref, "RetryDelivered", f"token {ans.token}: {res.decision}", ans.value)
        self.kube.patch_deployment(
            namespace=md.namespace, name=md.name, patch=retry_annotation.clear_patch(md)
        )

    # ------------------------------------------------------------ Kubernetes

    def _event(
        self, about: ObjectRef, reason: str, message: str, key: str, *, warning: bool = False
    ) -> bool:
        """Post the Event once; False when it had already been posted."""
        return post_event(
            self.kube,
            about=about,
            tag="watch",
            key=f"{reason}|{key}",
            reason=reason,
            message=message,
            warning=warning or "Invalid" in reason,
        )

    async def _maintain_eligibility(
        self, md: ModelDeployment, pods: list[Pod], active: Active | None, *, asked: bool
    ) -> None:
        """Repair the label of members no active retirement names, as
        ``retirement.eligibility.label_repair`` decides: off a member that should not
        serve; on a member that should, by the restore's rule: never on a group member,
        which needs the identity probe the watcher cannot run.

        The running set is a cached hint: before putting a label on, the watcher asks
        Temporal itself whether a retirement of the deployment runs (unless this reconcile
        already did, ``asked``), so a retirement started a moment ago by someone else, not
        yet visible, never sees a member it disqualified labelled again."""
        protected: set[str] = set()
        if active is not None and active.unknown:
            asked = True  # nothing is labelled (below) until it is known what runs
            protected |= {p.uid for p in pods}
        if active is not None:
            protected |= set(active.uids)
            protected |= {
                p.uid
                for p in pods
                if p.labels.get(LABEL_COMPONENT) == active.role
                and p.labels.get(LABEL_ORDINAL) == str(active.ordinal)
            }
        declared = {r.name: r for r in md.roles}  # names are unique (``parse_deployment``)
        repair = label_repair(
            pods,
            ready=pod_ready,
            sizes={name: r.size for name, r in declared.items()},
            shape_of=lambda name: role_shape(md.engine.name, declared[name]),
            protected=protected,
        )
        for p in repair.remove:
            self._set_label(p, False, p.labels.get(LABEL_ELIGIBLE))
        if repair.add and not asked and not await self._nothing_runs(md):
            return  # a retirement runs: the next reconcile reads what it protects
        for p in repair.add:
            self._set_label(p, True, p.labels.get(LABEL_ELIGIBLE))

    async def _nothing_runs(self, md: ModelDeployment) -> bool:
        """Whether Temporal says no retirement of ``md`` runs (a running one is put in the
        running set, so the next reconcile reads its state)."""
        key = (md.namespace, md.name)
        wid = workflow_id_for(namespace=md.namespace, deployment=md.name)
        try:
            desc = await self.retirements.describe(wid)
        except WorkflowNotFound:
            return True
        if desc.running:
            self.running.started(key, wid)
            return False
        return True

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


@functools.lru_cache(maxsize=4096)
def _shape(
    engine: str,
    kind: str,
    size: int,
    extra_args: tuple[str, ...],
    command: tuple[str, ...] | None,
    env: tuple[tuple[str, str | None], ...],
) -> ShapeReading:
    return read_shape(
        engine=engine,
        role_kind=kind,
        size=size,
        extra_args=extra_args,
        command=command,
        env=env,
    )


def role_shape(engine: str, role: Role) -> ShapeReading:
    """``read_shape`` of a declared role, memoised on exactly what it reads.

    Reading a shape parses the role's command line against every spelling the engine
    accepts (~0.1 ms); the eligibility repair needs it for every replica of every
    deployment an event touches, and a fleet's roles repeat the same few declarations, so
    without the memo it was most of the watcher's CPU per event.  ``read_shape`` is pure
    and its inputs are immutable tuples, so a remembered reading is the reading."""
    return _shape(engine, role.kind, role.size, role.extra_args, role.command, role.env)


def _vanished(md: ModelDeployment, pods: list[Pod], state: RetirementState) -> str:
    """Why the intent of the retirement ``state`` went away; empty while it stands."""
    req = state.request
    role = md.role(req.role)
    if req.intent is IntentKind.COUNT_TRIM and role is not None and req.ordinal < role.replicas:
        return f"the spec re-declares {req.role} ordinal {req.ordinal}"
    admitted = state.target.deployment_uid if state.target is not None else ""
    if admitted and admitted != md.uid:
        return (
            f"ModelDeployment {md.namespace}/{md.name} was re-created (UID {md.uid}; "
            f"the retirement admitted UID {admitted})"
        )
    if state.outcome is Outcome.RUNNING and not abortable(state.phase):
        return ""  # the deletes are under way: its Pods go because of it
    return intent_refusal(md, pods, req)


def _retirement_status(raw: Any) -> dict[str, Any]:
    """``status.retirement`` of a raw ModelDeployment ({} when absent or not a mapping)."""
    status = raw.get("status") if isinstance(raw, dict) else None
    mirrored = status.get("retirement") if isinstance(status, dict) else None
    return dict(mirrored) if isinstance(mirrored, dict) else {}


def _left_unlabelled(
    md: ModelDeployment, pods: list[Pod], target: Target | None, mirrored: dict[str, Any]
) -> tuple[list[Pod], list[Pod]]:
    """The admitted members a terminated run left without the eligibility label, as
    (single members, members of a group).  The admitted members are the run's target's
    (those its restore would have put back), else the UIDs ``status.retirement`` lists;
    a Pod that is gone or terminating is left out."""
    if target is not None:
        restorable = set(target.restorable())
        uids = {m.uid for m in target.members if m.pod in restorable}
        role_name, size = target.role, target.size
    else:
        listed = mirrored.get("targetMemberUIDs")
        uids = (
            {u for u in listed if isinstance(u, str) and u} if isinstance(listed, list) else set()
        )
        role_name, size = str(mirrored.get("roleName", "")), None
    if size is None:
        declared = md.role(role_name)
        size = declared.size if declared is not None else None
    single: list[Pod] = []
    group: list[Pod] = []
    for p in sorted(pods, key=lambda p: p.name):
        if p.uid not in uids or p.terminating or p.labels.get(LABEL_ELIGIBLE) == "true":
            continue
        grouped = in_group(size=size, member_index=p.labels.get(LABEL_MEMBER_INDEX))
        (group if grouped else single).append(p)
    return single, group


def _terminated_message(
    wid: str,
    run_id: str,
    *,
    md: ModelDeployment,
    replica: str,
    cleared: str,
    single: list[Pod],
    group: list[Pod],
    source: str,
) -> str:
    """What the ``RetirementTerminated`` Event says: what was skipped, which members are
    without the label, and what happens to them or what a person should do.  ``source``:
    where the admitted members were read when the run's state could not be ("" when it
    could; "nothing" when neither says)."""
    parts = [
        f"{wid} (run {run_id}, replica {replica}) was terminated: its restore was skipped"
        + (
            "; status.retirement cleared"
            if cleared == CLEARED
            else "; status.retirement could not be cleared: the watcher may not patch "
            "modeldeployments/status (RBAC)"
            if cleared == FORBIDDEN
            else ""
        )
    ]
    if source == "nothing":
        parts.append(
            "which members it admitted is not known (its state could not be read and "
            f"status.retirement does not name it): check the replica's Pods for {LABEL_ELIGIBLE}"
        )
    elif not single and not group:
        parts.append(f"no admitted member is left without {LABEL_ELIGIBLE}")
    if single:
        parts.append(
            f"without {LABEL_ELIGIBLE}: {_names(single)}: the watcher puts the label back "
            "on each once it is Ready (unless a retirement names it again)"
        )
    if group:
        parts.append(
            f"group members without {LABEL_ELIGIBLE}: {_names(group)}: the watcher cannot "
            "put it back (a group member needs the identity probe); once each serves, "
            f"label it by hand (kubectl label pod <name> -n {md.namespace} "
            f"{LABEL_ELIGIBLE}=true), unless {replica} is still to be retired (its next "
            "retirement takes them); see docs/runbook.md"
        )
    if source == "status.retirement":
        parts.append("members read from status.retirement (the run's state could not be read)")
    return "; ".join(parts)


def _names(pods: list[Pod], limit: int = 8) -> str:
    names = [p.name for p in pods[:limit]]
    more = len(pods) - limit
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")


def _unreachable(e: Exception) -> bool:
    """Whether ``e`` says the API server or Temporal could not be reached (retry later)."""
    if isinstance(e, KubeError):
        return e.retryable
    if isinstance(e, TemporalError):
        return e.retryable
    return isinstance(e, ConnectionError | TimeoutError)


def _one_line(e: Exception) -> str:
    if isinstance(e, ValidationError):
        return _validation_text(e)
    return " ".join(str(e).split()) or type(e).__name__


def _validation_text(e: ValidationError) -> str:
    """A pydantic error on one line: ``field: message`` per error."""
    return "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or 'value'}: {err['msg']}" for err in e.errors()
    )


def _ref_of(key: Key) -> ObjectRef:
    """The ModelDeployment ``key`` as an Event's object (the UID is optional)."""
    return ObjectRef(
        api_version=f"{GROUP}/{VERSION}", kind=KIND, namespace=key[0], name=key[1], uid=""
    )


def _unkeyed(raw: Any) -> MalformedDeployment:
    """Why a listed object cannot even be keyed (no namespace or name)."""
    try:
        parse_deployment(raw)
    except MalformedDeployment as e:
        return e
    except Exception as e:
        return MalformedDeployment(f"cannot be decoded: {type(e).__name__}")
    return MalformedDeployment("metadata.namespace is missing")
