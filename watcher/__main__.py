"""``python -m watcher``: turn removal intents into retirements, maintain eligibility.

Runs level-based reconcile passes: one on every change seen by list+watch of
ModelDeployments and Pods (resourceVersion, bookmarks, re-list on 410 Gone), and one at
least every ``--resync`` seconds.  With ``--leader-elect`` a Kubernetes Lease elects one
acting watcher among several; the others stand by and take over within the lease time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import threading
import uuid
from typing import Any

from kubernetes import config as kconfig
from kubernetes import watch
from kubernetes.client.rest import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from activities.kube import Kube
from retirement.budgets import Budgets
from retirement.models import RouterlessPolicy
from retirement.names import APP_NAME, GROUP, LABEL_NAME, PLURAL, VERSION
from watcher.metrics import Health, WatcherMetrics, serve_health
from watcher.reconcile import Reconciler, WatcherSettings

log = logging.getLogger("retire-watcher")


def watch_forever(kube: Kube, kind: str, trigger: threading.Event, stop: threading.Event,
                  metrics: WatcherMetrics) -> None:
    """List+watch ``kind`` and set ``trigger`` on every change, until ``stop``."""
    while not stop.is_set():
        try:
            if kind == "pods":
                lister: Any = kube.core.list_pod_for_all_namespaces
                kwargs: dict[str, Any] = {"label_selector": f"{LABEL_NAME}={APP_NAME}"}
            else:
                lister = kube.custom.list_cluster_custom_object
                kwargs = {"group": GROUP, "version": VERSION, "plural": PLURAL}
            listing = lister(**kwargs)
            rv = (listing.metadata.resource_version if kind == "pods"
                  else listing["metadata"]["resourceVersion"])
            trigger.set()
            w = watch.Watch()
            for _event in w.stream(lister, resource_version=rv, allow_watch_bookmarks=True,
                                   timeout_seconds=60, **kwargs):
                if _event.get("type") != "BOOKMARK":
                    trigger.set()
                if stop.is_set():
                    w.stop()
        except ApiException as e:
            if e.status != 410:  # 410 Gone: re-list from scratch
                log.warning("watch %s: %s", kind, e.reason)
                stop.wait(1)
        except Exception as e:
            log.warning("watch %s: %s", kind, e)
            stop.wait(1)
        metrics.watch_restarts.labels(resource=kind).inc()


async def act(rec: Reconciler, *, resync: float, stop: threading.Event, health: Health,
              trigger: threading.Event) -> None:
    """Reconcile on each trigger and at least every ``resync`` seconds, until ``stop``."""
    while not stop.is_set():
        trigger.clear()
        try:
            await rec.reconcile_all()
            health.ready = True
        except Exception as e:
            log.warning("reconcile pass failed: %s", e)
        await asyncio.to_thread(trigger.wait, resync)


async def connect(address: str, namespace: str, stop: threading.Event) -> Client | None:
    """Connect to Temporal, retrying while it is down (it may be for a while)."""
    delay = 1.0
    while not stop.is_set():
        try:
            return await Client.connect(address, namespace=namespace,
                                        data_converter=pydantic_data_converter)
        except RuntimeError as e:
            log.warning("Temporal at %s not reachable (%s); retrying in %.0f s", address,
                        str(e).splitlines()[0][:120], delay)
            await asyncio.to_thread(stop.wait, delay)
            delay = min(delay * 2, 15.0)
    return None


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Flags (defaults from the environment)."""
    env = os.environ
    p = argparse.ArgumentParser(prog="retire-watcher", description=__doc__)
    p.add_argument("--address", default=env.get("RETIRE_TEMPORAL_ADDRESS", "127.0.0.1:7233"))
    p.add_argument("--namespace", default=env.get("RETIRE_TEMPORAL_NAMESPACE", "default"))
    p.add_argument("--task-queue", default=env.get("RETIRE_TASK_QUEUE", "retirement"))
    p.add_argument("--kubeconfig", default=env.get("KUBECONFIG") or None)
    p.add_argument("--watch-namespace", action="append", default=None,
                   help="reconcile only these Kubernetes namespaces (repeatable)")
    p.add_argument("--resync", type=float, default=5.0)
    p.add_argument("--budgets", default="{}", help="JSON budgets for started retirements")
    p.add_argument("--routerless-policy", default="hold", choices=["hold", "quiet-window"])
    p.add_argument("--quiet-window", type=float, default=10.0)
    p.add_argument("--health-address", default="127.0.0.1:0")
    p.add_argument("--leader-elect", action="store_true")
    p.add_argument("--lease-namespace", default="default")
    p.add_argument("--lease-name", default="retire-watcher")
    p.add_argument("--lease-seconds", type=int, default=15)
    p.add_argument("--identity", default=f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    a = p.parse_args(argv)
    if a.resync <= 0 or a.lease_seconds < 3:
        p.error("--resync must be positive and --lease-seconds at least 3")
    return a


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    a = parse(argv)
    try:
        budgets = Budgets.model_validate_json(a.budgets)
    except ValueError as e:
        print(f"retire-watcher: --budgets: {e}", file=sys.stderr)
        return 2
    kube = Kube.from_config(kubeconfig=a.kubeconfig)
    metrics, health = WatcherMetrics(), Health()
    host, _, port = a.health_address.rpartition(":")
    server = serve_health(metrics, health, host=host or "127.0.0.1", port=int(port or 0))
    print(f"health http://{host or '127.0.0.1'}:{server.server_port}", flush=True)
    stop, trigger = threading.Event(), threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def lead() -> None:
        metrics.leader.set(1)
        log.info("%s: leading", a.identity)
        for kind in ("pods", "modeldeployments"):
            threading.Thread(target=watch_forever, args=(kube, kind, trigger, stop, metrics),
                             daemon=True).start()

        async def run() -> None:
            client = await connect(a.address, a.namespace, stop)
            if client is None:
                return
            rec = Reconciler(kube=kube, temporal=client, metrics=metrics,
                             namespaces=a.watch_namespace,
                             settings=WatcherSettings(
                                 task_queue=a.task_queue, budgets=budgets,
                                 routerless_policy=RouterlessPolicy(a.routerless_policy),
                                 quiet_window_s=a.quiet_window))
            await act(rec, resync=a.resync, stop=stop, health=health, trigger=trigger)

        asyncio.run(run())

    if not a.leader_elect:
        lead()
        return 0
    health.ready = True  # a standby is ready: it serves by waiting
    # The Lease lock talks through the client's default configuration: load it first.
    if a.kubeconfig:
        kconfig.load_kube_config(config_file=a.kubeconfig)
    else:
        kconfig.load_incluster_config()
    lock = LeaseLock(a.lease_name, a.lease_namespace, a.identity)
    cfg = electionconfig.Config(
        lock, lease_duration=a.lease_seconds, renew_deadline=max(2, a.lease_seconds * 2 // 3),
        retry_period=max(1, a.lease_seconds // 5), onstarted_leading=lead,
        onstopped_leading=lambda: os._exit(1))  # lost the lease: exit, a standby takes over
    threading.Thread(target=leaderelection.LeaderElection(cfg).run, daemon=True).start()
    stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
