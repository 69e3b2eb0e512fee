"""``retire``'s usage (issue 20, "Errors and the CLI"): ``watch --interval`` is checked
before any connection, ``retry`` without ``--token`` generates one and prints it,
``--version``, and the ``retire-watcher`` console script.  Temporal is the in-memory
FakeTemporal, handed to the CLI through its ``connect`` seam."""

from __future__ import annotations

import asyncio
import importlib
import json
import re
import time
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from temporalio.client import Client

import cli.main
from retirement.models import RetirementRequest
from retirement.phases import Outcome
from retirement.retry import validate_token
from tests.helpers.fake_temporal import FakeTemporal

WID = "retirement/demo/llama"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def connects(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every connection the CLI opens (to a FakeTemporal with a running demo/llama)."""
    for var in ("RETIRE_TEMPORAL_ADDRESS", "TEMPORAL_ADDRESS"):
        monkeypatch.setenv(var, "127.0.0.1:1")  # never dialled: connect is the fake
    fake = FakeTemporal()
    fake.running(RetirementRequest(namespace="demo", deployment="llama", role="w", ordinal=1))
    fake.set_state(WID, outcome=Outcome.ABORTED)  # held: a retry is accepted
    opened: list[Any] = [fake]

    async def connect(settings: Any) -> Client:
        opened.append(settings)
        return fake.client()

    monkeypatch.setattr(cli.main, "connect", connect)
    # The current kubeconfig context's namespace (never the machine's own kubeconfig).
    monkeypatch.setattr(cli.main, "context_namespace", lambda: "demo")
    return opened


def run_cli(argv: list[str]) -> int:
    try:
        return cli.main.main(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1


@pytest.mark.parametrize(
    ("interval", "message"),
    [
        ("0", "retire: --interval must be positive"),
        ("-1", "retire: --interval must be positive"),
        ("-0.5", "retire: --interval must be positive"),
        ("nan", "retire: --interval must be a finite number of seconds"),
        ("inf", "retire: --interval must be a finite number of seconds"),
    ],
)
def test_watch_interval_not_positive_is_a_usage_error_before_connecting(
    connects: list[Any], capsys: pytest.CaptureFixture[str], interval: str, message: str
) -> None:
    code = run_cli(["watch", "demo/llama", f"--interval={interval}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err == f"{message}\n"
    assert connects[1:] == [], "refused before any connection to Temporal"


def test_retry_without_a_token_generates_one_and_prints_it(
    connects: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake: FakeTemporal = connects[0]
    assert run_cli(["retry", "demo/llama"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    (sent,) = [c.arg.token for c in fake.called("execute_update")]
    assert validate_token(sent) == sent  # the project's token rule
    first = out.splitlines()[0]
    assert first.startswith(f"retry token {sent} (generated"), out
    assert f"--token {sent}" in first, "how to send the same retry again"
    assert f"Accept: token {sent}" in out  # the update's answer follows


def test_generated_tokens_differ_and_keep_the_rule() -> None:
    tokens = {cli.main.new_retry_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert validate_token(token) == token
        assert re.fullmatch(r"cli-\d{8}T\d{6}Z-[0-9a-f]{8}", token), token


def test_retry_signal_without_a_token_prints_the_generated_token(
    connects: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake: FakeTemporal = connects[0]
    assert run_cli(["retry", "demo/llama", "--signal"]) == 0
    out = capsys.readouterr().out
    (sent,) = [c.arg.token for c in fake.called("signal")]
    assert out.splitlines() == [
        f"retry token {sent} (generated: sending it again with --token {sent} is not a"
        " second retry)",
        f"retry signalled to {WID}",
    ]


def test_retry_with_a_token_sends_it_and_prints_no_generated_one(
    connects: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake: FakeTemporal = connects[0]
    assert run_cli(["retry", "demo/llama", "--token", "mine-1"]) == 0
    assert [c.arg.token for c in fake.called("execute_update")] == ["mine-1"]
    assert "generated" not in capsys.readouterr().out


def test_version_prints_the_package_version(
    connects: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(["--version"]) == 0
    out = capsys.readouterr().out
    assert out == f"retire {cli.main.version()}\n"
    assert cli.main.version() != ""
    assert connects[1:] == []


def test_version_is_unknown_without_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert cli.main.version() == "unknown"


def test_retire_watcher_is_a_console_script_of_the_watchers_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get("retire-watcher") == "watcher.__main__:main"
    module, _, name = scripts["retire-watcher"].partition(":")
    assert callable(getattr(importlib.import_module(module), name))


def test_the_package_installs_only_the_products_commands() -> None:
    """The test bed is not the product: ``python -m testbed`` runs it from a checkout, and
    no ``retire-bed`` lands on a user's PATH (kubectl's completion helper is the CLI's)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {
        "retire-worker",
        "retire-watcher",
        "retire",
        "kubectl-retire",
        "kubectl_complete-retire",
    }
    assert not any(target.startswith("testbed") for target in scripts.values())


def test_the_wheel_carries_the_product_packages_only() -> None:
    """The package list the wheel is built from: every product package, and none of the
    test bed, the fault campaign, the benchmarks or the tests (they run from a checkout)."""
    from setuptools import find_packages

    find = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    tops = {p.split(".")[0] for p in find_packages(str(ROOT), **find["packages"]["find"])}
    product = {"retirement", "kube", "connection", "workflows", "activities", "worker", "watcher"}
    assert tops == product | {"cli"}


