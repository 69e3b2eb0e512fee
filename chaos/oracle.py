"""The campaign's judge: the safety invariants, checked against evidence the product does
not write (the API server's audit log, the engines' own request journals, the load
generator's record), never against the product's view of itself.  Pure: every input is a
value, so each invariant is unit-tested with a violation it must catch.

1. ``in-flight``: no Pod deleted by the worker while its engine had a request in flight,
   nor after it received one within ``window_s`` before the delete.
2. ``admitted``: every Pod the worker deleted was deleted with its UID as precondition,
   was a member of a retirement's admitted target, and its ordinal was not declared by
   the spec when the server received the delete.
3. ``attributed``: every failed client request overlaps an injected fault on its own
   path (``ON_PATH``: that deployment's router, engine or Pod), with a grace after it.
4. ``converged``: after the settle period each deployment has its declared Pods, all of
   them eligible, and no retirement is running (but one held by the router-less ``hold``
   policy, whose replica stays and serves).
5. ``bounded``: once the faults are over, every retirement comes to rest (ended, or held
   waiting for a person) within ``WAIT_BOUND_S``, and no run's history is longer than
   ``HISTORY_BOUND`` events.

A graceful delete (the preStop baseline: the Pod's grace period, its engine stopped by the
kubelet's sequence later) is judged at the engine's end instead of at the API call: it
breaks ``in-flight`` when a request the engine had taken was cut after the delete.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from chaos.audit import WORKER_AGENT, Audit, PodDelete

#: The fault kinds that sit on a client request's path (its router, its engine, its Pod,
#: its deployment deleted and re-created,
#: the label that lets a router select it):
#: only these excuse a failed request.  A killed or paused worker, a killed watcher or
#: Temporal server, a stalled API server, a label put back by hand, an engine whose
#: gauges stay up or whose /metrics answers garbage must cost no request.
ON_PATH = frozenset(
    {
        "kill-router",
        "stall-router",
        "restart-engine",
        "engine-silent",
        "delete-pod",
        "unlabel",
        "recreate",
    }
)

#: A spec write stored this close before a delete raced the product's last re-read of the
#: spec (``race``: reported beside the verdict, not a broken invariant).
RACE_S = 0.5

#: Seconds after an injected fault during which a client failure is still its doing (a
#: router restarts and re-learns its workers; a retried stream ends).
FAULT_GRACE_S = 15.0

#: Invariant 5: a retirement comes to rest within the overall budget (300 s, SPEC) and the
#: settle period's retry delay (30 s) of the faults' end.
WAIT_BOUND_S = 330.0

#: Invariant 5: events in one workflow run.  The workflow continues as new when the server
#: suggests it (4,096 events by default on the dev server and Temporal Server); a run
#: that outgrows this did not.
HISTORY_BOUND = 5_000

#: Phases a retirement rests in: ended, or held (``Aborted``) until a person decides.
RESTING = frozenset({"Completed", "Aborted"})


@dataclass(frozen=True)
class Journal:
    """One engine's requests as it recorded them: ``(admitted, ended, ok)`` and the
    admission times of those still open (wall clock)."""

    ended: list[tuple[float, float, bool]]
    open: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Fault:
    """An injected fault: its kind, its span and what it hits (a deployment's name, or
    ``*`` for every path)."""

    kind: str
    start: float
    end: float
    target: str


@dataclass(frozen=True)
class ClientFailure:
    """A failed client request through a deployment's router."""

    deployment: str
    start: float
    end: float
    kind: str


@dataclass(frozen=True)
class Settled:
    """One deployment after the settle period."""

    name: str
    declared: int  #: Pods the spec declares (replicas x group size)
    pods: int  #: Pods present (not terminating)
    eligible: int  #: of those, labelled endpoint-eligible
    running_retirements: int
    #: Of those, held by the router-less ``hold`` policy: by design a person decides, and
    #: the replica stays, serving (its Pods count on top of the declared ones).
    held_by_policy: int = 0
    #: Pods that should be eligible (None: every declared one; a leader-served group's
    #: replica serves through its leader only).
    serving: int | None = None
    #: The ModelDeployment itself is gone (the campaign meant it to exist).
    missing: bool = False


@dataclass(frozen=True)
class Violation:
    """One broken invariant, with the evidence that shows it."""

    invariant: str
    subject: str
    evidence: str


