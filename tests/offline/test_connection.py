"""The one Temporal connection configuration: profiles, environment, flags, TLS, bad input.

Offline: ``Client.connect`` runs for real but lazily (no network call is ever made), so
the tests see exactly what the worker, the watcher and ``retire`` would dial.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import TLSConfig

from cli.main import main as cli_main
from connection.client import connect, connect_retrying
from connection.errors import ConnectionConfigError, one_line
from connection.flags import ConnectionFlags, add_connection_flags
from connection.settings import ConnectionSettings, resolve
from watcher.__main__ import main as watcher_main
from worker.__main__ import main as worker_main

ROOT = Path(__file__).resolve().parents[2]
CERT = b"-----BEGIN CERTIFICATE-----\nMIIBcert\n-----END CERTIFICATE-----\n"
KEY = b"-----BEGIN PRIVATE KEY-----\nMIIBkey\n-----END PRIVATE KEY-----\n"
CA = b"-----BEGIN CERTIFICATE-----\nMIIBca\n-----END CERTIFICATE-----\n"


@pytest.fixture(autouse=True)
def no_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of our own: the SDK looks for ~/.config/temporalio/temporal.toml there."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, Path]:
    """A client certificate, its key and a CA bundle, as PEM files."""
    files = {"cert": CERT, "key": KEY, "ca": CA}
    for name, data in files.items():
        (tmp_path / f"{name}.pem").write_bytes(data)
    return {name: tmp_path / f"{name}.pem" for name in files}


def settings(argv: list[str], environ: Mapping[str, str] | None = None) -> ConnectionSettings:
    """Parse ``argv`` with the shared flags and resolve them against ``environ``."""
    p = argparse.ArgumentParser()
    add_connection_flags(p)
    return resolve(ConnectionFlags.from_args(p.parse_args(argv)), environ=environ or {})


def toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "temporal.toml"
    path.write_text(text)
    return path


PROFILES = """
[profile.default]
address = "file-default:7233"
namespace = "file-ns"

[profile.prod]
address = "prod.example:7233"
namespace = "prod-ns"
api_key = "prod-key"

[profile.prod.tls]
server_name = "prod.tmprl"

