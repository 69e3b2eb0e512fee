"""Worker configuration: the shared Temporal connection flags plus the worker's own."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass

from activities.drain import DEFAULT_EXEC_SLOTS
from activities.polling import DEFAULT_POLL_SLOTS
from connection.flags import ConnectionFlags, add_connection_flags, add_task_queue_flag
from connection.settings import ConnectionSettings, resolve
from worker.build import Serves

#: Execs at once, by default: enough for the reads of hundreds of retirements spaced as the
#: drain spaces them (a busy member is read every 8 s, an idle one every second; one read
#: takes ~0.1-0.2 s), and a bound on the burst when many start together.
DEFAULT_MAX_EXECS = DEFAULT_EXEC_SLOTS


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """Where the worker connects and what it serves."""

    connection: ConnectionSettings
    task_queue: str
    kubeconfig: str | None
    max_concurrent_activities: int
    #: Drain reads (``pods/exec``) this worker runs at once (``activities.drain.ExecSlots``).
    max_concurrent_execs: int = DEFAULT_MAX_EXECS
    #: Polls (one round of a polling phase) run at once (``activities.polling.poll_slots``).
    max_concurrent_polls: int = DEFAULT_POLL_SLOTS
    #: ``host:port`` of the Prometheus endpoint (SDK and product metrics); None: off.
    metrics_address: str | None = None
    #: What this process hosts: workflows, activities, or both (``worker.build.Serves``).
    serves: Serves = Serves.ALL

    @classmethod
    def parse(
        cls, argv: list[str] | None = None, *, environ: Mapping[str, str] = os.environ
    ) -> WorkerConfig:
        """Parse ``argv``; usage errors exit 2, a bad connection raises ConnectionConfigError."""
        p = parser(environ=environ)
        a = p.parse_args(argv)
        if a.max_concurrent_activities < 1:
            p.error("--max-concurrent-activities must be at least 1")
        if a.max_concurrent_execs < 1:
            p.error("--max-concurrent-execs must be at least 1")
        if a.max_concurrent_polls < 1:
            p.error("--max-concurrent-polls must be at least 1")
        if a.serve not in {s.value for s in Serves}:  # a default from RETIRE_SERVE
            p.error(f"--serve {a.serve!r}: choose from {', '.join(s.value for s in Serves)}")
        if a.metrics_address and not _host_port(a.metrics_address):
            p.error(f"--metrics-address {a.metrics_address!r} is not HOST:PORT")
        return cls(
            connection=resolve(ConnectionFlags.from_args(a), environ=environ),
            task_queue=a.task_queue,
            kubeconfig=a.kubeconfig,
            max_concurrent_activities=a.max_concurrent_activities,
            max_concurrent_execs=a.max_concurrent_execs,
            max_concurrent_polls=a.max_concurrent_polls,
            metrics_address=a.metrics_address or None,
            serves=Serves(a.serve),
        )


#: Activity slots of one worker.  Every polling phase holds a slot for its whole length
#: (a drain of a long generation: minutes), and a retirement holds at most two at once, so
#: this carries 256 retirements at a time.  A slot is a thread that mostly waits (512 idle
#: threads cost about 8 MB of RSS, measured); the worker benchmark (``make bench``) shows
#: what a busy fleet costs.
DEFAULT_MAX_ACTIVITIES = 512


def parser(*, environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """The worker's flags (worker defaults from KUBECONFIG and RETIRE_MAX_ACTIVITIES)."""
    p = argparse.ArgumentParser(
        prog="retire-worker", description="Hosts RetirementWorkflow and its activities."
    )
    add_connection_flags(p)
    add_task_queue_flag(p, environ=environ)
    p.add_argument(
        "--kubeconfig",
        default=environ.get("KUBECONFIG") or None,
        help="kubeconfig file (default: in-cluster configuration)",
    )
    p.add_argument(
        "--max-concurrent-activities",
        type=int,
        default=int(environ.get("RETIRE_MAX_ACTIVITIES", str(DEFAULT_MAX_ACTIVITIES))),
        help="activity slots, one thread each (a retirement holds at most two at once: its "
        f"phase and a status publish); default {DEFAULT_MAX_ACTIVITIES}",
    )
    p.add_argument(
        "--max-concurrent-execs",
        type=int,
        default=int(environ.get("RETIRE_MAX_EXECS", str(DEFAULT_MAX_EXECS))),
        help="drain reads (pods/exec) run at once; a read that finds no free slot within "
        f"a few seconds reads UNKNOWN and is retried later; default {DEFAULT_MAX_EXECS}",
    )
    p.add_argument(
        "--max-concurrent-polls",
        type=int,
        default=int(environ.get("RETIRE_MAX_POLLS", str(DEFAULT_POLL_SLOTS))),
        help="polls (one round of a polling phase: its API reads) run at once; the others "
        f"wait their turn, heartbeating; default {DEFAULT_POLL_SLOTS}",
    )
    p.add_argument(
        "--metrics-address",
        default=environ.get("RETIRE_METRICS_ADDRESS") or None,
        metavar="HOST:PORT",
        help="serve Prometheus metrics (the SDK's and the product's) at http://HOST:PORT/metrics",
    )
    p.add_argument(
        "--serve",
        choices=[s.value for s in Serves],
        default=environ.get("RETIRE_SERVE", Serves.ALL.value),
        help="host workflows and activities in this process (all, the default), or only "
        "one of them: two processes on one task queue keep the workflow tasks clear of the "
        "activities' work",
    )
    return p


def _host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)