@dataclass
class Verdict:
    """Every invariant's result."""

    checked: dict[str, int]  #: invariant -> cases checked
    violations: list[Violation]
    #: Reported, not broken: a scale-up that raced a delete (``RACE_S``).
    races: list[Violation] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No invariant broken."""
        return not self.violations

    def failed(self, invariant: str) -> list[Violation]:
        """The violations of one invariant."""
        return [v for v in self.violations if v.invariant == invariant]


def in_flight_at_delete(
    d: PodDelete, journal: Journal | None, *, window_s: float
) -> Violation | None:
    """Invariant 1 for one delete."""
    if journal is None and not d.started:
        return None  # never started (the server's own record): no engine ever ran in it
    if journal is None:  # the journal is the only witness: without it, nothing is proven
        return Violation(
            "in-flight", f"{d.namespace}/{d.name} ({d.uid})", "no engine journal: cannot judge"
        )
    busy = [a for a in journal.open if a <= d.at]
    busy += [a for a, e, _ok in journal.ended if a <= d.at < e]
    if busy:
        return Violation(
            "in-flight",
            f"{d.namespace}/{d.name} ({d.uid})",
            f"deleted at {d.at:.3f} with {len(busy)} request(s) in flight, admitted at "
            + ", ".join(f"{a:.3f}" for a in sorted(busy)[:5]),
        )
    recent = [a for a, _e, _ok in journal.ended if d.at - window_s < a <= d.at]
    if recent:
        return Violation(
            "in-flight",
            f"{d.namespace}/{d.name} ({d.uid})",
            f"deleted at {d.at:.3f}, {d.at - max(recent):.3f} s after its engine was last "
            f"sent a request (window {window_s:g} s)",
        )
    return None


def cut_after_delete(d: PodDelete, journal: Journal | None) -> Violation | None:
    """Invariant 1 for a graceful delete (the Pod's grace period: preStop, SIGTERM,
    SIGKILL run later): broken when a request the engine had taken was cut (ended not
    answered) after the delete, or was still open when the journal was read."""
    subject = f"{d.namespace}/{d.name} ({d.uid})"
    if journal is None and not d.started:
        return None  # never started: no engine ever ran in it
    if journal is None:
        return Violation("in-flight", subject, "no engine journal: cannot judge")
    cut = [(a, e) for a, e, ok in journal.ended if not ok and e >= d.at]
    if cut or journal.open:
        ends = ", ".join(f"{e - d.at:.1f}" for _a, e in sorted(cut)[:5])
        return Violation(
            "in-flight",
            subject,
            f"deleted (gracefully) at {d.at:.3f}; {len(cut)} request(s) cut by its end"
            + (f", {ends} s after the delete" if cut else "")
            + (f"; {len(journal.open)} never ended" if journal.open else ""),
        )
    return None


def admitted_delete(d: PodDelete, audit: Audit, admitted_uids: set[str]) -> Violation | None:
    """Invariant 2 for one delete."""
    subject = f"{d.namespace}/{d.name} ({d.uid})"
    if d.precondition_uid != d.uid:
        return Violation(
            "admitted", subject, f"deleted with UID precondition {d.precondition_uid!r}"
        )
    if d.uid not in admitted_uids:
        return Violation("admitted", subject, "no retirement admitted this Pod UID")
    declared, since = audit.declared_since(d.namespace, d.deployment, d.at)
    if d.ordinal is None:
        return Violation("admitted", subject, "the deleted Pod carried no ordinal label")
    if declared is not None and d.ordinal < declared.get(d.role, 0):
        # A scale-up stored in the last moment before the delete raced the product's final
        # re-read of the spec: no delete can be made conditional on the ModelDeployment, so
        # it is reported, not counted as broken.
        kind = "race" if d.at - since < RACE_S else "admitted"
        return Violation(
            kind,
            subject,
            f"at {d.at:.3f} the spec declared {d.role} replicas={declared.get(d.role)} "
            f"(stored {d.at - since:.3f} s before), which includes ordinal {d.ordinal}",
        )
    return None


def attributed(failure: ClientFailure, faults: Iterable[Fault]) -> Violation | None:
    """Invariant 3 for one failed request."""
    for f in faults:
        if f.kind not in ON_PATH or f.target not in ("*", failure.deployment):
            continue
        if failure.start <= f.end + FAULT_GRACE_S and failure.end >= f.start:
            return None
    return Violation(
        "attributed",
        failure.deployment,
        f"request {failure.start:.3f}-{failure.end:.3f} failed ({failure.kind}) "
        "with no fault on its path (" + ", ".join(sorted(ON_PATH)) + ")",
    )


def converged(s: Settled) -> Violation | None:
    """Invariant 4 for one deployment."""
    if s.missing:
        return Violation("converged", s.name, "the ModelDeployment is missing")
    kept = s.held_by_policy  # a held replica is one Pod per member; the campaign's are single
    serving = s.declared if s.serving is None else s.serving
    if (
        s.pods == s.declared + kept
        and s.eligible == serving + kept
        and s.running_retirements == kept
    ):
        return None
    return Violation(
        "converged",
        s.name,
        f"declared {s.declared} Pods ({serving} serving), {s.pods} present, "
        f"{s.eligible} eligible, "
        f"{s.running_retirements} retirement(s) still running "
        f"({s.held_by_policy} held by the router-less hold policy)",
    )


@dataclass(frozen=True)
class Rest:
    """One retirement run for invariant 5: its phases (name, wall time), when it closed
    (None: still running) and its history's length."""

    workflow: str  #: workflow ID and run
    timeline: list[tuple[str, float]]
    history_length: int
    closed: float | None = None


