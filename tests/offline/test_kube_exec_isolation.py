"""``pods/exec`` must not touch the ApiClient every other call of the worker shares.

``kubernetes.stream.stream()`` swaps ``call_api`` on the ApiClient it is given for the
length of the websocket handshake.  On a shared client, an ordinary request made by
another activity thread meanwhile goes out as a websocket upgrade (and two overlapping
handshakes can leave the swap in place for good): every API call of the worker then fails.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from kubernetes import client

from kube import Kube, podexec


def test_exec_handshake_leaves_the_shared_api_client_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    in_handshake = threading.Event()
    release = threading.Event()

    def blocked_handshake(configuration: Any, url: str, headers: Any, *, timeout: float) -> Any:
        in_handshake.set()
        release.wait(5)
        raise ConnectionRefusedError("no API server in this test")

    monkeypatch.setattr(podexec, "open_websocket", blocked_handshake)
    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # never reached
    kube = Kube(api=client.ApiClient(cfg), timeout_s=2)
    results: list[Any] = []
    t = threading.Thread(
        target=lambda: results.append(
            kube.exec_pod(
                namespace="ns",
                name="p",
                container="engine",
                argv=["true"],
                timeout_s=2,
                output_cap=1024,
            )
        )
    )
    t.start()
    try:
        assert in_handshake.wait(5), "exec never reached its handshake"
        # Mid-handshake, the client every other activity uses is untouched.
        assert "call_api" not in vars(kube.api), "exec swapped call_api on the shared client"
    finally:
        release.set()
        t.join(5)
    assert results and results[0].error, results
    assert "call_api" not in vars(kube.api)


def test_every_request_and_the_exec_handshake_carry_the_programs_user_agent(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server's audit log records the User-Agent: "who deleted this Pod" reads
    ``retire-worker/<version>``, for plain requests and for each pods/exec."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    kube = Kube.from_config(kubeconfig=str(kubeconfig), program="retire-worker")
    assert kube.api.user_agent.startswith("retire-worker/")
    sent: list[list[str]] = []

    class Recorder:
        def __init__(self, **_: Any) -> None:
            pass

        def connect(self, url: str, *, header: list[str], **_: Any) -> None:
            sent.append(header)
            raise ConnectionRefusedError("recorded")

    monkeypatch.setattr(podexec, "WebSocket", Recorder)
    result = kube.exec_pod(
        namespace="ns", name="p", container="engine", argv=["true"], timeout_s=2, output_cap=64
    )
    assert result.error and sent
    assert f"user-agent: {kube.api.user_agent}" in sent[0]
