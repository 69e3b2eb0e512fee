"""What ``retire status`` and ``retire watch`` print: a retirement as a page for a person
(target, phase and deadline, per-member readings, what is held and why, the reasons, a
phase timeline drawn in the terminal, and the commands to act on it), or as JSON / YAML
for a machine.  Pure functions of the queried state and the time.

Much of a state's text comes from outside: a router's answer, an engine's error, a Pod's
name.  The page is for a terminal, so every line goes through ``printable``: a control
character (an escape sequence's ESC, a bell, a carriage return or line feed that would
forge another line, C1 controls) or a bidirectional override is shown as its escape
(``\\x1b``, ``\\u202e``), never sent.  JSON and YAML escape them themselves.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import datetime
from typing import Any

import yaml

from retirement.models import RetirementState
from retirement.phases import Outcome, Phase

#: Width of the drawn timeline, in characters.
BAR_WIDTH = 60
#: One letter per phase in the drawn timeline.
LETTER = {
    Phase.ADMITTED: "A",
    Phase.DISQUALIFIED: "Q",
    Phase.WITHDRAWING: "W",
    Phase.DRAINING: "D",
    Phase.DELETING: "X",
    Phase.SETTLING: "S",
    Phase.COMPLETED: "C",
    Phase.ABORTED: "!",
}


#: Format characters that reorder what a terminal shows (bidirectional embeddings, overrides
#: and isolates, and the marks): shown escaped like the control characters.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """``text`` safe for a terminal line: a tab is a space, every other control character
    and bidirectional format character is shown as its escape."""
    out = []
    for c in text:
        if c == "\t":
            out.append(" ")
        elif c in _BIDI or unicodedata.category(c) == "Cc":
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def as_data(st: RetirementState) -> dict[str, Any]:
    """The state as plain JSON-compatible data."""
    data: dict[str, Any] = json.loads(st.model_dump_json())
    return data


def machine(st: RetirementState, fmt: str) -> str:
    """``-o json`` or ``-o yaml``."""
    return serialize(as_data(st), fmt)


def serialize(data: Any, fmt: str) -> str:
    """``data`` as ``-o json`` or ``-o yaml`` prints it."""
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False)
    return json.dumps(data, indent=2)


def _secs(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 120:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.1f}s" if seconds < 10 else f"{seconds:.0f}s"


def timeline(st: RetirementState, now: datetime, *, width: int = BAR_WIDTH) -> list[str]:
    """The phase timeline: a bar whose segments are proportional to each phase's length
    (the running phase up to ``now``), and a legend line per phase."""
    stamps = list(st.phase_timeline)
    if not stamps:
        return ["(no phase yet)"]
    ends = [at for _, at in stamps[1:]]
    last_end = now if st.outcome is Outcome.RUNNING else stamps[-1][1]
    ends.append(max(last_end, stamps[-1][1]))
    spans = [
        (phase, at, max(0.0, (end - at).total_seconds()))
        for (phase, at), end in zip(stamps, ends, strict=True)
    ]
    total = sum(s for _, _, s in spans) or 1.0
    bar = ""
    for phase, _, seconds in spans:
        cells = max(1, round(width * seconds / total)) if seconds > 0 else 0
        bar += LETTER.get(phase, "?") * cells
    lines = [f"|{bar[: width + len(spans)]}|"]
    start = stamps[0][1]
    for phase, at, seconds in spans:
        offset = (at - start).total_seconds()
        lines.append(
            f"  {LETTER.get(phase, '?')} {phase:<13} at +{_secs(offset):>6}  for {_secs(seconds)}"
        )
    return lines


def page(st: RetirementState, now: datetime) -> str:
    """The readable status page of one retirement."""
    req, t = st.request, st.target
    ref = f"{req.namespace}/{req.deployment}"
    out = [
        f"Retirement  {st.workflow_id}   attempt {st.attempt}",
        f"Target      {ref} {req.role}:{req.ordinal} ({req.intent})",
    ]
    state = f"{st.phase} ({st.outcome})"
    if st.outcome is Outcome.RUNNING and st.phase_deadline is not None:
        left = max(0.0, (st.phase_deadline - now).total_seconds())
        state += f", phase deadline in {_secs(left)}"
    if st.outcome is Outcome.RUNNING and st.deadline is not None:
        state += f", overall in {_secs(max(0.0, (st.deadline - now).total_seconds()))}"
    out.append(f"State       {state}")
    if t is not None:
        out.append(
            f"Shape       {t.engine} {t.engine_version or '?'} {t.shape}, "
            f"router {t.router or 'none'}"
        )
        out.append("Members")
        for m in t.members:
            tag = "measured" if m.measured else "not measured"
            reading = st.last_readings.get(m.pod, "")
            out.append(f"  {m.pod:<32} {m.ip or '-':<15} {tag:<12} {reading}".rstrip())
    other = {
        k: v
        for k, v in sorted(st.last_readings.items())
        if t is None or k not in {m.pod for m in t.members}
    }
    if other:
        out.append("Readings")
        out += [f"  {k}: {v}" for k, v in other.items()]
    if st.restored is not None and (st.restored.restored or st.restored.failed):
        out.append("Restored")
        out += [
            f"  {m}: back in service (label, Services, routers read back)"
            for m in st.restored.restored
        ]
        out += [f"  {m}: {why}" for m, why in sorted(st.restored.failed.items())]
    if st.unrestored:
        when = f" (looked at again {st.recheck_at:%H:%M:%S} UTC)" if st.recheck_at else ""
        out.append(f"Held{when}")
        out += [f"  {k}: {v}" for k, v in sorted(st.unrestored.items())]
    if st.reasons:
        out.append("Reasons")
        out += [f"  - {r}" for r in st.reasons[-8:]]
    out.append("Timeline")
    out += [f"  {line}" for line in timeline(st, now)]
    if st.outcome in (Outcome.RUNNING, Outcome.ABORTED):
        out.append("Act")
        if st.outcome is Outcome.RUNNING:
            out.append(f"  retire abort {ref} --reason '...'")
        else:
            out.append(f"  retire retry {ref} --token <new token>")
        out.append(f"  retire cancel-intent {ref}      (the replica is wanted after all)")
    return "\n".join(printable(line) for line in out) + "\n"
