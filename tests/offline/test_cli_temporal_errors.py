"""``retire`` when Temporal answers a query or an update with an error the SDK raises as its
own type (not an ``RPCError``): one line on stderr saying what failed and what to do, exit
1 (Temporal answered an error), no traceback.  The client is the in-memory FakeTemporal,
handed to the CLI through its ``connect`` seam."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowQueryRejectedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
)
from temporalio.common import TypedSearchAttributes

import cli.main
from retirement.models import RetirementRequest
from tests.helpers.fake_temporal import FakeTemporal

WID = "retirement/demo/llama"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTemporal:
    """A running retirement of demo/llama, and the CLI connected to it."""
    for var in ("RETIRE_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"):
        monkeypatch.setenv(var, "127.0.0.1:1")  # never dialled: connect is the fake
    fake = FakeTemporal()
    fake.running(RetirementRequest(namespace="demo", deployment="llama", role="w", ordinal=1))

    async def connect(_: Any) -> Client:
        return fake.client()

    monkeypatch.setattr(cli.main, "connect", connect)
    return fake


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """The exit code and the one stderr line (asserting there is exactly one)."""
    code = cli.main.main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return code, lines[0]


@pytest.mark.parametrize("command", [["status", "demo/llama"], ["watch", "demo/llama"]])
def test_a_failed_state_query_is_one_line(
    fake: FakeTemporal, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    fake.fail("query", WorkflowQueryFailedError("handler raised\nKeyError: 'x'"))
    code, line = run_cli(command, capsys)
    assert code == 1
    assert line.startswith(f"retire: {command[0]}: {WID} failed its state query: ")
    assert "handler raised KeyError: 'x'" in line  # the worker's reason, on one line
    assert "worker" in line and "try again" in line, line


@pytest.mark.parametrize("command", [["status", "demo/llama"], ["watch", "demo/llama"]])
def test_a_rejected_state_query_is_one_line(
    fake: FakeTemporal, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    fake.fail("query", WorkflowQueryRejectedError(WorkflowExecutionStatus.TERMINATED))
    code, line = run_cli(command, capsys)
    assert code == 1
    assert line.startswith(f"retire: {command[0]}: {WID} refused its state query (TERMINATED)")
    assert "retire status demo/llama" in line, line


@pytest.mark.parametrize(
    ("command", "what"),
    [
        (["abort", "demo/llama", "--reason", "keep it"], "abort"),
        (["retry", "demo/llama", "--token", "t2"], "retry"),
    ],
)
def test_an_update_with_no_answer_in_time_is_one_line(
    fake: FakeTemporal, capsys: pytest.CaptureFixture[str], command: list[str], what: str
) -> None:
    fake.fail("execute_update", WorkflowUpdateRPCTimeoutOrCancelledError())
    code, line = run_cli(command, capsys)
    assert code == 1
    assert line.startswith(f"retire: {what}: {WID} gave no answer in time"), line
    assert "may still apply" in line and "retire status demo/llama" in line, line
    assert "--signal" in line, line


@dataclass
class _Listed:
    """One visibility entry as ``retire list`` reads it."""

    id: str
    run_id: str
    status: WorkflowExecutionStatus = WorkflowExecutionStatus.RUNNING
    start_time: datetime = datetime(2025, 1, 1, tzinfo=UTC)
    typed_search_attributes: TypedSearchAttributes = TypedSearchAttributes.empty


@pytest.mark.parametrize(
    "error",
    [
        WorkflowQueryFailedError("handler raised"),
        WorkflowQueryRejectedError(None),
    ],
    ids=["failed", "rejected"],
)
def test_list_prints_the_row_when_its_query_fails(
    fake: FakeTemporal,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
) -> None:
    """``retire list`` reads each running retirement's state by query; a failed one leaves
    '-' in its row (already so: kept as a guard)."""

    def listed(*_: Any, **__: Any) -> AsyncIterator[_Listed]:
        async def each() -> AsyncIterator[_Listed]:
            yield _Listed(id=WID, run_id=fake.latest(WID).run_id)

        return each()

    monkeypatch.setattr(fake, "list_workflows", listed)
    fake.fail("query", error)
    assert cli.main.main(["list", "-A"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    row = out.splitlines()[1].split()
    assert row[0] == "demo/llama" and row[-3:] == ["-", WID, "-"], out
    assert fake.called("query"), "the row's state was read by query"


def test_control_characters_in_a_server_message_are_shown_as_escapes(
    fake: FakeTemporal, capsys: pytest.CaptureFixture[str]
) -> None:
    """A message from the worker (a query handler's error) may carry terminal escapes:
    they are printed as escapes, never sent to the terminal."""
    fake.fail("query", WorkflowQueryFailedError("boom \x1b[2J\x1b]0;owned\x07 done"))
    code, line = run_cli(["status", "demo/llama"], capsys)
    assert code == 1
    assert "\x1b" not in line and "\x07" not in line
    assert "\\x1b[2J" in line and "\\x07" in line
