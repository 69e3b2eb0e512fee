"""``retire status``'s page and machine formats (``cli.render``), from constructed states."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import yaml

from cli import render
from retirement.models import (
    IntentKind,
    MemberTarget,
    RestoreResult,
    RetirementRequest,
    RetirementState,
    Target,
)
from retirement.phases import Outcome, Phase

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def state(**kw: object) -> RetirementState:
    req = RetirementRequest(namespace="ns", deployment="llm", role="server", ordinal=1)
    st = RetirementState.begin(workflow_id="retirement/ns/llm", request=req)
    target = Target(
        namespace="ns",
        deployment="llm",
        role="server",
        ordinal=1,
        intent=IntentKind.COUNT_TRIM,
        engine="vLLM",
        engine_version="0.29.0",
        shape="Single",
        members=[
            MemberTarget(
                pod="llm-1", uid="u1", container_id="c://1", ip="198.18.1.9", measured=True
            )
        ],
    )
    timeline = [
        (Phase.ADMITTED, T0),
        (Phase.DISQUALIFIED, T0 + timedelta(seconds=1)),
        (Phase.WITHDRAWING, T0 + timedelta(seconds=2)),
        (Phase.DRAINING, T0 + timedelta(seconds=12)),
    ]
    base = {
        "target": target,
        "phase": Phase.DRAINING,
        "phase_timeline": timeline,
        "phase_deadline": T0 + timedelta(seconds=100),
        "deadline": T0 + timedelta(seconds=300),
        "last_readings": {"llm-1": "in_flight=3 counters=5", "router/gw": "selects no target"},
        "reasons": ["withdrawn: no Service lists and no router selects a target"],
    }
    return st.model_copy(update={**base, **kw})


def test_the_page_of_a_running_retirement() -> None:
    text = render.page(state(), T0 + timedelta(seconds=40))
    assert "Target      ns/llm server:1 (CountTrim)" in text
    assert "State       Draining (Running), phase deadline in 60s, overall in 4m" in text
    assert "llm-1" in text and "measured" in text and "in_flight=3 counters=5" in text
    assert "router/gw: selects no target" in text
    assert "retire abort ns/llm --reason" in text
    bar = next(line for line in text.splitlines() if line.strip().startswith("|"))
    # Admitted 1 s, Disqualified 1 s, Withdrawing 10 s, Draining 28 s (to now): 60 cells.
    assert bar.strip().strip("|") == "A" * 2 + "Q" * 2 + "W" * 15 + "D" * 42
    assert "W Withdrawing   at +  2.0s  for 10s" in text


def test_the_page_of_a_held_retirement_says_what_is_held_and_how_to_act() -> None:
    st = state(
        phase=Phase.ABORTED,
        outcome=Outcome.ABORTED,
        unrestored={"llm-1": "PodReady is False"},
        recheck_at=T0 + timedelta(seconds=90),
        phase_timeline=[(Phase.ADMITTED, T0), (Phase.ABORTED, T0 + timedelta(seconds=30))],
    )
    text = render.page(st, T0 + timedelta(seconds=60))
    assert "Held (looked at again 12:01:30 UTC)" in text
    assert "Restored" not in text
    back = st.model_copy(update={"restored": RestoreResult(restored=["llm-1"])})
    assert "llm-1: back in service (label, Services, routers read back)" in render.page(back, T0)
    assert "llm-1: PodReady is False" in text
    assert "retire retry ns/llm --token" in text and "retire abort" not in text


def test_machine_formats_carry_the_whole_state() -> None:
    st = state()
    as_json = json.loads(render.machine(st, "json"))
    as_yaml = yaml.safe_load(render.machine(st, "yaml"))
    assert as_json == as_yaml
    assert RetirementState.model_validate(as_json) == st


def test_a_state_without_a_timeline_renders() -> None:
    st = state(phase_timeline=[], target=None, last_readings={})
    assert "(no phase yet)" in render.page(st, T0)


def test_text_from_routers_reaches_the_terminal_only_as_printable_escapes() -> None:
    """A router's answer, an engine's error or a name can carry escape sequences (colours,
    cursor moves, a terminal title, a hyperlink), a carriage return or line feed that would
    forge a line of the page, C1 controls or a bidirectional override: the page shows each
    as its escape and sends none (issue 22)."""
    hostile = "HTTP 200 \x1b]0;owned\x07\x1b[2J\x1b[31mred\r\nReasons\n  - fine\x9b1m \u202egnp.exe"
    st = state(
        last_readings={"llm-1": hostile, "router/gw\x1b[8m": hostile},
        reasons=[hostile],
        unrestored={"llm-1": hostile},
    )
    text = render.page(st, T0 + timedelta(seconds=20))
    lines = text.split("\n")
    for line in lines:
        bad = [c for c in line if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 or c == "\u202e"]
        assert not bad, (line, bad)
    assert "\\x1b[31mred\\x0d\\x0aReasons\\x0a  - fine\\x9b1m \\u202egnp.exe" in text
    assert "router/gw\\x1b[8m" in text
    # No line was forged: one "Reasons" header, and the reading stayed on its member's line.
    assert [line for line in lines if line == "Reasons"] == ["Reasons"]
    (member,) = [line for line in lines if line.startswith("  llm-1 ")]
    assert member.endswith("\\u202egnp.exe")
    # JSON and YAML escape them themselves.
    assert "\x1b" not in render.machine(st, "json") and "\x1b" not in render.machine(st, "yaml")


def test_printable_keeps_ordinary_text() -> None:
    assert render.printable("in_flight=3 counters=5 · ünïcode ✓") == (
        "in_flight=3 counters=5 · ünïcode ✓"
    )
    assert render.printable("a\tb") == "a b"
