"""Bad ``retire`` arguments: each exits non-zero with a one-line reason and no traceback,
before anything is sent to Temporal.  Written against behaviour (exit code, stderr), not
the parser's internals, so a change of the connection flags does not touch it."""

from __future__ import annotations

import pytest

from cli.main import main
from tests.corpus.cases import CLI_ARGS, Case, params

#: Where the CLI would connect if a bad argument slipped through: a closed loopback port.
NOWHERE = "127.0.0.1:1"

BAD: list[Case] = list(CLI_ARGS)

_TOKEN_RULE = (
    "a retry token is 1-63 characters of letters, digits, '.', '_' or '-', starting with a"
    " letter or digit"
)
_DNS = "must be lower-case letters, digits, '-' or '.', starting and ending with a letter or digit"
_REF = "is not DEPLOYMENT or NAMESPACE/DEPLOYMENT (lower-case DNS names)"
_BUDGET_FIELDS = "overall_s, withdrawal_s, drain_s, settle_s, poll_interval_s"
_OBJECT = 'retire: --budgets: must be a JSON object, e.g. {"overall_s": 300}'
#: The last stderr line of each bad input: it names the field and says what is wrong
#: (argparse's own errors name the argument).  A new corpus case needs its line here.
MESSAGES: dict[str, str] = {
    "no-args": "error: the following arguments are required: command",
    "unknown-command": "error: argument command: invalid choice: 'bogus'",
    "status-no-ref": "error: the following arguments are required: ref",
    "status-upper-ns": f"retire: 'Demo/llm' {_REF}",
    "status-bad-name": f"retire: 'Demo' {_REF}",
    "status-n-contradicts": "retire: 'demo/llm' is in namespace 'demo', but -n says 'other'",
    "status-bad-n": "retire: -n 'Bad_ns' is not a Kubernetes namespace name",
    "list-A-and-n": "retire: -A (every namespace) and -n (one) disagree: give one",
    "list-bad-n": "retire: -n 'x/y' is not a Kubernetes namespace name",
    "status-empty-md": f"retire: 'demo/' {_REF}",
    "status-empty-ns": f"retire: '/llm' {_REF}",
    "status-extra-part": f"retire: 'demo/llm/x' {_REF}",
    "status-long-ns": f"/llm' {_REF}",
    "status-unicode": f"retire: 'd\u00e9mo/llm' {_REF}",
    "status-space": f"retire: 'demo/ llm' {_REF}",
    "status-trailing-newline": f"retire: 'demo/llm\\n' {_REF}",
    "status-two-refs": "error: unrecognized arguments: demo/other",
    "abort-no-reason": "error: the following arguments are required: --reason",
    "abort-empty-reason": "retire: --reason: must not be empty (got '')",
    "abort-blank-reason": "retire: --reason: reason must be printable text (got '   ')",
    "abort-nul-reason": "retire: --reason: reason must be printable text (got 'stop\\x01')",
    "abort-newline-reason": "retire: --reason: reason must be printable text (got 'a\\nb')",
    "abort-long-reason": "retire: --reason: must have at most 256 characters (got 257 characters)",
    "retry-empty-token": f"retire: --token: {_TOKEN_RULE} (got '')",
    "retry-dash-token": f"retire: --token: {_TOKEN_RULE} (got '-x')",
    "retry-space-token": f"retire: --token: {_TOKEN_RULE} (got 'a b')",
    "retry-long-token": f"retire: --token: {_TOKEN_RULE} (got 64 characters)",
    "retry-unicode-token": f"retire: --token: {_TOKEN_RULE} (got 't\u00f6k')",
    "start-no-role": "error: the following arguments are required: --role",
    "start-no-ordinal": "error: the following arguments are required: --ordinal",
    "start-role-Worker": f"retire: --role: {_DNS} (got 'Worker')",
    "start-role-underscore": f"retire: --role: {_DNS} (got 'w_1')",
    "start-ordinal-negative": "retire: --ordinal: must be greater than or equal to 0 (got -1)",
    "start-ordinal-text": "error: argument --ordinal: invalid int value: 'one'",
    "start-ordinal-float": "error: argument --ordinal: invalid int value: '1.5'",
    "start-ordinal-huge": "retire: --ordinal: must be less than or equal to 100000 (got 100001)",
    "start-budgets-0": "retire: --budgets: not valid JSON: Expecting value",
    "start-budgets-1": f"{_OBJECT} (got [])",
    "start-budgets-2": f"{_OBJECT} (got null)",
    "start-budgets-3": f'{_OBJECT} (got "300")',
    "start-budgets-4": "retire: --budgets: overall_s must be greater than 0 (got 0)",
    "start-budgets-5": f"retire: --budgets: 'x' is not a known field (known: {_BUDGET_FIELDS})",
    "start-budgets-6": "retire: --budgets: drain_s must be a finite number (got NaN)",
    "start-budgets-7": "retire: --budgets: overall_s must be a finite number (got Infinity)",
    "start-budgets-8": "--budgets: poll_interval_s must be less than or equal to 60 (got 61)",
    "start-budgets-9": "retire: --budgets: not valid JSON: Expecting property name",
    "start-budgets-10": "retire: --budgets: overall_s must be a valid number",
    "start-budgets-deep": "retire: --budgets: JSON nested too deeply",
    "start-policy": "error: argument --routerless-policy: invalid choice: 'never'",
    "cancel-no-ref": "error: the following arguments are required: ref",
    "cancel-bad-ref": f"retire: 'demo_x' {_REF}",
}


@pytest.fixture(autouse=True)
def _nowhere(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RETIRE_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"):
        monkeypatch.setenv(var, NOWHERE)


def run_cli(argv: list[str]) -> int:
    """``main(argv)``'s exit code, whether returned or raised by argparse."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


@pytest.mark.parametrize("argv", params(BAD))
def test_bad_arguments_exit_2_with_a_one_line_reason(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("retire"), err
    assert "cannot reach" not in err  # refused before connecting
    if not lines[0].startswith("usage:"):  # not argparse's usage + error pair: one line
        assert len(lines) == 1, err


@pytest.mark.parametrize("case", BAD, ids=[c.id for c in BAD])
def test_bad_arguments_name_the_field_and_what_is_wrong(
    case: Case, capsys: pytest.CaptureFixture[str]
) -> None:
    """The project's own message reaches the person (the token rule, "must not be empty",
    the field's bounds), never only pydantic's documentation link."""
    assert case.id in MESSAGES, f"add the message {case.id!r} must print to MESSAGES"
    run_cli(case.value)
    err = capsys.readouterr().err
    assert "errors.pydantic.dev" not in err and "For further information" not in err, err
    assert MESSAGES[case.id] in err.splitlines()[-1], err
