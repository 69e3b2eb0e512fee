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
    ref = f"{s.request.namespace}/{s.request.deployment}"
    if s.outcome is Outcome.RUNNING:
        lines.append(f"Abort: `retire abort {ref} --reason ...` or the `abort` update/signal")
    elif s.outcome is Outcome.ABORTED:
        lines.append(
            f"Held, replica kept and serving. Retry: `retire retry {ref} --token T`, "
            "the `retry` update/signal, or the retirement-retry annotation. Keep the "
            f"replica and end the hold: `retire cancel-intent {ref}` (the `cancel_intent` "
            "signal), or scale the spec back up; it ends once every member is back. "
            "Cancelling the workflow keeps it held"
        )
    elif s.outcome is Outcome.ABANDONED:
        lines.append(
            "Ended with members out of service (listed above): put them back by hand "
            "after checking they serve, or restart their Pods"
        )
    return "\n\n".join(lines)
