"""Bad ``retire`` arguments: each exits non-zero with a one-line reason and no traceback,
before anything is sent to Temporal.  Written against behaviour (exit code, stderr), not
the parser's internals, so a change of the connection flags does not touch it."""

from __future__ import annotations

import pytest

from cli.main import main
from tests.corpus.cases import CLI_ARGS, params

#: Where the CLI would connect if a bad argument slipped through: a closed loopback port.
NOWHERE = "127.0.0.1:1"


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


@pytest.mark.parametrize("argv", params(CLI_ARGS))
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
