"""The worker, the watcher and ``retire`` on a Temporal reached over TLS and over mTLS.

The dev server has no TLS option, so a TLS terminator (``testbed.tls_front``) with a
certificate of a test CA sits in front of its plaintext gRPC port; a second one also
requires a client certificate of that CA. The front records every connection (the client
certificate's CN, a failed handshake, the first decrypted bytes), so each test asserts
what really went over the wire, not only that a command exited 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from cli.main import main as cli_main
from connection.client import connect, connect_retrying
from connection.flags import ConnectionFlags
from connection.settings import ConnectionSettings, resolve
from retirement.models import RetirementState
from retirement.phases import Outcome
from testbed.paths import REPO_ROOT, venv_bin
from testbed.pki import make_client_cert, make_pki
from testbed.tls_front import FrontConnection, TlsFront
from tests.helpers import eventually, eventually_async
from tests.helpers.dev_server import start
from tests.workflows.fakes import FakeWorld, running
from watcher.retirements import Retirements
from watcher.running import RunningSet

pytestmark = [pytest.mark.devserver, pytest.mark.asyncio(loop_scope="session")]

CLIENT_CN = "retire-tls-test-client"
API_KEY = "test-secret-0120"


@dataclass(frozen=True)
class Certs:
    """The test CA, the front's serving certificate and a client certificate, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    pki = make_pki(tmp_path_factory.mktemp("pki"), ips=["127.0.0.1"])  # and DNS:localhost
    cert, key = make_client_cert(pki, "client", cn=CLIENT_CN)
    return Certs(pki.ca_cert, pki.server_cert, pki.server_key, cert, key)


def upstream(dev_env: WorkflowEnvironment) -> str:
    """The dev server's plaintext gRPC address."""
    return dev_env.client.service_client.config.target_host


@pytest.fixture(scope="module")
def tls_front(dev_env: WorkflowEnvironment, certs: Certs) -> Iterator[TlsFront]:
    """TLS in front of the dev server: any client that trusts the test CA."""
    with TlsFront(upstream=upstream(dev_env), cert=certs.server_cert, key=certs.server_key) as f:
        yield f


@pytest.fixture(scope="module")
def mtls_front(dev_env: WorkflowEnvironment, certs: Certs) -> Iterator[TlsFront]:
    """mTLS in front of the dev server: only clients with a certificate of the test CA."""
    with TlsFront(
        upstream=upstream(dev_env),
        cert=certs.server_cert,
        key=certs.server_key,
        client_ca=certs.ca,
    ) as f:
        yield f


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No TEMPORAL_* / RETIRE_* variable of the machine, and an empty HOME (the SDK reads
    ~/.config/temporalio/temporal.toml from it)."""
    for name in list(os.environ):
        if name.startswith(("TEMPORAL_", "RETIRE_")):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


async def retire(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``retire ARGS`` (its ``main``, in a thread: the dev server's client shares the event
    loop), as the other dev-server tests call it; its exit code and its stderr.

    In this process rather than as the executable: a short-lived process with a Temporal
    client can abort as its interpreter exits (temporalio/sdk-python#300, "Fatal Python
    error: PyGILState_Release", SIGABRT) after ``retire`` chose its exit code: measured
    here for 1 in 30 plaintext and 3 in 30 TLS runs of ``retire list``, not a TLS matter.
    """
    capsys.readouterr()
    code = await asyncio.to_thread(cli_main, list(args))
    return code, capsys.readouterr().err


def one_line_error(err: str, *, address: str) -> None:
    """The CLI's failure: exactly one line, naming the address, and no traceback."""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"retire: cannot reach Temporal at {address}: "), err
    assert "Traceback" not in err


def since(front: TlsFront, before: int) -> list[FrontConnection]:
    """The connections the front took since it had ``before`` of them."""
    return front.connections[before:]


def mtls_flags(front: TlsFront, certs: Certs) -> ConnectionFlags:
    return ConnectionFlags(
        address=front.address,
        tls_ca=str(certs.ca),
        tls_cert=str(certs.client_cert),
        tls_key=str(certs.client_key),
    )


def mtls_settings(front: TlsFront, certs: Certs) -> ConnectionSettings:
    return resolve(mtls_flags(front, certs), environ={})


