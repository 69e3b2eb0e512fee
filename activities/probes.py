"""Identity-bound qualification probes (SPEC section 6): a 1-token completion whose echo
proves the answer came from this member's engine.

What the engines accept, read from their sources:

- vLLM (0.2x, ``OpenAIServing._check_model``): a request whose ``model`` names anything but a
  served model name (``--served-model-name``, default the model path) is refused with 404
  ``The model `x` does not exist.``; a request with no ``model`` is served by the first
  served model (``CompletionRequest.model`` is optional since vLLM PR #13568, early 2025).
  So the probe sends no ``model``, and cannot pick a wrong one. The response's ``id`` is
  ``cmpl-`` + the ``X-Request-Id`` header (else the body's ``request_id``).
- SGLang: the native ``/generate`` has no model; ``meta_info.id`` echoes ``rid``.

The answer is read bounded (``activities.routers.bounded``): at most ``PROBE_BODY_CAP``
bytes (a 1-token completion is a few hundred), within ``PROBE_TIMEOUT_S`` in all; past
either it reads UNKNOWN, saying so.  The member's address may be IPv4 or IPv6 (in brackets
in the URL); one that is not an IP address reads UNKNOWN.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx

from activities.http_client import http_client
from activities.routers.bounded import Answer, Overrun, call
from activities.routers.view import canonical_ip, worker_url
from retirement.models import MemberTarget, Target

#: Engine versions known to echo the request id this way (from the reference behaviour).
#: A vLLM version added here must accept a completion without ``model`` (vLLM >= 0.8).
PROBE_VERSIONS = {"vLLM": {"0.25.1", "0.29.0"}, "SGLang": {"0.5.18", "0.5.21"}}
PROBE_TIMEOUT_S = 5.0
#: The most of a probe's answer read.
PROBE_BODY_CAP = 64 << 10
PROBE_PROMPT = "ping"


def probes_supported(target: Target) -> bool:
    """Whether the target's engine version answers identity probes as expected."""
    return target.engine_version in PROBE_VERSIONS.get(target.engine, set())


def identity_probe(
    target: Target, member: MemberTarget, *, transport: httpx.BaseTransport | None = None
) -> str:
    """Probe one member; '' when VERIFIED, else the reason it reads UNKNOWN.

    ``transport`` replaces the network (tests pass an ``httpx.MockTransport``).
    """
    if member.serve_port is None:
        return "no serving port"
    if canonical_ip(member.ip or "") is None:
        return f"identity probe not sent: the member's address {member.ip[:60]!r} is not an IP"
    rid = f"gpustack-qualify-{uuid.uuid4().hex[:16]}"
    base = worker_url(member.ip, member.serve_port)
    try:
        probe = _vllm if target.engine == "vLLM" else _sglang
        with http_client(timeout=PROBE_TIMEOUT_S, transport=transport) as http:
            ok = probe(http, base, rid)
    except _Refused as e:
        return f"identity probe refused: {e}"
    except Overrun as e:
        return f"identity probe failed: {e}"
    except (httpx.HTTPError, httpx.InvalidURL, ValueError, AttributeError, TypeError) as e:
        return f"identity probe failed: {type(e).__name__}"
    return "" if ok else "identity probe echo mismatch"


def _post(http: httpx.Client, url: str, **kwargs: Any) -> Answer:
    """One bounded POST (``PROBE_BODY_CAP`` bytes, ``PROBE_TIMEOUT_S`` in all)."""
    return call(http, "POST", url, cap=PROBE_BODY_CAP, deadline_s=PROBE_TIMEOUT_S, **kwargs)


class _Refused(Exception):
    """The engine refused the probe request itself (a 4xx with its own reason)."""


def _vllm(http: httpx.Client, base: str, rid: str) -> bool:
    """POST a 1-token completion without ``model``; True when ``id`` echoes ``rid``."""
    r = _post(
        http,
        f"{base}/v1/completions",
        headers={"X-Request-Id": rid},
        json={"prompt": PROBE_PROMPT, "max_tokens": 1, "request_id": rid},
    )
    if r.status in (400, 404, 422):
        raise _Refused(f"HTTP {r.status}: {_error_message(r)}")
    r.raise_for_status()
    body = json.loads(r.body)
    return bool(body.get("id") == "cmpl-" + rid)


def _sglang(http: httpx.Client, base: str, rid: str) -> bool:
    """POST a 1-token ``/generate``; True when ``meta_info`` echoes ``rid`` and finished."""
    r = _post(
        http,
        f"{base}/generate",
        json={"text": PROBE_PROMPT, "rid": rid, "sampling_params": {"max_new_tokens": 1}},
    )
    r.raise_for_status()
    meta = json.loads(r.body).get("meta_info") or {}
    return bool(meta.get("id") == rid and meta.get("finish_reason") is not None)


def _error_message(r: Answer) -> str:
    """The engine's error message, from either OpenAI error shape, bounded."""
    try:
        body = json.loads(r.body)
    except ValueError:
        body = r.text() or "no body"
    err = body.get("error") if isinstance(body, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    if message is None and isinstance(body, dict):
        message = body.get("message")
    text = str(message if message is not None else body)[:120]
    return "".join(c if c.isprintable() else "?" for c in text)
