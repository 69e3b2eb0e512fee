"""The worker and the watcher at start-up (issue 20, "Errors and the CLI", last bullet).

Each case runs the real entry point (``python -m worker``, ``python -m watcher``) as a
process: a bad value of any setting each reads (a flag, the variable behind it, the
Temporal connection's environment, the health or metrics address, the kubeconfig) is one
line on stderr naming the setting, and exit code 2, never a traceback.  ``retire-worker``
against a Temporal that is not there ends with one line and exit code 1, never SIGABRT
(it did in 2 of 8 runs: the SDK's thread finishing the failed connect during the
interpreter's finalization).  ``--log-level`` and log lines that name their level.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 30

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def _closed_port() -> int:
    """A port of 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    good = tmp_path / "kubeconfig"
    good.write_text(KUBECONFIG)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"{{{ not: yaml, \xff\xfe")
    not_config = tmp_path / "not-config"
    not_config.write_text("apiVersion: v1\nkind: Config\n")
    return {
        "good": str(good),
        "garbage": str(garbage),
        "not-config": str(not_config),
        "missing": str(tmp_path / "absent"),
        "dir": str(tmp_path),
    }


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port of 127.0.0.1 something listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def _environ(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TEMPORAL_", "RETIRE_", "KUBERNETES_")) and k != "KUBECONFIG"
    }
    return {**env, "HOME": "/nonexistent-home", **extra}