# RFC 7541 Appendix B: the Huffman codes of the characters used here.
_HUFFMAN = {
    " ": (0x14, 6),
    "-": (0x16, 6),
    "0": (0x0, 5),
    "1": (0x1, 5),
    "2": (0x2, 5),
    "B": (0x5D, 7),
    "a": (0x3, 5),
    "c": (0x4, 5),
    "e": (0x5, 5),
    "h": (0x27, 6),
    "n": (0x2A, 6),
    "o": (0x7, 5),
    "r": (0x2C, 6),
    "s": (0x8, 5),
    "t": (0x9, 5),
}


def hpack_huffman(text: str) -> bytes:
    """``text`` as the Huffman-coded bytes of an HPACK string literal (padded with ones)."""
    bits = length = 0
    for ch in text:
        code, n = _HUFFMAN[ch]
        bits, length = (bits << n) | code, length + n
    pad = -length % 8
    bits, length = (bits << pad) | ((1 << pad) - 1), length + pad
    return bits.to_bytes(length // 8, "big")


async def test_the_hpack_huffman_coder_matches_the_rfc() -> None:
    assert hpack_huffman("no-cache") == bytes.fromhex("a8eb10649cbf")  # RFC 7541 C.4.2


def sent_api_key(conn: FrontConnection, key: str) -> bool:
    """Whether the client sent ``authorization: Bearer KEY`` (Huffman-coded or not)."""
    value = f"Bearer {key}"
    return hpack_huffman(value) in conn.head or value.encode() in conn.head


async def test_the_front_only_uses_loopback(certs: Certs) -> None:
    pem = {"cert": certs.server_cert, "key": certs.server_key}
    for host, up in [("0.0.0.0", "127.0.0.1:7233"), ("127.0.0.1", "10.1.2.3:7233")]:
        with pytest.raises(ValueError, match="loopback"):
            TlsFront(upstream=up, host=host, **pem)
    with pytest.raises(ValueError, match="loopback"):
        TlsFront(upstream="temporal.example:7233", **pem)


# --- retire over TLS ---------------------------------------------------------------------


async def test_retire_lists_over_tls_trusting_the_test_ca(
    tls_front: TlsFront, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    before = len(tls_front.connections)
    code, err = await retire(
        capsys, "--address", tls_front.address, "--tls", "--tls-ca", str(certs.ca), "list"
    )
    assert code == 0, err
    seen = since(tls_front, before)
    assert seen and all(c.tls and c.alpn == "h2" and not c.client_cert for c in seen), seen
    assert sum(c.to_server for c in seen) > 0 and sum(c.to_client for c in seen) > 0
    assert not any(sent_api_key(c, API_KEY) for c in seen)  # no key given, none sent


async def test_retire_refuses_a_server_it_does_not_trust(
    tls_front: TlsFront, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    before = len(tls_front.connections)
    # Without the test CA: the system's roots do not know it.
    code, err = await retire(capsys, "--address", tls_front.address, "--tls", "list")
    assert code == 1
    one_line_error(err, address=tls_front.address)
    assert "UnknownIssuer" in err
    # The right CA, but a name the certificate does not carry.
    code, err = await retire(
        capsys,
        "--address",
        tls_front.address,
        "--tls-ca",
        str(certs.ca),
        "--tls-server-name",
        "not-the-front.example",
        "list",
    )
    assert code == 1
    one_line_error(err, address=tls_front.address)
    assert "NotValidForName" in err
    refused = since(tls_front, before)
    assert len(refused) >= 2 and all(not c.tls and not c.to_server for c in refused), refused
    # A name it does carry.
    code, err = await retire(
        capsys,
        "--address",
        tls_front.address,
        "--tls-ca",
        str(certs.ca),
        "--tls-server-name",
        "localhost",
        "list",
    )
    assert code == 0, err


async def test_the_api_key_travels_inside_tls(
    tls_front: TlsFront,
    certs: Certs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An API key turns TLS on by itself; the front sees the bearer header go by (the dev
    server has no authorizer, so it cannot say it received it)."""
    before = len(tls_front.connections)
    monkeypatch.setenv("TEMPORAL_API_KEY", API_KEY)
    code, err = await retire(
        capsys, "--address", tls_front.address, "--tls-ca", str(certs.ca), "list"
    )
    assert code == 0, err
    seen = since(tls_front, before)
    assert seen and all(c.tls for c in seen)
    assert any(sent_api_key(c, API_KEY) for c in seen), [c.head[:200] for c in seen]
    assert not any(sent_api_key(c, "test-secret-0121") for c in seen)  # it tells keys apart


# --- retire over mTLS ----------------------------------------------------------------------


async def test_retire_lists_over_mtls_with_a_client_certificate(
    mtls_front: TlsFront, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    before = len(mtls_front.connections)
    code, err = await retire(
        capsys,
        "--address",
        mtls_front.address,
        "--tls-ca",
        str(certs.ca),
        "--tls-cert",
        str(certs.client_cert),
        "--tls-key",
        str(certs.client_key),
        "list",
    )
    assert code == 0, err
    seen = since(mtls_front, before)
    assert seen and all(c.client_cn == CLIENT_CN and c.to_server > 0 for c in seen), seen


async def test_retire_without_a_client_certificate_is_refused_cleanly(
    mtls_front: TlsFront, certs: Certs, capsys: pytest.CaptureFixture[str]
) -> None:
    before = len(mtls_front.connections)
    code, err = await retire(
        capsys, "--address", mtls_front.address, "--tls-ca", str(certs.ca), "list"
    )
    assert code == 1
    one_line_error(err, address=mtls_front.address)
    refused = eventually(
        lambda: [c for c in since(mtls_front, before) if c.error],
        what="the front refusing the handshake",
        timeout=10,
    )
    assert all(not c.tls and not c.client_cert for c in refused), refused
    assert not any(c.to_server for c in since(mtls_front, before))


async def test_retire_over_mtls_from_the_standard_variables(
    mtls_front: TlsFront,
    certs: Certs,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TEMPORAL_ADDRESS", mtls_front.address)
    monkeypatch.setenv("TEMPORAL_TLS_SERVER_CA_CERT_PATH", str(certs.ca))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_CERT_PATH", str(certs.client_cert))
    monkeypatch.setenv("TEMPORAL_TLS_CLIENT_KEY_PATH", str(certs.client_key))
    before = len(mtls_front.connections)
    code, err = await retire(capsys, "list")
    assert code == 0, err
    seen = since(mtls_front, before)
    assert seen and all(c.client_cn == CLIENT_CN for c in seen), seen


async def test_retire_over_mtls_from_a_profile(
    mtls_front: TlsFront, certs: Certs, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text(
        f"""
[profile.default]
address = "127.0.0.1:1"

[profile.tls-front]
address = "{mtls_front.address}"
namespace = "default"

[profile.tls-front.tls]
server_ca_cert_path = "{certs.ca}"
client_cert_path = "{certs.client_cert}"
client_key_path = "{certs.client_key}"
server_name = "localhost"
"""
    )
    before = len(mtls_front.connections)
    code, err = await retire(capsys, "--config-file", str(config), "--profile", "tls-front", "list")
    assert code == 0, err
    seen = since(mtls_front, before)
    assert seen and all(c.client_cn == CLIENT_CN for c in seen), seen


# --- the worker over mTLS ------------------------------------------------------------------


async def test_a_retirement_completes_with_its_worker_and_client_over_mtls(
    mtls_front: TlsFront, certs: Certs
) -> None:
    """Workflow tasks, activity tasks, the start and the result all go through the front:
    the worker's client and the starter's are clients of the front only."""
    before = len(mtls_front.connections)
    client = await connect(mtls_settings(mtls_front, certs))
    world = FakeWorld()
    async with running(client, world) as queue:
        handle = await start(client, queue)
        state: RetirementState = await asyncio.wait_for(handle.result(), 60)
    assert state.outcome is Outcome.COMPLETED, state
    assert {"admit", "drain", "delete"} <= set(world.calls), world.calls
    seen = since(mtls_front, before)
    assert seen and all(c.client_cn == CLIENT_CN for c in seen), seen


def kubeconfig(path: Path) -> Path:
    """A kubeconfig of a cluster that is not there (the worker only loads it to start)."""
    path.write_text(
        """apiVersion: v1
kind: Config
clusters:
- name: none
  cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}
users:
- name: none
  user: {token: "none"}
contexts:
- name: none
  context: {cluster: none, user: none}
current-context: none
"""
    )
    return path


async def pollers(client: Client, queue: str) -> list[str]:
    """The identities polling ``queue`` for workflow tasks, as the server sees them."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return [p.identity for p in resp.pollers]


async def test_the_worker_process_serves_over_mtls(
    dev_env: WorkflowEnvironment, mtls_front: TlsFront, certs: Certs, tmp_path: Path
) -> None:
    """``python -m worker`` with the TLS flags polls through the front and runs the first
    workflow task of a retirement (its activities need a cluster: not here)."""
    queue = f"tls-proc-{uuid.uuid4().hex[:8]}"
    before = len(mtls_front.connections)
    log = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RETIRE_"))}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "worker",
                "--address",
                mtls_front.address,
                "--tls-ca",
                str(certs.ca),
                "--tls-cert",
                str(certs.client_cert),
                "--tls-key",
                str(certs.client_key),
                "--task-queue",
                queue,
                "--kubeconfig",
                str(kubeconfig(tmp_path / "kubeconfig")),
                "--max-concurrent-activities",
                "2",
            ],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**env, "HOME": str(tmp_path)},
        )
    handle = None
    try:
        identities = await eventually_async(
            lambda: pollers(dev_env.client, queue),
            accept=lambda ids: any(i.startswith(f"{proc.pid}@") for i in ids),
            what="the worker process polling its task queue",
            timeout=60,
            interval=0.5,
        )
        eventually(lambda: "(mTLS;" in log.read_text(), what="the worker's start line")
        handle = await start(dev_env.client, queue)

        async def completed_by() -> list[str]:
            return [
                e.workflow_task_completed_event_attributes.identity
                async for e in handle.fetch_history_events()
                if e.event_type is EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
            ]

        done = await eventually_async(completed_by, what="a workflow task completed", timeout=30)
        assert set(done) <= set(identities), (done, identities)
    finally:
        if handle is not None:
            await handle.terminate("test over")
        proc.send_signal(signal.SIGTERM)
        code = await asyncio.to_thread(proc.wait, 60)
    assert code == 0, log.read_text()
    seen = since(mtls_front, before)
    assert seen and all(c.client_cn == CLIENT_CN for c in seen), seen