def bounded(r: Rest, *, faults_over: float, ended: float) -> list[Violation]:
    """Invariant 5 for one run: at rest within ``WAIT_BOUND_S`` of the faults' end (or
    of its start, if later), its history within ``HISTORY_BOUND``."""
    out = []
    if r.history_length > HISTORY_BOUND:
        out.append(
            Violation("bounded", r.workflow, f"{r.history_length} history events in one run")
        )
    if not r.timeline:
        return out
    since = max(faults_over, r.timeline[0][1])
    resting_at = None
    for i, (phase, at) in enumerate(r.timeline):
        nxt = r.timeline[i + 1][1] if i + 1 < len(r.timeline) else None
        if phase.split(".")[-1] in RESTING and (nxt is None or nxt > since):
            resting_at = max(at, since)
            break
    if r.closed is not None:  # an ended run is at rest, whatever its last phase
        closed = max(r.closed, since)
        resting_at = closed if resting_at is None else min(resting_at, closed)
    waited = (ended if resting_at is None else resting_at) - since
    if waited > WAIT_BOUND_S:
        out.append(
            Violation(
                "bounded",
                r.workflow,
                f"{'not at rest' if resting_at is None else 'came to rest'} {waited:.0f} s "
                f"after the faults ended (bound {WAIT_BOUND_S:g} s)",
            )
        )
    return out


def evidence(audit: Audit, deployments: list[str], completed: int, judged: int) -> list[Violation]:
    """The witnesses themselves: the audit log holds every deployment's creation, and
    completed retirements left deletes in it."""
    created = {w.name for w in audit.specs if w.replicas is not None}
    out = [
        Violation("evidence", name, "the audit log holds no write of this deployment")
        for name in deployments
        if name not in created
    ]
    if completed and not judged:
        out.append(
            Violation("evidence", "*", f"{completed} retirement(s) completed, no delete judged")
        )
    return out


def judge(
    *,
    audit: Audit,
    journals: Mapping[str, Journal],
    admitted_uids: set[str],
    faults: list[Fault],
    failures: list[ClientFailure],
    settled: list[Settled],
    window_s: float = 1.0,
    agent: str = WORKER_AGENT,
    deployments: list[str] | None = None,
    completed: int = 0,
    unreadable: list[str] | None = None,
    graceful: bool = False,
    rests: list[Rest] | None = None,
    faults_over: float = 0.0,
    ended: float = 0.0,
) -> Verdict:
    """Check every invariant over the whole run; the deletes judged are those sent by
    ``agent`` (a User-Agent prefix: the product's worker, or a baseline's).  ``evidence``
    fails when the witnesses cannot be trusted: a deployment whose creation the audit log
    does not hold (the log is not this run's), retirements that ``completed`` without one
    delete judged, or retirement states that could not be read (``unreadable``).
    ``graceful``: the deletes judged gave the Pod its grace period (the preStop baseline);
    ``rests``: the retirement runs for invariant 5, judged from ``faults_over`` to
    ``ended``."""
    product = [d for d in audit.deletes if d.agent.startswith(agent)]
    out: list[Violation | None] = [*evidence(audit, deployments or [], completed, len(product))]
    out += [Violation("evidence", wid, "its state could not be read") for wid in unreadable or []]
    if graceful:
        out += [cut_after_delete(d, journals.get(d.hub_name)) for d in product]
    else:
        out += [
            in_flight_at_delete(d, journals.get(d.hub_name), window_s=window_s) for d in product
        ]
    out += [admitted_delete(d, audit, admitted_uids) for d in product]
    out += [attributed(f, faults) for f in failures]
    out += [converged(s) for s in settled]
    for r in rests or []:
        out += bounded(r, faults_over=faults_over, ended=ended)
    return Verdict(
        checked={
            "evidence": len(deployments or []) + 1 + len(unreadable or []),
            "in-flight": len(product),
            "admitted": len(product),
            "attributed": len(failures),
            "converged": len(settled),
            "bounded": len(rests or []),
        },
        violations=[v for v in out if v is not None and v.invariant != "race"],
        races=[v for v in out if v is not None and v.invariant == "race"],
    )
