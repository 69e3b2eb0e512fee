"""The router and probe client: one TLS context per process, TLS still verified, the
environment's proxies and certificates ignored."""

from __future__ import annotations

import ssl

import httpx
import pytest

from activities.http_client import http_client, tls_context


def test_every_client_shares_the_one_verifying_context() -> None:
    first, second = tls_context(), tls_context()
    assert first is second
    assert first.verify_mode is ssl.CERT_REQUIRED and first.check_hostname
    assert first.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded


def test_a_client_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"ok": True})

    with http_client(timeout=1.5, transport=httpx.MockTransport(answer)) as http:
        assert not http.trust_env
        assert http.timeout == httpx.Timeout(1.5)
        assert http.get("http://127.0.0.1:8000/workers").json() == {"ok": True}
    assert [str(r.url) for r in seen] == ["http://127.0.0.1:8000/workers"]
