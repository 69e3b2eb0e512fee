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
import math
import os
import signal
import socket
import threading
import uuid

from kubernetes import config as kconfig
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock
from pydantic import ValidationError

from connection.client import connect_retrying
from connection.errors import ConnectionConfigError
from connection.flags import ConnectionFlags, add_connection_flags, add_task_queue_flag
from connection.process import (
    DEFAULT_LOG_LEVEL,
    LOG_FORMAT,
    LOG_LEVEL_ENV,
    LOG_LEVELS,
    OneLineParser,
    end_process,
    error_line,
    fail,
    kubeconfig_error,
)
from connection.settings import resolve
from kube.client import Kube
from retirement.budgets import Budgets
from retirement.models import RouterlessPolicy
from retirement.text import is_decimal
from watcher.controller import Controller
from watcher.informer import KubeSource
from watcher.metrics import Health, WatcherMetrics, serve_health
from watcher.reconcile import Reconciler, WatcherSettings

log = logging.getLogger("retire-watcher")
PROG = "retire-watcher"


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Flags (defaults from the environment); a bad value exits 2 with one line naming it."""
    # Long (over 60 lines) by design: one add_argument per flag, nothing else.
    env = os.environ
    p = OneLineParser(prog=PROG, description=__doc__)
    add_connection_flags(p)
    add_task_queue_flag(p, environ=env)
    p.add_argument(
        "--kubeconfig",
        default=env.get("KUBECONFIG") or None,
        help="kubeconfig file (KUBECONFIG; default: in-cluster configuration)",
    )
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
    p.add_argument(
        "--health-address",
        default="127.0.0.1:0",
        metavar="HOST:PORT",
        help="serve /healthz, /readyz and /metrics here (port 0: any free port; "
        "default 127.0.0.1:0)",
    )
    p.add_argument("--leader-elect", action="store_true")
    p.add_argument("--lease-namespace", default="default")
    p.add_argument("--lease-name", default="retire-watcher")
    p.add_argument("--lease-seconds", type=int, default=15)
    p.add_argument("--identity", default=f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    p.add_argument(
        "--log-level",
        type=str.lower,
        choices=LOG_LEVELS,
        help=f"the least severe log lines written ({LOG_LEVEL_ENV}; default {DEFAULT_LOG_LEVEL})",
    )
    a = p.parse_args(argv)
    for flag, value in (("--resync", a.resync), ("--refresh", a.refresh)):
        if not (math.isfinite(value) and value > 0):
            p.error(f"{flag} {value:g}: must be a positive number of seconds")
    if not (math.isfinite(a.quiet_window) and a.quiet_window >= 0):
        p.error(f"--quiet-window {a.quiet_window:g}: must be a number of seconds, 0 or more")
    if a.workers < 1:
        p.error(f"--workers {a.workers}: must be at least 1")
    if a.lease_seconds < 3:
        p.error(f"--lease-seconds {a.lease_seconds}: must be at least 3")
    if _health_address(a.health_address) is None:
        p.error(
            f"--health-address {a.health_address!r}: not HOST:PORT "
            "(a host, a colon, a port 0-65535)"
        )
    if not a.task_queue.strip():
        p.error("--task-queue (or RETIRE_TASK_QUEUE) is empty")
    if a.log_level is None:
        given = env.get(LOG_LEVEL_ENV) or DEFAULT_LOG_LEVEL
        if given.lower() not in LOG_LEVELS:
            p.error(f"{LOG_LEVEL_ENV}={given!r} (--log-level): choose from {', '.join(LOG_LEVELS)}")
        a.log_level = given.lower()
    return a


def _health_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` as (host, port), an empty host meaning 127.0.0.1; None if malformed."""
    host, sep, port = text.rpartition(":")
    if not sep or not is_decimal(port) or int(port) > 65535:
        return None
    return host or "127.0.0.1", int(port)


def _budgets_error(error: ValidationError) -> str:
    """pydantic's errors as ``field: reason; ...`` (its text spans lines and links docs)."""
    parts = []
    for e in error.errors():
        where = ".".join(str(x) for x in e["loc"])
        parts.append(f"{where}: {e['msg']}" if where else e["msg"])
    return error_line(ValueError("; ".join(parts)))


def main(argv: list[str] | None = None) -> int:
    """Entry point: 2 for a bad setting (one line naming it); once serving, the process
    ends here (``connection.process.end_process``): 0 after SIGTERM/SIGINT."""
    # Over 60 lines: the process's start-up in the order it happens (settings, clients,
    # health server, then leading or standing by); not split in this refactor of
    # reconcile.py, whose behaviour it must not change.
    a = parse(argv)
    logging.basicConfig(level=a.log_level.upper(), format=LOG_FORMAT, force=True)
    try:
        connection = resolve(ConnectionFlags.from_args(a), environ=os.environ)
    except ConnectionConfigError as e:
        return fail(PROG, 2, str(e))
    try:
        budgets = Budgets.model_validate_json(a.budgets)
    except ValidationError as e:
        return fail(PROG, 2, f"--budgets: {_budgets_error(e)}")
    try:
        kube = Kube.from_config(kubeconfig=a.kubeconfig, program=PROG)
        if a.leader_elect:
            # The Lease lock talks through the client's default configuration: load it too.
            if a.kubeconfig:
                kconfig.load_kube_config(config_file=a.kubeconfig)
            else:
                kconfig.load_incluster_config()
    except Exception as e:  # a missing file, bad YAML, not a kubeconfig, no cluster env
        return fail(PROG, 2, kubeconfig_error(a.kubeconfig, e))
    metrics, health = WatcherMetrics(), Health()
    host, port = _health_address(a.health_address) or ("127.0.0.1", 0)
    try:
        server = serve_health(metrics, health, host=host, port=port)
    except (OSError, OverflowError) as e:  # in use, not an address of this host, unresolvable
        return fail(
            PROG, 2, f"--health-address {a.health_address}: cannot listen there: {error_line(e)}"
        )
    print(f"health http://{host}:{server.server_port}", flush=True)
    log.debug("Temporal at %s", connection.describe())
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
        end_process(0)
    health.standby = True  # a standby is ready: it serves by waiting (until it leads)
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
    end_process(0)


if __name__ == "__main__":
    raise SystemExit(main())
