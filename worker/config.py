"""Worker configuration: the shared Temporal connection flags plus the worker's own."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from activities.fairslots import DEFAULT_WAIT_SLOTS, FairSlots, WorkerSlots
from activities.polling import DEFAULT_POLL_SLOTS
from activities.sampling import DEFAULT_EXEC_SLOTS
from connection.flags import ConnectionFlags, add_connection_flags, add_task_queue_flag
from connection.process import (
    DEFAULT_LOG_LEVEL,
    LOG_LEVEL_ENV,
    LOG_LEVELS,
    OneLineParser,
)
from connection.settings import ConnectionSettings, resolve
from retirement.text import is_decimal
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
    #: Drain reads (``pods/exec``) this worker runs at once (``activities.fairslots.FairSlots``).
    max_concurrent_execs: int = DEFAULT_MAX_EXECS
    #: Polls (one round of a polling phase) run at once (``activities.polling``).
    max_concurrent_polls: int = DEFAULT_POLL_SLOTS
    #: Waits for idle in an engine's container run at once (``activities.idle_wait``).
    max_concurrent_waits: int = DEFAULT_WAIT_SLOTS
    #: ``host:port`` of the Prometheus endpoint (SDK and product metrics); None: off.
    metrics_address: str | None = None
    #: What this process hosts: workflows, activities, or both (``worker.build.Serves``).
    serves: Serves = Serves.ALL
    #: ``--log-level``: debug, info, warning or error.
    log_level: str = "info"

    def slots(self) -> WorkerSlots:
        """The worker's exec, poll and wait slots, sized by ``--max-concurrent-execs``,
        ``--max-concurrent-polls`` and ``--max-concurrent-waits``: its activities own them
        (``RetirementActivities``)."""
        return WorkerSlots(
            execs=FairSlots(self.max_concurrent_execs),
            polls=FairSlots(self.max_concurrent_polls),
            waits=FairSlots(self.max_concurrent_waits),
        )

    @classmethod
    def parse(
        cls, argv: list[str] | None = None, *, environ: Mapping[str, str] = os.environ
    ) -> WorkerConfig:
        """Parse ``argv`` and ``environ``; a bad value exits 2 with one line naming the flag
        (and the variable it came from); a bad connection raises ConnectionConfigError."""
        p = parser(environ=environ)
        a = p.parse_args(argv)
        slots = {
            dest: _count(p, a, environ, dest=dest, variable=variable, default=default)
            for dest, variable, default in _COUNTS
        }
        serve = _from(a, environ, "serve", "RETIRE_SERVE")
        if serve.value is not None and serve.value not in {s.value for s in Serves}:
            p.error(f"{serve.said}: choose from {', '.join(s.value for s in Serves)}")
        metrics = _from(a, environ, "metrics_address", "RETIRE_METRICS_ADDRESS")
        if metrics.value is not None and not _host_port(metrics.value):
            p.error(f"{metrics.said}: not HOST:PORT (a host, a colon, a port 1-65535)")
        level = _from(a, environ, "log_level", LOG_LEVEL_ENV)
        if level.value is not None and level.value.lower() not in LOG_LEVELS:
            p.error(f"{level.said}: choose from {', '.join(LOG_LEVELS)}")
        if not a.task_queue.strip():
            p.error("--task-queue (or RETIRE_TASK_QUEUE) is empty")
        return cls(
            connection=resolve(ConnectionFlags.from_args(a), environ=environ),
            task_queue=a.task_queue,
            kubeconfig=a.kubeconfig,
            max_concurrent_activities=slots["max_concurrent_activities"],
            max_concurrent_execs=slots["max_concurrent_execs"],
            max_concurrent_polls=slots["max_concurrent_polls"],
            max_concurrent_waits=slots["max_concurrent_waits"],
            metrics_address=metrics.value or None,
            serves=Serves(serve.value or Serves.ALL.value),
            log_level=(level.value or DEFAULT_LOG_LEVEL).lower(),
        )


@dataclass(frozen=True)
class _Given:
    """A setting's value and how the user named it: the flag, or the variable behind it."""

    value: Any
    said: str
    """How the user said it, for a message: ``--flag 'value'`` or ``VARIABLE='value' (--flag)``."""


