"""What the Temporal UI shows of a retirement (Temporal's user metadata): a static summary
in the workflow list, static details of what was asked, and live current details of
where it stands, what it last read, what is held and why, and how to act on it.

Pure text from the request and the state: no I/O, workflow-sandbox safe.
"""

from __future__ import annotations

from datetime import datetime

from retirement.drain import MAX_READ_SPACING_S
from retirement.models import RetirementRequest, RetirementState
from retirement.phases import Outcome
from retirement.protocol import abort_refusal


def summary(req: RetirementRequest) -> str:
    """One line for the workflow list."""
    what = f"{req.role}:{req.ordinal}"
    if req.members:
        what += f" members {', '.join(req.members)}"
    return f"retire {req.namespace}/{req.deployment} {what} ({req.intent})"


def details(req: RetirementRequest) -> str:
    """What was asked, in Temporal markdown."""
    b = req.budgets
    lines = [
        f"**Deployment** {req.namespace}/{req.deployment}",
        f"**Replica** {req.role}:{req.ordinal} ({req.intent})",
        f"**Budgets** overall {b.overall_s:g} s, withdrawal {b.withdrawal_s:g} s, "
        f"drain {b.drain_s:g} s, settle {b.settle_s:g} s; reads every {b.poll_interval_s:g} s "
        f"(drain reads up to {MAX_READ_SPACING_S:g} s apart while the engine is busy)",
        f"**Router-less policy** {req.routerless_policy}",
    ]
    if req.members:
        lines.append(f"**Surplus members** {', '.join(req.members)}")
    if req.attempt > 1:
        lines.append(f"**Attempt** {req.attempt}")
    return "\n\n".join(lines)


def current(s: RetirementState, now: datetime) -> str:
    """Where the retirement stands now, in Temporal markdown."""
    lines = [f"**{s.phase}** ({s.outcome})"]
    if s.outcome is Outcome.RUNNING and s.phase_deadline is not None:
        left = max(0.0, (s.phase_deadline - now).total_seconds())
        lines.append(f"phase deadline in {left:.0f} s ({s.phase_deadline:%H:%M:%S} UTC)")
    if s.target is not None:
        t = s.target
        members = ", ".join(m.pod + (" (measured)" if m.measured else "") for m in t.members)
        lines.append(
            f"**Members** {members}; {t.engine} {t.engine_version} {t.shape}, "
            f"router {t.router or 'none'}"
        )
    if s.last_readings:
        lines.append(
            "**Last readings**\n"
            + "\n".join(f"- {k}: {v}" for k, v in sorted(s.last_readings.items()))
        )
    if s.unrestored:
        lines.append(
            "**Not yet back in service**\n"
            + "\n".join(f"- {k}: {v}" for k, v in sorted(s.unrestored.items()))
        )
    if s.reason:
        lines.append(f"**Last** {s.reason}")
    lines += actions(s)
    return "\n\n".join(lines)


#: What a person can do in each situation, in the runbook's words and commands
#: (docs/runbook.md, "Act"; a test holds them to it).  ``<ns>``, ``<md>``, ``<role>``,
#: ``<ordinal>`` and ``<pod>`` are filled in; the token and the reason are examples.
ABORT = (
    'Abort (keep the replica): `retire abort <ns>/<md> --reason "…"`, the `abort` update '
    'or signal with `{"reason":"…"}`, or the UI\'s *Request cancellation* (it aborts the same '
    "way and holds)"
)
RETRY = (
    "Held, replica kept and serving. Retry: `retire retry <ns>/<md> --token T`, the `retry` "
    'update or signal with `{"token":"<new>"}`, or `kubectl annotate modeldeployment <md> '
    "-n <ns> modeldeployment.gpustack.ai/retirement-retry=<role>:<ordinal>:T --overwrite` "
    "(a new token for every retry: a fresh attempt, fresh budgets)"
)
END_HOLD = (
    "End the hold, keep the replica (it ends once every member is back): "
    '`retire cancel-intent <ns>/<md>`, the `cancel_intent` signal with `{"reason":"…"}`, '
    "or scale the spec back up. A cancellation (the UI's *Request cancellation*) does not "
    "end it: it keeps it held"
)
NO_TERMINATE = "Do not terminate it: termination skips the restore"
ABANDONED = (
    "Ended with members out of service (listed above): put them back by hand after "
    "checking they serve (the engine answers a completion): "
)
RELABEL = "`kubectl label pod <pod> -n <ns> modeldeployment.gpustack.ai/endpoint-eligible=true`"


def fill(template: str, s: RetirementState, *, pod: str = "<pod>") -> str:
    """``template`` with this retirement's names in place of the runbook's placeholders."""
    r = s.request
    for placeholder, value in (
        ("<ns>", r.namespace),
        ("<md>", r.deployment),
        ("<role>", r.role),
        ("<ordinal>", str(r.ordinal)),
        ("<pod>", pod),
    ):
        template = template.replace(placeholder, value)
    return template


def actions(s: RetirementState) -> list[str]:
    """How to act on the retirement as it stands (the runbook's actions for the case)."""
    if s.outcome is Outcome.RUNNING:
        refusal = abort_refusal(s)
        why = refusal.removeprefix("abort refused: ")
        first = f"No abort now: {why}" if refusal else fill(ABORT, s)
        return [first, NO_TERMINATE]
    if s.outcome is Outcome.ABORTED:
        return [fill(RETRY, s), fill(END_HOLD, s), NO_TERMINATE]
    if s.outcome is Outcome.ABANDONED:
        pods = sorted(s.unrestored) or ["<pod>"]
        return [ABANDONED + ", ".join(fill(RELABEL, s, pod=p) for p in pods)]
    return []