def run(module: str, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def assert_one_line(done: subprocess.CompletedProcess[str], code: int, *names: str) -> str:
    err = done.stderr
    assert "Traceback" not in err, err
    assert "Fatal Python error" not in err, err
    assert done.returncode == code, (done.returncode, err)
    lines = err.splitlines()
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# --- the worker: every setting it reads -------------------------------------------------

WORKER_CASES = [
    # (argv, environment, names the line must carry); "{good}" etc.: the files fixture.
    ([], {"RETIRE_MAX_ACTIVITIES": "abc"}, ["RETIRE_MAX_ACTIVITIES", "'abc'"]),
    ([], {"RETIRE_MAX_ACTIVITIES": "0"}, ["RETIRE_MAX_ACTIVITIES", "at least 1"]),
    ([], {"RETIRE_MAX_EXECS": "1.5"}, ["RETIRE_MAX_EXECS", "'1.5'"]),
    ([], {"RETIRE_MAX_POLLS": "-3"}, ["RETIRE_MAX_POLLS", "'-3'"]),
    ([], {"RETIRE_SERVE": "both"}, ["RETIRE_SERVE", "'both'"]),
    ([], {"RETIRE_METRICS_ADDRESS": "nonsense"}, ["RETIRE_METRICS_ADDRESS", "nonsense"]),
    ([], {"RETIRE_LOG_LEVEL": "loud"}, ["RETIRE_LOG_LEVEL", "loud"]),
    ([], {"RETIRE_TASK_QUEUE": " "}, ["RETIRE_TASK_QUEUE"]),
    ([], {"TEMPORAL_TLS": "maybe"}, ["TEMPORAL_TLS", "maybe"]),
    ([], {"RETIRE_TEMPORAL_TLS": "maybe"}, ["RETIRE_TEMPORAL_TLS", "maybe"]),
    ([], {"TEMPORAL_ADDRESS": "nonsense"}, ["address", "nonsense"]),
    ([], {"TEMPORAL_CONFIG_FILE": "{missing}"}, ["config file", "absent"]),
    (["--max-concurrent-activities", "x"], {}, ["--max-concurrent-activities", "'x'"]),
    (["--max-concurrent-execs", "0"], {}, ["--max-concurrent-execs", "at least 1"]),
    (["--metrics-address", "nonsense"], {}, ["--metrics-address", "nonsense"]),
    (["--metrics-address", "127.0.0.1:99999"], {}, ["--metrics-address", "99999"]),
    (["--metrics-address", "nosuch.invalid:9000"], {}, ["--metrics-address", "nosuch.invalid"]),
    (["--metrics-address", "127.0.0.1:{busy}"], {}, ["--metrics-address", "in use"]),
    (["--log-level", "loud"], {}, ["--log-level", "loud"]),
    (["--no-such-flag"], {}, ["--no-such-flag"]),
    (["--kubeconfig", "{missing}"], {}, ["--kubeconfig", "absent"]),
    (["--kubeconfig", "{garbage}"], {}, ["--kubeconfig", "garbage"]),
    (["--kubeconfig", "{not-config}"], {}, ["--kubeconfig", "not-config", "current-context"]),
    (["--kubeconfig", "{dir}"], {}, ["--kubeconfig", "directory"]),
    ([], {"KUBECONFIG": "{garbage}"}, ["KUBECONFIG", "garbage"]),
    ([], {"KUBECONFIG": ""}, ["--kubeconfig", "in-cluster"]),  # none at all, not in a Pod
]


def _fill(text: str, files: dict[str, str], busy: int) -> str:
    """``{busy}`` and the files' ``{name}`` in ``text`` (JSON braces left alone)."""
    for name, value in {**files, "busy": str(busy)}.items():
        text = text.replace("{" + name + "}", value)
    return text


@pytest.mark.parametrize(("argv", "env", "names"), WORKER_CASES)
def test_a_bad_worker_setting_is_one_line_and_exit_2(
    argv: list[str],
    env: dict[str, str],
    names: list[str],
    files: dict[str, str],
    busy_port: int,
) -> None:
    argv = [_fill(x, files, busy_port) for x in argv]
    env = {k: _fill(v, files, busy_port) for k, v in env.items()}
    if "--kubeconfig" not in argv and "KUBECONFIG" not in env:
        argv = [*argv, "--kubeconfig", files["good"]]  # every case but the kubeconfig's
    argv = ["--address", f"127.0.0.1:{_closed_port()}", *argv]
    if "TEMPORAL_ADDRESS" in env:
        argv = argv[2:]
    assert_one_line(run("worker", argv, _environ(**env)), 2, *names)


# --- the watcher: every setting it reads ------------------------------------------------

WATCHER_CASES = [
    (["--health-address", "nonsense"], {}, ["--health-address", "nonsense"]),
    (["--health-address", "127.0.0.1:99999"], {}, ["--health-address", "99999"]),
    (["--health-address", "127.0.0.1:{busy}"], {}, ["--health-address", "in use"]),
    (["--health-address", "nosuch.invalid:8080"], {}, ["--health-address", "nosuch.invalid"]),
    (["--kubeconfig", "{missing}"], {}, ["--kubeconfig", "absent"]),
    (["--kubeconfig", "{garbage}"], {}, ["--kubeconfig", "garbage"]),
    (["--kubeconfig", "{not-config}"], {}, ["--kubeconfig", "current-context"]),
    ([], {"KUBECONFIG": "{dir}"}, ["KUBECONFIG", "directory"]),
    ([], {"KUBECONFIG": ""}, ["--kubeconfig", "in-cluster"]),
    (["--leader-elect", "--kubeconfig", "{garbage}"], {}, ["--kubeconfig", "garbage"]),
    ([], {"RETIRE_LOG_LEVEL": "loud"}, ["RETIRE_LOG_LEVEL", "loud"]),
    ([], {"RETIRE_TASK_QUEUE": " "}, ["RETIRE_TASK_QUEUE"]),
    ([], {"TEMPORAL_TLS": "maybe"}, ["TEMPORAL_TLS", "maybe"]),
    ([], {"TEMPORAL_ADDRESS": "nonsense"}, ["address", "nonsense"]),
    ([], {"TEMPORAL_CONFIG_FILE": "{garbage}"}, ["config file", "garbage"]),
    (["--resync", "x"], {}, ["--resync", "'x'"]),
    (["--resync", "nan"], {}, ["--resync", "nan"]),
    (["--refresh", "0"], {}, ["--refresh", "positive"]),
    (["--workers", "0"], {}, ["--workers", "at least 1"]),
    (["--quiet-window", "-1"], {}, ["--quiet-window"]),
    (["--lease-seconds", "1"], {}, ["--lease-seconds", "at least 3"]),
    (["--budgets", "{not json"], {}, ["--budgets", "JSON"]),
    (["--budgets", '{"drain_s": -1}'], {}, ["--budgets", "drain_s"]),
    (["--log-level", "loud"], {}, ["--log-level", "loud"]),
]


@pytest.mark.parametrize(("argv", "env", "names"), WATCHER_CASES)
def test_a_bad_watcher_setting_is_one_line_and_exit_2(
    argv: list[str],
    env: dict[str, str],
    names: list[str],
    files: dict[str, str],
    busy_port: int,
) -> None:
    argv = [_fill(x, files, busy_port) for x in argv]
    env = {k: _fill(v, files, busy_port) for k, v in env.items()}
    if "--kubeconfig" not in argv and "KUBECONFIG" not in env:
        argv = [*argv, "--kubeconfig", files["good"]]
    if "TEMPORAL_ADDRESS" not in env:
        argv = ["--address", f"127.0.0.1:{_closed_port()}", *argv]
    done = run("watcher", argv, _environ(**env))
    assert_one_line(done, 2, *names)
    assert "health http" not in done.stdout  # refused before serving anything


# --- Temporal not there: one line, exit 1, never SIGABRT --------------------------------

RUNS = 10


def test_the_worker_never_aborts_when_temporal_is_unreachable(files: dict[str, str]) -> None:
    """Ten starts against a closed port: each one line and exit 1; not one 134/-6 (the
    SDK thread finishing the failed connect during finalization) nor any other signal."""
    codes = []
    for _ in range(RUNS):
        port = _closed_port()
        argv = ["--address", f"127.0.0.1:{port}", "--kubeconfig", files["good"]]
        done = run("worker", argv, _environ())
        codes.append(done.returncode)
        assert done.returncode not in (134, -signal.SIGABRT), done.stderr
        assert_one_line(done, 1, "Temporal", f"127.0.0.1:{port}")
    assert codes == [1] * RUNS


# --- --log-level and the level on every line ---------------------------------------------


def test_the_worker_log_level_and_lines_that_name_it(files: dict[str, str]) -> None:
    base = ["--address", f"127.0.0.1:{_closed_port()}", "--kubeconfig", files["good"]]
    quiet = run("worker", base, _environ())
    assert_one_line(quiet, 1, "Temporal")  # info: nothing logged before the failure
    for argv, env in (
        ([*base, "--log-level", "debug"], {}),
        (base, {"RETIRE_LOG_LEVEL": "DEBUG"}),
    ):
        done = run("worker", argv, _environ(**env))
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr
        debug = [ln for ln in done.stderr.splitlines() if " DEBUG retire-worker " in ln]
        assert any("configuration: WorkerConfig(" in ln for ln in debug), done.stderr
        assert any("connecting to Temporal" in ln for ln in debug), done.stderr


def _watcher_log(files: dict[str, str], *extra: str, env: dict[str, str] | None = None) -> str:
    """What the watcher logs in its first seconds with Temporal not there; then SIGTERM."""
    argv = ["--address", f"127.0.0.1:{_closed_port()}", "--kubeconfig", files["good"], *extra]
    proc = subprocess.Popen(
        [sys.executable, "-m", "watcher", *argv],
        cwd=ROOT,
        env=_environ(**(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("health http://")  # serving
        time.sleep(1.5)  # the first connect attempt and its warning
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    return err


def test_the_watcher_log_level_and_lines_that_name_it(files: dict[str, str]) -> None:
    default = _watcher_log(files)
    assert " INFO retire-watcher " in default and "leading" in default, default
    assert " WARNING retire-connection Temporal at 127.0.0.1:" in default, default
    warning = _watcher_log(files, "--log-level", "warning")
    assert " INFO " not in warning and " WARNING retire-connection " in warning, warning
    error = _watcher_log(files, env={"RETIRE_LOG_LEVEL": "error"})
    assert error == "", error
