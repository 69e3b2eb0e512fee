"""The applying half of the watcher's eligibility-label repair.

``retirement.eligibility.label_repair`` decides which Pods of a deployment lose the label
and which get it; this module applies it: the members of an active retirement are
protected (``Active``), Temporal is asked that no retirement runs before a label is put
on (the running set is only a cached hint), and each write is bound to the Pod's UID and
the value read (``kube.members.set_eligibility``).  ``role_shape`` memoises the shape
reading every repair needs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from kube.api import KubeApi
from kube.deployment import ModelDeployment, Role
from kube.members import LabelChange, set_eligibility
from kube.objects import Pod, pod_ready
from retirement.eligibility import label_repair
from retirement.models import RetirementState, workflow_id_for
from retirement.names import LABEL_COMPONENT, LABEL_ELIGIBLE, LABEL_ORDINAL
from retirement.shape import ShapeReading, read_shape
from watcher.metrics import WatcherMetrics
from watcher.retirements import Retirements, WorkflowNotFound
from watcher.running import RunningSet


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
class LabelRepairs:
    """Applies the label repair of one deployment at a time."""

    kube: KubeApi
    retirements: Retirements
    running: RunningSet
    metrics: WatcherMetrics

    async def maintain(
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
