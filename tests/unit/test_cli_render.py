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
