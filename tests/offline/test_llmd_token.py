"""llm-d's picker is scraped with a dedicated token that may only read ``/metrics``, never
with the worker's own ServiceAccount token (issue 22, C1).

The scrape goes to whatever Pod a tenant labels as the deployment's router, so whatever
token it carries is the tenant's.  The worker's own token can exec into, label and delete
Pods: it is never sent, whether no token is configured, the configured file is the one
Kubernetes mounts for the worker, a copy of it, or another token of the worker's own
ServiceAccount.  Each such scrape reads UNKNOWN and says why.

The worker's mounted token is ``activities.routers.llmd.OWN_TOKEN_FILE``; the tests point
it at a file of their own (the name the code before this change used for its default,
``DEFAULT_TOKEN_FILE``, too, so that these tests show what it did).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

import activities.routers.llmd as llmd
from activities.routers import LlmdPicker
from testbed.routers_emulated import EndpointPicker, PickerPod

BASE = "http://198.18.1.2:9090"
WORKER_SA = "system:serviceaccount:llm-retire:retire-worker"
READER_SA = "system:serviceaccount:llm-retire:retire-llmd-metrics"


def jwt(sub: str, nonce: str = "a") -> str:
    """A token shaped as the API server issues them (never verified here)."""

    def part(obj: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part({'sub': sub, 'jti': nonce})}.c2lnbmF0dXJl"


OWN = jwt(WORKER_SA)
READER = jwt(READER_SA)


@pytest.fixture
def own_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The worker's own ServiceAccount token, where Kubernetes mounts it."""
    path = tmp_path / "serviceaccount" / "token"
    path.parent.mkdir()
    path.write_text(OWN)
    monkeypatch.setattr(llmd, "OWN_TOKEN_FILE", str(path), raising=False)
    monkeypatch.setattr(llmd, "DEFAULT_TOKEN_FILE", str(path), raising=False)
    monkeypatch.delenv(llmd.TOKEN_FILE_ENV, raising=False)
    return path


def picker() -> EndpointPicker:
    """A picker that authorises both tokens (as the API server would: each is a valid
    ServiceAccount token), so only the product's refusal keeps the worker's own home."""
    epp = EndpointPicker(tokens={OWN: True, READER: True})
    epp.pods["llm-0"] = PickerPod()
    return epp


def scrape(epp: EndpointPicker) -> str:
    with httpx.Client(transport=httpx.MockTransport(epp.handle), trust_env=False) as http:
        return LlmdPicker().view(http, BASE).error


def sent_tokens(epp: EndpointPicker) -> list[str]:
    return [r.headers["authorization"].removeprefix("Bearer ") for r in epp.scrapes]


def test_with_no_token_configured_the_workers_own_is_not_sent(own_token: Path) -> None:
    epp = picker()
    error = scrape(epp)
    assert sent_tokens(epp) == [], "the worker's own ServiceAccount token left the worker"
    assert llmd.TOKEN_FILE_ENV in error and "never sent" in error, error


def test_the_file_kubernetes_mounts_for_the_worker_is_refused(
    own_token: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(llmd.TOKEN_FILE_ENV, str(own_token))
    epp = picker()
    error = scrape(epp)
    assert sent_tokens(epp) == []
    assert "worker's own" in error and WORKER_SA in error, error


def test_a_copy_of_the_workers_own_token_is_refused(
    own_token: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    copy = tmp_path / "copied-token"
    copy.write_text(OWN + "\n")
    monkeypatch.setenv(llmd.TOKEN_FILE_ENV, str(copy))
    epp = picker()
    assert "worker's own" in scrape(epp)
    assert sent_tokens(epp) == []


def test_another_token_of_the_workers_own_account_is_refused(
    own_token: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A second token of the worker's ServiceAccount (another projection, a TokenRequest)
    carries the same powers: the same ``sub`` is refused."""
    other = tmp_path / "other-token"
    other.write_text(jwt(WORKER_SA, nonce="b"))
    monkeypatch.setenv(llmd.TOKEN_FILE_ENV, str(other))
    epp = picker()
    assert "worker's own" in scrape(epp)
    assert sent_tokens(epp) == []


def test_the_dedicated_token_is_sent_and_only_to_the_picker(
    own_token: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reader = tmp_path / "reader-token"
    reader.write_text(READER + "\n")
    monkeypatch.setenv(llmd.TOKEN_FILE_ENV, str(reader))
    epp = picker()
    assert scrape(epp) == ""
    assert sent_tokens(epp) == [READER]
    assert [r.url.host for r in epp.scrapes] == ["198.18.1.2"]


def test_outside_a_pod_a_dedicated_token_is_sent(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No token is mounted for the worker (it runs on a kubeconfig): nothing to compare
    with, the configured token is sent."""
    monkeypatch.setattr(llmd, "OWN_TOKEN_FILE", str(tmp_path / "absent"), raising=False)
    reader = tmp_path / "reader-token"
    reader.write_text("opaque-reader-token")
    monkeypatch.setenv(llmd.TOKEN_FILE_ENV, str(reader))
    epp = EndpointPicker(tokens={"opaque-reader-token": True})
    epp.pods["llm-0"] = PickerPod()
    assert scrape(epp) == ""
    assert sent_tokens(epp) == ["opaque-reader-token"]


@pytest.mark.parametrize(
    "token",
    ["", "a.b", "x.!!!.y", "a." + base64.urlsafe_b64encode(b"[1]").decode() + ".c", "a.e30.c"],
)
def test_the_subject_of_a_token_that_is_no_jwt_is_none(token: str) -> None:
    assert llmd.subject(token) is None