def _from(a: argparse.Namespace, environ: Mapping[str, str], dest: str, variable: str) -> _Given:
    """The flag ``dest`` when given, else the variable ``variable`` (empty means unset)."""
    flag = "--" + dest.replace("_", "-")
    given = getattr(a, dest)
    if given is not None:
        return _Given(given, f"{flag} {given!r}")
    value = environ.get(variable) or None
    return _Given(value, f"{variable}={value!r} ({flag})")


def _count(
    p: argparse.ArgumentParser,
    a: argparse.Namespace,
    environ: Mapping[str, str],
    *,
    dest: str,
    variable: str,
    default: int,
) -> int:
    """A count of at least 1 from its flag or its variable; a usage error otherwise."""
    given = _from(a, environ, dest, variable)
    if given.value is None:
        return default
    raw = given.value
    if isinstance(raw, str) and not is_decimal(raw.strip()):  # a variable (a flag is an int)
        p.error(f"{given.said}: not a whole number")
    value = int(raw)
    if value < 1:
        p.error(f"{given.said}: must be at least 1")
    return value


#: Activity slots of one worker.  Every polling phase holds a slot for its whole length
#: (a drain of a long generation: minutes), and a retirement holds at most two at once, so
#: this carries 256 retirements at a time.  A slot is a thread that mostly waits (512 idle
#: threads cost about 8 MB of RSS, measured); the worker benchmark (``make bench``) shows
#: what a busy fleet costs.
DEFAULT_MAX_ACTIVITIES = 512


def parser(*, environ: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    """The worker's flags.  A flag not given falls back to its variable (read, and checked,
    by ``WorkerConfig.parse``, so that a bad value names the variable)."""
    p = OneLineParser(
        prog="retire-worker", description="Hosts RetirementWorkflow and its activities."
    )
    add_connection_flags(p)
    add_task_queue_flag(p, environ=environ)
    p.add_argument(
        "--kubeconfig",
        default=environ.get("KUBECONFIG") or None,
        help="kubeconfig file (KUBECONFIG; default: in-cluster configuration)",
    )
    p.add_argument(
        "--max-concurrent-activities",
        type=int,
        help="activity slots, one thread each (a retirement holds at most two at once: its "
        "phase and a status publish) (RETIRE_MAX_ACTIVITIES; "
        f"default {DEFAULT_MAX_ACTIVITIES})",
    )
    p.add_argument(
        "--max-concurrent-execs",
        type=int,
        help="drain reads (pods/exec) run at once; a read that finds no free slot within "
        "a few seconds reads UNKNOWN and is retried later (RETIRE_MAX_EXECS; "
        f"default {DEFAULT_MAX_EXECS})",
    )
    p.add_argument(
        "--max-concurrent-polls",
        type=int,
        help="polls (one round of a polling phase: its API reads) run at once; the others "
        f"wait their turn, heartbeating (RETIRE_MAX_POLLS; default {DEFAULT_POLL_SLOTS})",
    )
    p.add_argument(
        "--max-concurrent-waits",
        type=int,
        help="waits for an engine to go idle (one exec each, a process waiting in its "
        "container) run at once; past them a busy member is read at a plain spacing, "
        f"an exec per read (RETIRE_MAX_WAITS; default {DEFAULT_WAIT_SLOTS})",
    )
    p.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus metrics (the SDK's and the product's) at "
        "http://HOST:PORT/metrics (RETIRE_METRICS_ADDRESS)",
    )
    p.add_argument(
        "--serve",
        choices=[s.value for s in Serves],
        help="host workflows and activities in this process (all, the default), or only "
        "one of them: two processes on one task queue keep the workflow tasks clear of the "
        "activities' work (RETIRE_SERVE)",
    )
    p.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.lower,
        help=f"the least severe log lines written ({LOG_LEVEL_ENV}; default {DEFAULT_LOG_LEVEL})",
    )
    return p


#: (argparse dest, variable, default) of the worker's counts.
_COUNTS = (
    ("max_concurrent_activities", "RETIRE_MAX_ACTIVITIES", DEFAULT_MAX_ACTIVITIES),
    ("max_concurrent_execs", "RETIRE_MAX_EXECS", DEFAULT_MAX_EXECS),
    ("max_concurrent_polls", "RETIRE_MAX_POLLS", DEFAULT_POLL_SLOTS),
    ("max_concurrent_waits", "RETIRE_MAX_WAITS", DEFAULT_WAIT_SLOTS),
)


def _host_port(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and is_decimal(port) and 0 < int(port) < 65536)
