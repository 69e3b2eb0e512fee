"""``python -m watcher``: turn removal intents into retirements, maintain eligibility.

A controller (``watcher.controller``): informer caches of ModelDeployments and Pods fed
by list+watch, a work queue of deployments, and a level-based reconcile of each
deployment an event touched; every deployment again every ``--resync`` seconds, and the
running retirements from Temporal's visibility every ``--refresh`` seconds.  With
``--leader-elect`` a Kubernetes Lease elects one acting watcher among several; the others
stand by and take over within the lease time.
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

from kubernetes import config as kconfig
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from connection.client import connect_retrying
from connection.errors import ConnectionConfigError
from connection.flags import ConnectionFlags, add_connection_flags, add_task_queue_flag
from connection.settings import resolve
from kube.client import Kube
from retirement.budgets import Budgets
from retirement.models import RouterlessPolicy
from watcher.controller import Controller
from watcher.informer import KubeSource
from watcher.metrics import Health, WatcherMetrics, serve_health
from watcher.reconcile import Reconciler, WatcherSettings

log = logging.getLogger("retire-watcher")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Flags (defaults from the environment)."""
    env = os.environ
    p = argparse.ArgumentParser(prog="retire-watcher", description=__doc__)
    add_connection_flags(p)
    add_task_queue_flag(p, environ=env)
    p.add_argument("--kubeconfig", default=env.get("KUBECONFIG") or None)
    p.add_argument(
        "--watch-namespace",
        action="append",
        default=None,
        help="reconcile only these Kubernetes namespaces (repeatable)",
    )
    p.add_argument(
        "--resync", type=float, default=60.0, help="seconds between full resyncs (a safety net)"
    )
    p.add_argument(
        "--refresh",
        type=float,
        default=2.0,
        help="seconds between visibility queries for the running retirements",
    )
    p.add_argument("--workers", type=int, default=4, help="concurrent reconciles")
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
    if a.resync <= 0 or a.refresh <= 0 or a.workers < 1 or a.lease_seconds < 3:
        p.error(
            "--resync and --refresh must be positive, --workers at least 1 and "
            "--lease-seconds at least 3"
        )
    return a


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    a = parse(argv)
    try:
        connection = resolve(ConnectionFlags.from_args(a), environ=os.environ)
    except ConnectionConfigError as e:
        print(f"retire-watcher: {e}", file=sys.stderr)
        return 2
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
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def lead() -> None:
        health.standby = False  # acting now: ready once a pass ended healthy
        metrics.leader.set(1)
        log.info("%s: leading", a.identity)

        async def run() -> None:
            client = await connect_retrying(connection, stop=stop)
            if client is None:
                return
            rec = Reconciler(
                kube=kube,
                temporal=client,
                metrics=metrics,
                namespaces=a.watch_namespace,
                settings=WatcherSettings(
                    task_queue=a.task_queue,
                    budgets=budgets,
                    routerless_policy=RouterlessPolicy(a.routerless_policy),
                    quiet_window_s=a.quiet_window,
                ),
            )
            controller = Controller(
                rec=rec,
                source=KubeSource(kube),
                health=health,
                resync_s=a.resync,
                refresh_s=a.refresh,
                workers=a.workers,
            )
            await controller.run(stop)

        asyncio.run(run())

    if not a.leader_elect:
        lead()
        return 0
    health.standby = True  # a standby is ready: it serves by waiting (until it leads)
    # The Lease lock talks through the client's default configuration: load it first.
    if a.kubeconfig:
        kconfig.load_kube_config(config_file=a.kubeconfig)
    else:
        kconfig.load_incluster_config()
    lock = LeaseLock(a.lease_name, a.lease_namespace, a.identity)
    cfg = electionconfig.Config(
        lock,
        lease_duration=a.lease_seconds,
        renew_deadline=max(2, a.lease_seconds * 2 // 3),
        retry_period=max(1, a.lease_seconds // 5),
        onstarted_leading=lead,
        onstopped_leading=lambda: os._exit(1),
    )  # lost the lease: exit, a standby takes over
    threading.Thread(target=leaderelection.LeaderElection(cfg).run, daemon=True).start()
    stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
