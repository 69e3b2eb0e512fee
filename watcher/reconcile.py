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
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from kube.api import KubeApi
from kube.deployment import MalformedDeployment, ModelDeployment
from kube.errors import KubeError, NotFound
from kube.objects import ObjectRef, Pod
from retirement.intents import Intent, RoleSpec, derive_intents, intent_vanished, view_of
from retirement.models import RetirementState, RetryRequest, workflow_id_for
from retirement.names import APP_NAME, LABEL_INSTANCE, LABEL_NAME
from retirement.phases import Outcome
from watcher import retry_annotation
from watcher.fleet import Broken, Fleet, Key, decode_deployment
from watcher.labels import Active, LabelRepairs
from watcher.metrics import WatcherMetrics
from watcher.refusals import RefusalKey, Refusals, depends_on
from watcher.reporting import Failures, ref_of, unkeyed, watch_event
from watcher.retirements import Retirements, TemporalError, WorkflowNotFound
from watcher.retry_annotation import Answer
from watcher.running import RunningSet
from watcher.settings import WatcherSettings
from watcher.starts import Starts
from watcher.terminated import TerminatedRuns

__all__ = ["PassResult", "Reconciler", "WatcherSettings"]

log = logging.getLogger("retire-watcher")


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


@dataclass
class Reconciler:
    """The watcher's reconcile of one deployment at a time, over the fleet cache
    (``watcher.fleet``) and the cached running set (``watcher.running``).

    This is the orchestration; each concern has its own module: the Temporal calls
    (``watcher.retirements``), refused intents (``watcher.refusals``), starting the next
    retirement (``watcher.starts``), the retry annotation (``watcher.retry_annotation``),
    terminated runs (``watcher.terminated``), the label repair (``watcher.labels``, deciding
    in ``retirement.eligibility``) and failure reports (``watcher.reporting``)."""

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
    failures: Failures = field(init=False, repr=False)  # reported once per message
    terminated: TerminatedRuns = field(init=False, repr=False)
    labels: LabelRepairs = field(init=False, repr=False)
    starts: Starts = field(init=False, repr=False)
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
        self.failures = Failures(self.kube, self.metrics)
        self.terminated = TerminatedRuns(self.kube, self.retirements, self.metrics)
        self.labels = LabelRepairs(self.kube, self.retirements, self.running, self.metrics)
        self.starts = Starts(
            self.kube,
            self.retirements,
            self.running,
            self.metrics,
            self.settings,
            self.refusals,
            self._look_again,
        )

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
                self.failures.malformed(unkeyed(raw))
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
                self._failed(ref_of(key), e, result)
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
                    self.failures.malformed(entry)
                    return None
                elif isinstance(entry, Broken):
                    raise entry.error
                else:
                    await self.reconcile(entry, self.fleet.pods_of(key))
            except Exception as e:
                self._failed(ref_of(key), e, result)
                return None
        result.reconciled += 1
        self.failures.forget(key)
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
        self.failures.forget(key)
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
        """Count in ``result`` a deployment whose reconcile raised ``e``, and report it
        (``watcher.reporting.Failures``: logged, counted, posted once per message)."""
        result.failed += 1
        result.unreachable += int(self.failures.failed(about, e))

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
            active = await self.starts.start_next(md, pods, intents)
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
                    await self.terminated.report(wid, desc.run_id, md, pods)
                    self._examined[wid] = desc.run_id
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
        self.starts.refuse(
            key,
            depends_on(md, pods, req.intent, req.role, req.ordinal, req.members),
            reason,
            metric="admission",
        )

    def _prune_refusals(self, md: ModelDeployment, intents: list[Intent]) -> int:
        """Forget the refusals of intents no longer derived; how many still back off."""
        return self.refusals.prune((md.namespace, md.name), [(i.role, i.ordinal) for i in intents])

    async def _cancel_if_vanished(
        self, wid: str, md: ModelDeployment, pods: list[Pod], state: RetirementState
    ) -> None:
        """Send cancel-intent to a running or held retirement whose intent went away."""
        if state.outcome not in (Outcome.RUNNING, Outcome.ABORTED):
            return  # its outcome is decided
        if state.cancel_intent is not None:
            return  # already told
        reason = intent_vanished(md, pods, state)
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
            watch_event(self.kube, md.ref, "RetryAnnotationInvalid", ans.message, ans.value)
            return
        if ans.answer is Answer.IGNORED:
            watch_event(self.kube, md.ref, "RetryAnnotationIgnored", ans.message, ans.value)
        elif ans.answer is Answer.REPLAY:
            log.info("%s/%s: retry token %s is a replay: ignored", md.namespace, md.name, ans.token)
        else:
            res = await self.retirements.retry(
                workflow_id_for(namespace=md.namespace, deployment=md.name),
                RetryRequest(token=ans.token),
            )
            watch_event(
                self.kube, md.ref, "RetryDelivered", f"token {ans.token}: {res.decision}", ans.value
            )
        self.kube.patch_deployment(
            namespace=md.namespace, name=md.name, patch=retry_annotation.clear_patch(md)
        )

    # ------------------------------------------------------------ the label repair

    async def _maintain_eligibility(
        self, md: ModelDeployment, pods: list[Pod], active: Active | None, *, asked: bool
    ) -> None:
        """Repair the eligibility label of members no active retirement names
        (``watcher.labels``; ``asked``: Temporal was already asked what runs)."""
        await self.labels.maintain(md, pods, active, asked=asked)