[profile.prod.grpc_meta]
team = "serving"
"""


# --- where each value comes from ---------------------------------------------------------


def test_defaults_without_any_configuration() -> None:
    s = settings([])
    assert (s.address, s.namespace, s.api_key, s.tls, dict(s.rpc_metadata)) == (
        "127.0.0.1:7233",
        "default",
        None,
        False,
        {},
    )


def test_legacy_retire_variables_are_a_fallback() -> None:
    s = settings(
        [],
        {
            "RETIRE_TEMPORAL_ADDRESS": "legacy:7233",
            "RETIRE_TEMPORAL_NAMESPACE": "legacy-ns",
            "RETIRE_TEMPORAL_API_KEY": "legacy-key",
        },
    )
    assert (s.address, s.namespace, s.api_key, s.tls) == (
        "legacy:7233",
        "legacy-ns",
        "legacy-key",
        True,
    )
    assert settings([], {"RETIRE_TEMPORAL_TLS": "1"}).tls is True
    assert settings([], {"RETIRE_TEMPORAL_TLS": "false"}).tls is False


def test_standard_variables_beat_the_legacy_ones() -> None:
    s = settings(
        [],
        {
            "TEMPORAL_ADDRESS": "std:7233",
            "RETIRE_TEMPORAL_ADDRESS": "legacy:7233",
            "TEMPORAL_NAMESPACE": "std-ns",
            "RETIRE_TEMPORAL_NAMESPACE": "legacy-ns",
            "TEMPORAL_TLS": "false",
            "RETIRE_TEMPORAL_TLS": "true",
        },
    )
    assert (s.address, s.namespace, s.tls) == ("std:7233", "std-ns", False)


def test_the_default_profile_of_a_config_file(tmp_path: Path) -> None:
    s = settings(["--config-file", str(toml(tmp_path, PROFILES))])
    assert (s.address, s.namespace, s.api_key, s.tls) == (
        "file-default:7233",
        "file-ns",
        None,
        False,
    )
    assert s.origin == f"profile default of {tmp_path / 'temporal.toml'}"


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_named_profile_from_a_config_file(tmp_path: Path, how: str) -> None:
    path = toml(tmp_path, PROFILES)
    if how == "flag":
        s = settings(["--config-file", str(path), "--profile", "prod"])
    else:
        s = settings([], {"TEMPORAL_CONFIG_FILE": str(path), "TEMPORAL_PROFILE": "prod"})
    assert (s.address, s.namespace, s.api_key) == ("prod.example:7233", "prod-ns", "prod-key")
    assert s.tls == TLSConfig(domain="prod.tmprl")
    assert dict(s.rpc_metadata) == {"team": "serving"}


def test_the_sdk_default_file_location_is_read(no_user_config: Path) -> None:
    config_dir = no_user_config / ".config" / "temporalio"
    config_dir.mkdir(parents=True)
    (config_dir / "temporal.toml").write_text(PROFILES)
    assert settings([]).address == "file-default:7233"


def test_environment_overrides_the_file(tmp_path: Path) -> None:
    s = settings(
        ["--config-file", str(toml(tmp_path, PROFILES)), "--profile", "prod"],
        {"TEMPORAL_ADDRESS": "env:7233", "TEMPORAL_API_KEY": "env-key"},
    )
    assert (s.address, s.namespace, s.api_key) == ("env:7233", "prod-ns", "env-key")


def test_flags_override_environment_and_file(tmp_path: Path) -> None:
    env = {
        "TEMPORAL_CONFIG_FILE": str(toml(tmp_path, PROFILES)),
        "TEMPORAL_PROFILE": "prod",
        "TEMPORAL_ADDRESS": "env:7233",
        "TEMPORAL_NAMESPACE": "env-ns",
        "TEMPORAL_API_KEY": "env-key",
    }
    s = settings(
        [
            "--address",
            "flag:7233",
            "--temporal-namespace",
            "flag-ns",
            "--api-key",
            "flag-key",
            "--no-tls",
        ],
        env,
    )
    assert (s.address, s.namespace, s.api_key, s.tls) == ("flag:7233", "flag-ns", "flag-key", False)


def test_an_empty_variable_counts_as_unset() -> None:
    s = settings([], {"TEMPORAL_TLS": "", "TEMPORAL_ADDRESS": "", "TEMPORAL_API_KEY": ""})
    assert (s.address, s.tls, s.api_key) == ("127.0.0.1:7233", False, None)


# --- TLS, mTLS, API key ------------------------------------------------------------------


def test_an_api_key_turns_tls_on_unless_tls_is_refused() -> None:
    assert settings(["--api-key", "k"]).tls is True
    assert settings([], {"TEMPORAL_API_KEY": "k"}).tls is True
    assert settings(["--api-key", "k", "--no-tls"]).tls is False
    assert settings(["--tls"]).tls is True


def test_mtls_from_flags_reads_the_files(pem: dict[str, Path]) -> None:
    s = settings(
        [
            "--tls-cert",
            str(pem["cert"]),
            "--tls-key",
            str(pem["key"]),
            "--tls-ca",
            str(pem["ca"]),
            "--tls-server-name",
            "temporal.internal",
        ]
    )
    assert s.tls == TLSConfig(
        server_root_ca_cert=CA, domain="temporal.internal", client_cert=CERT, client_private_key=KEY
    )
    assert "mTLS" in s.describe()


def test_mtls_from_the_standard_environment(pem: dict[str, Path]) -> None:
    s = settings(
        [],
        {
            "TEMPORAL_TLS_CLIENT_CERT_PATH": str(pem["cert"]),
            "TEMPORAL_TLS_CLIENT_KEY_DATA": KEY.decode(),
            "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(pem["ca"]),
            "TEMPORAL_TLS_SERVER_NAME": "env.internal",
        },
    )
    assert s.tls == TLSConfig(
        server_root_ca_cert=CA, domain="env.internal", client_cert=CERT, client_private_key=KEY
    )


def test_mtls_from_a_profile_and_a_flag_replacing_one_file(
    tmp_path: Path, pem: dict[str, Path]
) -> None:
    other = tmp_path / "other-cert.pem"
    other.write_bytes(CERT.replace(b"cert", b"other"))
    path = toml(
        tmp_path,
        f"""
