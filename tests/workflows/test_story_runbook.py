"""The Temporal UI, the runbook and the README give the same action for each situation.

The workflow's current details (``workflows.story``) tell a person what to do: abort a
running retirement, retry a held one, end a hold, put back what an Abandoned one left
out of service.  Every command and input they show must be the runbook's
(docs/runbook.md, "Act"), row for row, and the project CLI's commands the README's.
Example values may differ (a retry token, a reason); everything else is verbatim.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from retirement.models import RetirementRequest, RetirementState
from retirement.phases import Outcome, Phase
from workflows import story

ROOT = Path(__file__).resolve().parents[2]
RUNBOOK = (ROOT / "docs" / "runbook.md").read_text()
README = (ROOT / "README.md").read_text()

POD = "llama-server-2"


def state(outcome: Outcome, phase: Phase, **kw: object) -> RetirementState:
    req = RetirementRequest(namespace="team-a", deployment="llama", role="server", ordinal=2)
    s = RetirementState.begin(workflow_id="retirement/team-a/llama", request=req)
    return s.model_copy(update={"outcome": outcome, "phase": phase, **kw})


RUNNING = state(Outcome.RUNNING, Phase.DRAINING)
DELETING = state(Outcome.RUNNING, Phase.DELETING)
HELD = state(Outcome.ABORTED, Phase.ABORTED, unrestored={POD: "PodReady is False"})
ABANDONED = state(Outcome.ABANDONED, Phase.ABORTED, unrestored={POD: "PodReady is False"})


def spans(text: str) -> list[str]:
    """The inline code of markdown text (commands, inputs, names)."""
    return re.findall(r"`([^`\n]+)`", text)


def examples(cmd: str) -> str:
    """``cmd`` with its example values (a token, a reason) made placeholders."""
    cmd = re.sub(r"--token \S+", "--token <token>", cmd)
    cmd = re.sub(r'"token":"[^"]*"', '"token":"<token>"', cmd)
    cmd = re.sub(r"(retirement-retry=[^:\s]+:[^:\s]+:)\S+", r"\1<token>", cmd)
    cmd = re.sub(r'--reason ("[^"]*"|\S+)', "--reason <reason>", cmd)
    return re.sub(r'"reason":"[^"]*"', '"reason":"<reason>"', cmd)


def act_row(action: str) -> str:
    """The runbook's row of the "Act" table whose first cell starts with ``action``."""
    act = RUNBOOK.split("\n## Act\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in act.splitlines() if line.startswith(f"| {action}")]
    assert len(rows) == 1, f"runbook Act table: no single row {action!r}"
    return rows[0]


def runbook_says(text: str, s: RetirementState) -> set[str]:
    """The code spans of runbook ``text`` with ``s``'s names filled in, examples generic."""
    return {examples(story.fill(c, s, pod=POD)) for c in spans(text)}


def shown(paragraph: str) -> set[str]:
    return {examples(c) for c in spans(paragraph)}


def paragraph(s: RetirementState, starts: str) -> str:
    found = [p for p in story.actions(s) if p.startswith(starts)]
    assert len(found) == 1, (starts, story.actions(s))
    return found[0]


@pytest.mark.parametrize(
    ("s", "starts", "row"),
    [
        (RUNNING, "Abort", "Abort a running retirement"),
        (HELD, "Held, replica kept and serving. Retry:", "Retry a held retirement"),
        (HELD, "End the hold", "End a held retirement"),
    ],
    ids=["abort", "retry", "end-hold"],
)
def test_each_action_shown_is_the_runbooks_for_that_situation(
    s: RetirementState, starts: str, row: str
) -> None:
    said = shown(paragraph(s, starts))
    assert said, "the details show no command"
    assert said <= runbook_says(act_row(row), s), said - runbook_says(act_row(row), s)
    # ... and reach the person through the current details.
    assert paragraph(s, starts) in story.current(s, datetime.now(UTC))


def test_every_command_the_details_show_is_in_the_runbook() -> None:
    everything = runbook_says(RUNBOOK, HELD)
    for s in (RUNNING, DELETING, HELD, ABANDONED):
        details = story.current(s, datetime.now(UTC))
        missing = shown(details) - everything
        assert not missing, (s.outcome, s.phase, missing)


def test_the_project_cli_commands_are_the_readmes() -> None:
    """The README's command block shows the same ``retire`` commands (for demo/llama)."""
    ref = re.compile(r"(?<=^retire )(\S+ )(\S+/\S+)")

    def generic(cmd: str) -> str:
        return ref.sub(r"\1<ref>", examples(cmd))

    readme = [  # optional flags ([--token T]) as if given
        generic(re.sub(r"[\[\]]", "", line))
        for line in README.splitlines()
        if line.startswith("retire ")
    ]
    for s in (RUNNING, HELD):
        for cmd in spans(" ".join(story.actions(s))):
            if cmd.startswith("retire "):
                want = generic(cmd)
                assert any(line.startswith(want) for line in readme), (want, readme)


def test_a_held_retirement_says_a_cancellation_keeps_it_held() -> None:
    """The runbook: a cancellation (the UI's *Request cancellation*) aborts a running
    retirement and holds; it does not end a hold.  The details say the same, and never
    that cancelling ends the hold."""
    assert "*Request cancellation*" in RUNBOOK and "keeps it held" in RUNBOOK
    running = " ".join(story.actions(RUNNING))
    assert "*Request cancellation* (it aborts the same way and holds)" in running
    held = " ".join(story.actions(HELD))
    assert "does not end it: it keeps it held" in held
    assert "cancel the workflow" not in held.lower()
    assert "Do not terminate" in RUNBOOK and "termination skips the restore" in held


def test_past_the_point_of_no_return_no_abort_is_offered() -> None:
    said = " ".join(story.actions(DELETING))
    assert "retire abort" not in said
    assert said.startswith("No abort now: Deleting has begun"), said


def test_an_abandoned_retirement_shows_how_to_put_each_member_back() -> None:
    said = " ".join(story.actions(ABANDONED))
    assert "put them back by hand after checking they serve" in said
    assert "put them back by hand after checking they serve" in RUNBOOK
    assert (
        f"`kubectl label pod {POD} -n team-a modeldeployment.gpustack.ai/endpoint-eligible=true`"
        in said
    )