def test_several_bad_fields_are_all_named_on_one_line(
    connects: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["start", "demo/llama", "--role", "w", "--ordinal", "1"]
    assert run_cli([*argv, "--budgets", '{"drain_s": -1, "overall_s": "5m"}']) == 2
    err = capsys.readouterr().err
    assert err == (  # in the order of the fields
        "retire: --budgets: overall_s must be a valid number, unable to parse string as a"
        ' number (got "5m"); --budgets: drain_s must be greater than 0 (got -1)\n'
    )
    assert connects[1:] == []


# ---------------------------------------------------------------- kubectl habits


def test_list_as_json_and_limited(connects: list[Any], capsys: pytest.CaptureFixture[str]) -> None:
    fake: FakeTemporal = connects[0]
    fake.running(RetirementRequest(namespace="demo", deployment="qwen", role="w", ordinal=1))
    assert run_cli(["list", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["deployment"] for r in rows) == ["demo/llama", "demo/qwen"]
    assert set(rows[0]) == {
        "deployment",
        "replica",
        "phase",
        "outcome",
        "age",
        "deadline",
        "workflow",
        "reason",
    }
    assert run_cli(["list", "-o", "yaml", "--limit", "1"]) == 0
    (row,) = yaml.safe_load(capsys.readouterr().out)
    assert row["workflow"].startswith("retirement/demo/")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["list", "--limit", "0"], "retire: --limit must be at least 1"),
        (["watch", "demo/llama", "--timeout", "0"], "retire: --timeout must be a positive"),
        (["watch", "demo/llama", "--timeout", "nan"], "retire: --timeout must be a positive"),
    ],
)
def test_bounds_are_usage_errors_before_connecting(
    connects: list[Any], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run_cli(argv) == 2
    assert capsys.readouterr().err.startswith(message)
    assert connects[1:] == []


def test_watch_gives_up_at_its_timeout_and_says_the_retirement_goes_on(
    connects: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    fake: FakeTemporal = connects[0]
    fake.set_state(WID, outcome=Outcome.RUNNING)
    assert run_cli(["watch", "demo/llama", "--interval", "0.05", "--timeout", "0.3"]) == 1
    err = capsys.readouterr().err
    assert err == f"retire: {WID} still runs after --timeout 0.3 s (it goes on)\n"


@pytest.mark.parametrize(
    ("argv", "address", "namespace"),
    [
        (["status", "demo/llama", "--address", "10.9.9.9:7233"], "10.9.9.9:7233", "default"),
        (["--address", "a:1", "status", "demo/llama"], "a:1", "default"),
        (["--address", "a:1", "status", "demo/llama", "--address", "b:2"], "b:2", "default"),
        (["--temporal-namespace", "t1", "list", "--address", "c:3"], "c:3", "t1"),
        (["list", "--temporal-namespace", "t2"], "127.0.0.1:1", "t2"),
    ],
)
def test_connection_flags_are_taken_after_the_subcommand_too(
    connects: list[Any], argv: list[str], address: str, namespace: str
) -> None:
    """As kubectl takes its flags anywhere; one given before the subcommand is not reset
    by the subcommand's own (it has no defaults there)."""
    run_cli(argv)
    (settings,) = connects[1:]
    assert (settings.address, settings.namespace) == (address, namespace)


# --- kubectl's habits: -n, -A, a bare DEPLOYMENT ------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "llama", "-n", "demo"],
        ["-n", "demo", "status", "llama"],
        ["status", "demo/llama", "-n", "demo"],
        ["status", "demo/llama"],
        ["status", "llama"],  # the current context's namespace (demo here)
    ],
)
def test_a_deployment_is_named_as_kubectl_names_it(
    connects: list[Any], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    monkeypatch.setattr(cli.main, "context_namespace", lambda: "demo")
    assert run_cli([*argv, "-o", "json"]) == 0
    fake = connects[0]
    assert [c.workflow_id for c in fake.called("query")] == [WID]


def test_list_asks_the_server_for_one_namespace_and_minus_a_for_all(
    connects: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli.main, "context_namespace", lambda: "elsewhere")
    fake = connects[0]
    assert run_cli(["list", "-o", "json"]) == 0  # the context's namespace: nothing there
    assert json.loads(capsys.readouterr().out) == []
    assert "RetirementDeployment STARTS_WITH 'elsewhere/'" in fake.called("list_workflows")[-1].arg
    assert run_cli(["list", "-n", "demo", "-o", "json"]) == 0
    assert [r["deployment"] for r in json.loads(capsys.readouterr().out)] == ["demo/llama"]
    assert run_cli(["list", "-A", "-o", "json"]) == 0
    assert [r["deployment"] for r in json.loads(capsys.readouterr().out)] == ["demo/llama"]
    assert "STARTS_WITH" not in fake.called("list_workflows")[-1].arg


def test_the_current_namespace_comes_from_the_kubeconfig_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cli.kubens import context_namespace

    cfg = tmp_path / "config"
    cfg.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u, namespace: models}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    assert context_namespace() == "models"
    cfg.write_text(cfg.read_text().replace(", namespace: models", ""))
    assert context_namespace() == "default"
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    assert context_namespace() == "default"


def test_status_gives_up_after_its_timeout(
    connects: list[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def never(*_: Any) -> Any:
        await asyncio.sleep(60)

    monkeypatch.setattr(cli.main, "_read", never)
    t0 = time.monotonic()
    assert run_cli(["status", "demo/llama", "--timeout", "0.2"]) == 1
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err
    assert err.startswith(f"retire: status: {WID} gave no answer within --timeout 0.2 s")
    for bad in ("0", "-1", "nan", "inf"):
        assert run_cli(["status", "demo/llama", "--timeout", bad]) == 2
        assert "--timeout must be a positive, finite number" in capsys.readouterr().err