[profile.default.tls]
client_cert_path = "{pem["cert"]}"
client_key_path = "{pem["key"]}"
server_ca_cert_data = '''{CA.decode()}'''
""",
    )
    from_file = settings(["--config-file", str(path)])
    assert from_file.tls == TLSConfig(
        server_root_ca_cert=CA, client_cert=CERT, client_private_key=KEY
    )
    overridden = settings(["--config-file", str(path), "--tls-cert", str(other)])
    assert isinstance(overridden.tls, TLSConfig)
    assert overridden.tls.client_cert == other.read_bytes()
    assert overridden.tls.client_private_key == KEY


def test_a_tls_disabled_profile_is_turned_on_by_a_tls_file_flag(
    tmp_path: Path, pem: dict[str, Path]
) -> None:
    path = toml(tmp_path, "[profile.default.tls]\ndisabled = true\n")
    assert settings(["--config-file", str(path)]).tls is False
    assert settings(["--config-file", str(path), "--tls-ca", str(pem["ca"])]).tls == TLSConfig(
        server_root_ca_cert=CA
    )


def test_the_api_key_is_never_printed() -> None:
    s = settings(["--api-key", "s3cret-key"])
    assert "s3cret" not in repr(s)
    assert "s3cret" not in s.describe()
    assert "API key" in s.describe()


def test_the_mtls_key_is_never_printed(pem: dict[str, Path]) -> None:
    """Neither the settings nor the worker's configuration print the client key (or the
    certificates) in their repr or str, whatever logs them (issue 22)."""
    from worker.config import WorkerConfig

    argv = ["--tls-cert", str(pem["cert"]), "--tls-key", str(pem["key"]), "--api-key", "k3y"]
    s = settings(argv)
    assert isinstance(s.tls, TLSConfig) and s.tls.client_private_key == KEY
    cfg = WorkerConfig.parse(argv, environ={})
    for shown in (repr(s), str(s), f"{s!r}", repr(cfg), str(cfg)):
        assert "MIIBkey" not in shown and "PRIVATE KEY" not in shown, shown
        assert "MIIBcert" not in shown and "k3y" not in shown, shown
    assert "mTLS" in repr(s) and "127.0.0.1:7233" in repr(s)


# --- connect -----------------------------------------------------------------------------


@pytest.fixture
def lazy_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``Client.connect`` lazy: the real client is built, nothing is dialled."""
    real = Client.connect

    async def lazy(*args: Any, **kwargs: Any) -> Client:
        return await real(*args, **kwargs, lazy=True)

    monkeypatch.setattr(Client, "connect", lazy)


@pytest.mark.usefixtures("lazy_connect")
async def test_connect_hands_every_field_to_the_client(
    tmp_path: Path, pem: dict[str, Path]
) -> None:
    s = settings(
        [
            "--config-file",
            str(toml(tmp_path, PROFILES)),
            "--profile",
            "prod",
            "--tls-cert",
            str(pem["cert"]),
            "--tls-key",
            str(pem["key"]),
        ]
    )
    client = await connect(s)
    cfg = client.service_client.config
    assert (cfg.target_host, cfg.api_key, dict(cfg.rpc_metadata)) == (
        "prod.example:7233",
        "prod-key",
        {"team": "serving"},
    )
    assert cfg.tls == TLSConfig(domain="prod.tmprl", client_cert=CERT, client_private_key=KEY)
    assert client.namespace == "prod-ns"
    assert client.data_converter is pydantic_data_converter


@pytest.mark.usefixtures("lazy_connect")
async def test_connect_retrying_returns_at_once_when_connected() -> None:
    client = await connect_retrying(
        settings(["--address", "127.0.0.1:7233"]), stop=threading.Event()
    )
    assert client is not None
    assert client.service_client.config.target_host == "127.0.0.1:7233"


async def test_connect_retrying_gives_up_only_when_stopped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    stop = threading.Event()
    attempts: list[str] = []

    async def down(target_host: str, **_: Any) -> Client:
        attempts.append(target_host)
        if len(attempts) == 2:
            stop.set()
        raise RuntimeError("Failed client connect: connection refused\nmore detail")

    monkeypatch.setattr(Client, "connect", down)
    assert await connect_retrying(settings([]), stop=stop) is None
    assert attempts == ["127.0.0.1:7233", "127.0.0.1:7233"]
    assert "not reachable (Failed client connect: connection refused)" in caplog.text


# --- bad configuration: one clear line ---------------------------------------------------


