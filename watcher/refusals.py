"""The watcher's memory of refused intents, and their back-off.

A refused intent (admission refused it, or it cannot even be requested) is remembered with
its reason, what the refusal was decided on (``depends_on``: the deployment's UID and
generation, the intent, the replica's Pods) and a back-off: 30 s doubling to 10 min while
it recurs.  It is not tried again before the back-off ends, unless what it depended on
changed: then it is tried at once.  The memory is in the process only: a restarted
watcher tries each intent once more.

Pure: no I/O, no metrics, no logging; the time is read from the injected ``clock`` (the
reconciler's, ``time.monotonic`` in production, a fake clock in tests).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, MutableMapping
from dataclasses import dataclass, field

from kube.deployment import ModelDeployment
from kube.objects import Pod
from retirement.models import IntentKind
from retirement.names import LABEL_COMPONENT, LABEL_ELIGIBLE, LABEL_ORDINAL

Key = tuple[str, str]  # namespace, deployment (as ``watcher.fleet.Key``)
RefusalKey = tuple[str, str, str, int]  # namespace, deployment, role, ordinal


@dataclass
class Refusal:
    """A remembered refusal of one intent (deployment, role, ordinal)."""

    reason: str
    depends_on: Hashable  # what the refusal was decided on; a change ends the back-off
    backoff_s: float
    until: float  # the reconciler's clock: not tried again before this


@dataclass(eq=False)  # compared as a mapping (``Mapping.__eq__``)
class Refusals(MutableMapping[RefusalKey, Refusal]):
    """Remembered refusals by intent; a mapping of ``RefusalKey`` to ``Refusal``."""

    clock: Callable[[], float]
    backoff_s: float = 30.0  # the first back-off
    backoff_max_s: float = 600.0  # the back-off doubles up to this
    _memory: dict[RefusalKey, Refusal] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------ the mapping

    def __getitem__(self, key: RefusalKey) -> Refusal:
        return self._memory[key]

    def __setitem__(self, key: RefusalKey, value: Refusal) -> None:
        self._memory[key] = value

    def __delitem__(self, key: RefusalKey) -> None:
        del self._memory[key]

    def __iter__(self) -> Iterator[RefusalKey]:
        return iter(self._memory)

    def __len__(self) -> int:
        return len(self._memory)

    # ------------------------------------------------------------ the rules

    def refuse(self, key: RefusalKey, depends_on: Hashable, reason: str) -> Refusal:
        """Remember a refusal of ``key`` and back off: the first back-off, doubled (up to
        the max) when the intent was already refused."""
        prev = self._memory.get(key)
        backoff = self.backoff_s if prev is None else min(prev.backoff_s * 2, self.backoff_max_s)
        refusal = Refusal(
            reason=reason, depends_on=depends_on, backoff_s=backoff, until=self.clock() + backoff
        )
        self._memory[key] = refusal
        return refusal

    def holds_back(self, key: RefusalKey, depends_on: Hashable) -> bool:
        """Whether the intent ``key`` must not be tried now: it was refused on the same
        ``depends_on`` and its back-off has not ended.  A refusal decided on something
        that has changed since is forgotten (the intent is tried at once)."""
        refusal = self._memory.get(key)
        if refusal is None:
            return False
        if refusal.depends_on != depends_on:
            del self._memory[key]
            return False
        return self.clock() < refusal.until

    def of(self, deployment: Key) -> list[RefusalKey]:
        """The remembered refusals of the deployment's intents."""
        return [k for k in self._memory if k[:2] == deployment]

    def has(self, deployment: Key) -> bool:
        """Whether a refusal of an intent of ``deployment`` is remembered."""
        return any(k[:2] == deployment for k in self._memory)

    def forget_deployment(self, deployment: Key) -> None:
        """Forget every refusal of ``deployment`` (it is gone)."""
        for k in self.of(deployment):
            del self._memory[k]

    def prune(self, deployment: Key, live: Iterable[tuple[str, int]]) -> int:
        """Forget the refusals of ``deployment`` whose intent (role, ordinal) is not in
        ``live`` any more; returns how many of the others still back off."""
        alive = set(live)
        now, backing_off = self.clock(), 0
        for key in self.of(deployment):
            if key[2:] not in alive:
                del self._memory[key]
            elif now < self._memory[key].until:
                backing_off += 1
        return backing_off

    def next_wait(self, deployment: Key) -> float | None:
        """Seconds until the earliest back-off of ``deployment`` ends (0 when one already
        has), None when none of its intents is remembered as refused."""
        now = self.clock()
        waits = [r.until - now for k, r in self._memory.items() if k[:2] == deployment]
        return max(0.0, min(waits)) if waits else None


def depends_on(
    md: ModelDeployment,
    pods: list[Pod],
    kind: IntentKind,
    role: str,
    ordinal: int,
    members: tuple[str, ...] | list[str],
) -> Hashable:
    """What a refusal of the intent (``kind``, ``role``, ``ordinal``, ``members``) was
    decided on: the deployment (UID, generation), the intent, and the replica's Pods
    (identity, start, readiness, address, labels other than eligibility, annotations)."""
    replica = sorted(
        (
            p.uid,
            p.name,
            p.terminating,
            p.pod_ip or "",
            p.conditions.get("Ready", ""),
            tuple(sorted((s.name, s.container_id) for s in p.container_statuses)),
            tuple(sorted((k, v) for k, v in p.labels.items() if k != LABEL_ELIGIBLE)),
            tuple(sorted(p.annotations.items())),
        )
        for p in pods
        if p.labels.get(LABEL_COMPONENT) == role and p.labels.get(LABEL_ORDINAL) == str(ordinal)
    )
    return (md.uid, md.generation, str(kind), tuple(members), tuple(replica))
