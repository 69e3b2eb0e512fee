"""The watcher as a controller: informer caches, a work queue, per-deployment reconciles.

- Informers (``watcher.informer``) list+watch ModelDeployments and the Pods of one, in
  every namespace or in each ``--watch-namespace``; every event is applied to the cache
  (``watcher.fleet``) on the event loop, and the deployments it touched are queued: not
  those it changed nothing of that their reconcile reads (``watcher.changes``; a change
  of a Pod's other labels or annotations touches a deployment only while a refusal of it
  is remembered or its reconcile is under way, ``reads_every_label``).
- The work queue (``watcher.workqueue``) de-duplicates keys, never reconciles one
  deployment twice at once, requeues a failed one with a back-off, and brings a refused
  intent back when its back-off ends.  Each deployment whose last reconcile failed is
  exported (``retire_watcher_deployment_failing``) until one succeeds.
- ``workers`` coroutines reconcile one deployment each (``Reconciler.reconcile_key``),
  only after every informer has synced (a half-filled cache would read Pods as missing)
  and the running set has been read from visibility once (an empty set would read every
  running retirement as absent: its intent started again and refused, its members'
  labels left alone until it is read).  If the first ``FIRST_REFRESH_TRIES`` visibility
  queries all fail, the workers start without it: each reconcile then asks Temporal what
  it must (a retry annotation, a label to put on, a start).
- Every ``refresh_s`` the running set is refreshed from Temporal's visibility (one paged
  query, whatever the fleet's size), the retirements it lists as holding are exported
  (``retire_watcher_retirement_held``), and the deployments whose retirement started or
  ended are queued; every ``resync_s`` every deployment is queued (a safety net: the
  reconcile is level-based, so a missed event is repaired there).
- Ready (``/readyz``) while every informer's last list or watch succeeded and the last
  visibility refresh, within three refresh periods, succeeded, and the reconciles are not
  all failing for want of the API server or Temporal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field

from kube.watching import Resource
from watcher.fleet import Key
from watcher.informer import Changed, Delta, Informer, Listed, Source
from watcher.metrics import Health
from watcher.reconcile import PassResult, Reconciler
from watcher.retirements import error_name
from watcher.workqueue import WorkQueue

log = logging.getLogger("retire-watcher")

RESOURCES: tuple[Resource, ...] = ("modeldeployments", "pods")
#: Failed visibility queries after which the workers start without the running set.
FIRST_REFRESH_TRIES = 3


@dataclass
class Controller:
    """One acting watcher: informers feeding the cache and queue, and the workers."""

    rec: Reconciler
    source: Source
    health: Health
    resync_s: float = 60.0
    refresh_s: float = 2.0
    workers: int = 4
    queue: WorkQueue = field(default_factory=WorkQueue)
    informers: list[Informer] = field(default_factory=list, init=False)
    #: Consecutive reconciles that failed only because the API server or Temporal was
    #: unreachable (readiness drops while it is not zero).
    unreachable_streak: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.rec.fleet.reads_every_label = self.reads_every_label

    def reads_every_label(self, key: Key) -> bool:
        """Whether the reconcile of ``key`` reads every label and annotation of its Pods
        now: a refusal of it is remembered (it depends on them), or its reconcile is under
        way (it may be recording one from the Pods it read before)."""
        return self.queue.in_flight(key) or self.rec.has_refusals(key)

    async def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set."""
        loop = asyncio.get_running_loop()
        metrics = self.rec.metrics
        self.health.standby = False
        self.health.stale_after_s = max(3 * self.refresh_s, 15.0)
        scopes: list[str | None] = [*self.rec.namespaces] if self.rec.namespaces else [None]

        def deliver(delta: Delta) -> None:  # called on an informer's thread
            loop.call_soon_threadsafe(self.apply, delta)

        for resource in RESOURCES:
            for ns in scopes:
                self.informers.append(
                    Informer(
                        source=self.source,
                        resource=resource,
                        namespace=ns,
                        deliver=deliver,
                        on_restart=metrics.watch_restarts.labels(resource=resource).inc,
                    )
                )
        for inf in self.informers:
            threading.Thread(
                target=inf.run, args=(stop,), name=f"informer-{inf.resource}", daemon=True
            ).start()
        await asyncio.to_thread(self._synced, stop)
        if stop.is_set():
            return
        log.info("caches synced: %d deployments", len(self.rec.fleet.deployments))
        first = asyncio.Event()  # the first visibility query answered (or kept failing)
        tasks = [asyncio.create_task(self._refresher(first))]
        while not first.is_set() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(first.wait(), 0.5)
        if first.is_set():
            if self.rec.running.refreshes:
                log.info("running retirements read: %d", len(self.rec.running.running))
            tasks += [asyncio.create_task(self._worker()) for _ in range(self.workers)]
            tasks.append(asyncio.create_task(self._resyncer()))
        await asyncio.to_thread(stop.wait)
        self.queue.close()
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t

    def _synced(self, stop: threading.Event) -> None:
        for inf in self.informers:
            while not stop.is_set() and not inf.synced.wait(0.5):
                pass

    def apply(self, delta: Delta) -> None:
        """Apply one informer delta to the cache and queue what it touched (on the loop)."""
        fleet = self.rec.fleet
        touched: set[Key]
        if isinstance(delta, Listed):
            if delta.resource == "pods":
                touched = fleet.replace_pods(delta.pods, namespace=delta.namespace)
            else:
                touched = fleet.replace_deployments(delta.deployments, namespace=delta.namespace)
        else:
            touched = self._changed(delta)
            self.rec.metrics.watch_events.labels(resource=delta.resource).inc()
        for key in touched:
            self.queue.add(key)
        self.rec.metrics.queue_depth.set(len(self.queue))

    def _changed(self, delta: Changed) -> set[Key]:
        fleet = self.rec.fleet
        if delta.resource == "pods":
            if delta.gone or delta.pod is None:
                return fleet.drop_pod(*delta.key)
            return fleet.put_pod(delta.pod)
        if delta.gone or delta.deployment is None:
            return fleet.drop_deployment(delta.key)
        return fleet.put_deployment(delta.key, delta.deployment)

    async def _worker(self) -> None:
        while (key := await self.queue.get()) is not None:
            assert isinstance(key, tuple)
            result = PassResult()
            try:
                again = await self.rec.reconcile_key(key, result)
            finally:
                self.queue.done(key)
            self.rec.metrics.queue_depth.set(len(self.queue))
            self.rec.metrics.reconciled(f"{key[0]}/{key[1]}", failed=bool(result.failed))
            if result.failed:
                self.queue.add_rate_limited(key)
                self.unreachable_streak += result.unreachable
            else:
                self.queue.forget(key)
                self.unreachable_streak = 0
                if again is not None:
                    self.queue.add_after(key, again + 0.01)

    async def _refresher(self, first: asyncio.Event) -> None:
        """Refresh the running set every ``refresh_s``; ``first`` is set once a refresh
        answered, or after ``FIRST_REFRESH_TRIES`` failed (the workers wait for it)."""
        failed = 0
        while True:
            started = time.monotonic()
            try:
                changed = await self.rec.refresh_running()
            except Exception as e:
                log.warning("visibility refresh failed: %s: %s", error_name(e), e)
                failed += 1
                if failed >= FIRST_REFRESH_TRIES and not first.is_set():
                    log.warning(
                        "visibility failed %d times: reconciling without the running set", failed
                    )
                    first.set()
            else:
                first.set()
                self.rec.metrics.show_held(f"{ns}/{name}" for ns, name in self.rec.running.held)
                for key in changed:
                    self.queue.add(key)
                if self.unreachable_streak == 0 and all(i.healthy for i in self.informers):
                    self.health.pass_healthy()
                    self.rec.metrics.last_healthy_pass.set_to_current_time()
            await asyncio.sleep(max(0.0, self.refresh_s - (time.monotonic() - started)))

    async def _resyncer(self) -> None:
        while True:
            await asyncio.sleep(self.resync_s)
            for key in self.rec.fleet.known():
                self.queue.add(key)