def _bad_cases(tmp: Path, pem: dict[str, Path]) -> Iterator[tuple[list[str], dict[str, str], str]]:
    def f(name: str, text: str) -> str:
        path = tmp / name
        path.write_text(text)
        return str(path)

    yield ["--config-file", str(tmp / "absent.toml")], {}, "cannot read config file"
    yield [], {"TEMPORAL_CONFIG_FILE": str(tmp / "absent.toml")}, "No such file"
    yield ["--config-file", str(tmp)], {}, "Is a directory"
    yield ["--config-file", f("bad.toml", "[profile.default\naddress=")], {}, "unclosed table"
    yield (
        ["--config-file", f("type.toml", "[profile.default]\naddress = 5\n")],
        {},
        "expected a string",
    )
    yield (
        ["--config-file", f("typo.toml", '[profile.default]\nadress = "x:1"\n')],
        {},
        "unknown field `adress`",
    )
    yield (
        ["--config-file", f("ok.toml", PROFILES), "--profile", "nope"],
        {},
        "Profile 'nope' not found",
    )
    yield ["--profile", "nope"], {}, "Profile 'nope' not found"
    yield ["--tls-cert", str(pem["cert"])], {}, "certificate without its key"
    yield ["--tls-key", str(pem["key"])], {}, "key without its certificate"
    yield [], {"TEMPORAL_TLS_CLIENT_CERT_PATH": str(pem["cert"])}, "without its key"
    yield (
        [
            "--config-file",
            f("half.toml", f'[profile.default.tls]\nclient_cert_path = "{pem["cert"]}"\n'),
        ],
        {},
        "without its key",
    )
    yield ["--tls-ca", str(tmp / "absent.pem")], {}, "cannot read the TLS server CA"
    yield (
        ["--tls-cert", f("junk.pem", "not a certificate"), "--tls-key", str(pem["key"])],
        {},
        "is not PEM",
    )
    yield ["--no-tls", "--tls-ca", str(pem["ca"])], {}, "--no-tls contradicts"
    yield [], {"TEMPORAL_TLS": "maybe"}, "TEMPORAL_TLS='maybe'"
    yield [], {"RETIRE_TEMPORAL_TLS": "yes"}, "RETIRE_TEMPORAL_TLS='yes'"
    yield (
        [],
        {"TEMPORAL_TLS_CLIENT_CERT_PATH": "/x", "TEMPORAL_TLS_CLIENT_CERT_DATA": "y"},
        "Cannot specify both",
    )
    for address in ("localhost", "host:", ":7233", "host:port", "host:0", "host:70000"):
        yield ["--address", address], {}, "must be HOST:PORT"
    yield [], {"TEMPORAL_ADDRESS": "no-port"}, "must be HOST:PORT"


def test_bad_configuration_is_one_clear_line(tmp_path: Path, pem: dict[str, Path]) -> None:
    cases = list(_bad_cases(tmp_path, pem))
    assert len(cases) >= 20
    for argv, env, reason in cases:
        with pytest.raises(ConnectionConfigError) as info:
            settings(argv, env)
        message = str(info.value)
        assert reason in message, (argv, env, message)
        assert "\n" not in message, (argv, env, message)


def test_the_toml_parser_message_is_folded_to_its_position_and_reason() -> None:
    raw = (
        "Configuration loading error: TOML parse error at line 2, column 9\n  |\n"
        "2 | address=5\n  |         ^\ninvalid type: integer `5`, expected a string\n"
    )
    assert one_line(raw) == (
        "TOML parse error at line 2, column 9: invalid type: integer `5`, expected a string"
    )


@pytest.mark.parametrize(
    ("main", "argv", "prog"),
    [
        (worker_main, [], "retire-worker"),
        (watcher_main, [], "retire-watcher"),
        (cli_main, ["status", "ns/md"], "retire"),
    ],
)
def test_every_command_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], main: Any, argv: list[str], prog: str
) -> None:
    missing = tmp_path / "absent.toml"
    assert main(["--config-file", str(missing), *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"{prog}: cannot read config file {missing}: No such file or directory\n"


# --- the same flags everywhere -----------------------------------------------------------


def test_worker_watcher_and_cli_show_the_same_connection_flags() -> None:
    p = argparse.ArgumentParser()
    add_connection_flags(p)
    expected = {opt for action in p._actions for opt in action.option_strings} - {"-h", "--help"}
    assert {
        "--address",
        "--temporal-namespace",
        "--profile",
        "--config-file",
        "--tls",
        "--no-tls",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
        "--tls-server-name",
        "--api-key",
    } <= expected
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RETIRE_"))}
    for module in ("worker", "watcher", "cli"):
        out = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        shown = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", out))
        assert expected <= shown, (module, expected - shown)
        assert "Temporal connection:" in out
        assert "--task-queue" in shown