# --- the watcher's connection over mTLS ----------------------------------------------------


async def test_the_watchers_connection_over_mtls(
    dev_env: WorkflowEnvironment,
    mtls_front: TlsFront,
    certs: Certs,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``connect_retrying`` (the watcher's way in) over mTLS, then the watcher's own
    visibility query finds a running retirement through the front."""
    queue = f"tls-none-{uuid.uuid4().hex[:8]}"  # no worker: it stays Running, untouched
    handle = await start(dev_env.client, queue)
    before = len(mtls_front.connections)
    try:
        client = await asyncio.wait_for(
            connect_retrying(mtls_settings(mtls_front, certs), stop=threading.Event()), 30
        )
        assert client is not None
        running = RunningSet()
        ns, _, name = handle.id.removeprefix("retirement/").partition("/")
        await eventually_async(
            lambda: running.refresh(Retirements(client)),
            accept=lambda _changed: (ns, name) in running.running,
            what="the watcher's visibility query listing the retirement",
            timeout=15,
            interval=0.3,
        )
    finally:
        await handle.terminate("test over")
    seen = since(mtls_front, before)
    assert seen and all(c.client_cn == CLIENT_CN for c in seen), seen
    # Without its client certificate the watcher keeps trying (it never exits on it),
    # logging why, until it is stopped.
    stop = threading.Event()
    no_cert = resolve(ConnectionFlags(address=mtls_front.address, tls_ca=str(certs.ca)), environ={})
    timer = threading.Timer(1.5, stop.set)
    timer.start()
    with caplog.at_level(logging.WARNING, logger="retire-connection"):
        assert await asyncio.wait_for(connect_retrying(no_cert, stop=stop), 30) is None
    timer.cancel()
    assert f"Temporal at {mtls_front.address} not reachable" in caplog.text


async def test_the_retire_executable_never_aborts_at_exit(
    tls_front: TlsFront, certs: Certs
) -> None:
    """The real ``retire`` executable, 30 times over TLS: every run exits 0 with its
    output, none aborts while the interpreter finalizes (``Fatal Python error:
    PyGILState_Release``, SIGABRT: temporalio/sdk-python#300; before ``cli.main.entry``
    left with ``os._exit``, 3 runs in 30 did, measured)."""
    argv = [
        str(venv_bin("retire")),
        "--address",
        tls_front.address,
        "--tls-ca",
        str(certs.ca),
        "list",
        # Scoped to a namespace no test uses: the connection and the visibility listing run
        # as always, but no row is read (other tests' retirements would cost a read each).
        "--in",
        "exit-check",
    ]

    def once() -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_plain_env())

    for _ in range(30):
        done = await asyncio.to_thread(once)
        assert done.returncode == 0, (done.returncode, done.stderr[-500:])
        assert done.stdout.startswith("DEPLOYMENT"), done.stdout
        assert "Fatal Python error" not in done.stderr


def _plain_env() -> dict[str, str]:
    """This process's environment without Temporal settings (the CLI reads only flags)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RETIRE_"))}
