"""Which deployments have a running retirement, from Temporal's visibility, cached.

One visibility query (``WorkflowType = 'Retirement' AND ExecutionStatus = 'Running'``,
paged) per refresh replaces two RPCs per deployment per pass: a deployment with no
running retirement and no intent costs the watcher no Temporal call at all.

Visibility lags behind the workflows a little, so the cache is a hint that errs on the
side of looking: a retirement the watcher just started counts as running at once
(``started``); one that disappeared from the list is kept as ``ended`` until the
deployment's reconcile has described it (it may still be running, or have ended refused:
each ended run is read once).

The same listing says which of them hold (``held``): a running retirement whose
``RetirementOutcome`` search attribute is ``Aborted`` (the workflow upserts it on every
outcome change, ``workflows/mirror.py``).  The watcher exports them
(``retire_watcher_retirement_held{deployment}``, ``watcher.metrics``): one source for the
whole fleet, whichever worker ran the workflow's last task, and a retirement that ended
or was terminated drops out of the listing, so out of the series, at the next refresh.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from retirement.phases import Outcome
from watcher.fleet import Key
from watcher.retirements import Retirements
from workflows.mirror import SA_OUTCOME

#: The workflow type every retirement runs as.
WORKFLOW_TYPE = "Retirement"
QUERY = f"WorkflowType = '{WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"


def deployment_of(workflow_id: str) -> Key | None:
    """The deployment a retirement's workflow ID names (``retirement/<ns>/<name>``)."""
    kind, _, rest = workflow_id.partition("/")
    ns, _, name = rest.partition("/")
    if kind != "retirement" or not ns or not name or "/" in name:
        return None
    return ns, name


def holds(listed: Any) -> bool:
    """Whether a listed running retirement holds: its ``RetirementOutcome`` search
    attribute reads ``Aborted`` (an entry without search attributes does not)."""
    attrs = getattr(listed, "typed_search_attributes", None)
    return attrs is not None and attrs.get(SA_OUTCOME) == Outcome.ABORTED.value


@dataclass
class RunningSet:
    """Running retirements by deployment, and those seen ending but not yet read."""

    namespaces: frozenset[str] | None = None  # None: every namespace
    running: dict[Key, str] = field(default_factory=dict)  # deployment -> workflow ID
    ended: set[Key] = field(default_factory=set)
    #: The running retirements whose last listing said they hold (outcome Aborted).
    held: set[Key] = field(default_factory=set)
    refreshes: int = field(default=0, init=False)

    def mine(self, key: Key) -> bool:
        """Whether the deployment ``key`` is in this watcher's scope."""
        return self.namespaces is None or key[0] in self.namespaces

    def may_run(self, key: Key) -> bool:
        """Whether the deployment may have a running (or just ended, unread) retirement:
        only then does its reconcile ask Temporal."""
        return key in self.running or key in self.ended

    def replace(self, listed: Iterable[str], held: Iterable[str] = ()) -> set[Key]:
        """A fresh visibility listing of running workflow IDs (``held``: those of them
        that hold); the deployments whose running retirement appeared or disappeared."""
        now: dict[Key, str] = {}
        for wid in listed:
            key = deployment_of(wid)
            if key is not None and self.mine(key):
                now[key] = wid
        holding = {deployment_of(wid) for wid in held}
        gone = set(self.running) - set(now)
        self.ended |= gone
        changed = gone | (set(now) - set(self.running))
        self.running = now
        self.held = {key for key in now if key in holding}
        self.refreshes += 1
        return changed

    def started(self, key: Key, workflow_id: str) -> None:
        """The watcher started (or found running) the retirement of ``key``."""
        self.running[key] = workflow_id
        self.ended.discard(key)

    def not_running(self, key: Key) -> None:
        """The deployment's retirement was described as not running (and read)."""
        self.running.pop(key, None)
        self.ended.discard(key)
        self.held.discard(key)

    def forget(self, key: Key) -> None:
        """The deployment is gone and nothing of it runs."""
        self.not_running(key)

    async def refresh(self, retirements: Retirements) -> set[Key]:
        """List the running retirements (one paged visibility query); see ``replace``."""
        listed = await retirements.listing(QUERY)
        return self.replace([wf.id for wf in listed], [wf.id for wf in listed if holds(wf)])
