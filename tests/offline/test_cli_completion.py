"""Shell completion: the bash script shtab generates from the CLI's parser completes every
subcommand and an option's choices in a real bash, and ``kubectl_complete-retire`` speaks
kubectl's plugin completion protocol (candidates, then ``:<directive>``)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib

import pytest

from cli.complete import NO_FILE_COMPLETION, SHELLS, candidates, script
from cli.main import parser
from testbed.paths import REPO_ROOT

SUBCOMMANDS = [
    "abort",
    "cancel-intent",
    "completion",
    "list",
    "retry",
    "setup",
    "start",
    "status",
    "watch",
]


def test_candidates_follow_the_parser() -> None:
    p = parser()
    assert candidates(p, [""]) == SUBCOMMANDS
    assert candidates(p, ["st"]) == ["start", "status"]
    assert candidates(p, ["-n", "demo", "wa"]) == ["watch"]  # a flag's value is skipped
    assert candidates(p, ["list", "-o", ""]) == ["json", "table", "yaml"]
    assert candidates(p, ["status", "demo/x", "-o", "y"]) == ["yaml"]
    assert "--all-namespaces" in candidates(p, ["list", "--"])
    assert "--in" not in candidates(p, ["list", "--"])  # hidden old spelling
    assert candidates(p, ["status", ""]) == []  # a deployment: nothing to guess offline


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (["st"], {"start", "status"}),
        ([""], set(SUBCOMMANDS)),
        (["list", "-o", ""], {"json", "table", "yaml"}),
    ],
)
def test_the_bash_script_completes_in_bash(words: list[str], expected: set[str]) -> None:
    body = script(parser(), "bash")
    words_sh = " ".join(f"'{w}'" for w in ["retire", *words])
    prog = (
        f"{body}\nCOMP_WORDS=({words_sh}); COMP_CWORD={len(words)}; COMPREPLY=();"
        f" _shtab_retire retire '{words[-1]}' '{(['retire', *words])[-2]}';"
        ' printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", prog], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) == expected


@pytest.mark.parametrize("shell", SHELLS)
def test_every_shell_gets_a_script_without_a_connection(shell: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "completion", shell],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "TEMPORAL_ADDRESS": "not an address"},
        cwd=REPO_ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert "status" in done.stdout and "cancel-intent" in done.stdout


def test_kubectl_complete_retire_speaks_kubectls_protocol() -> None:
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl_complete-retire"] == "cli.main:kubectl_complete"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from cli.main import kubectl_complete;"
            " sys.argv = ['kubectl_complete-retire', 'list', '-o', '']; kubectl_complete()",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
    )
    assert done.stdout.splitlines() == ["json", "table", "yaml", f":{NO_FILE_COMPLETION}"]


def test_the_script_is_for_retire_even_under_the_kubectl_name(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script bound to "kubectl retire" would take over kubectl's own completion."""
    import cli.main

    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/kubectl-retire"])
    assert cli.main.main(["completion", "bash"]) == 0
    out = capsys.readouterr().out
    assert "complete -o bashdefault -F _shtab_retire retire" in out and "kubectl" not in out
