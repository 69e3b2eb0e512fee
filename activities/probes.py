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
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from retirement.models import MemberTarget, Target

#: Engine versions known to echo the request id this way (from the reference behaviour).
#: A vLLM version added here must accept a completion without ``model`` (vLLM >= 0.8).
PROBE_VERSIONS = {"vLLM": {"0.25.1", "0.29.0"}, "SGLang": {"0.5.18", "0.5.21"}}
PROBE_TIMEOUT_S = 5.0
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
    rid = f"gpustack-qualify-{uuid.uuid4().hex[:16]}"
    base = f"http://{member.ip}:{member.serve_port}"
    extra: dict[str, Any] = {} if transport is None else {"transport": transport}
    try:
        probe = _vllm if target.engine == "vLLM" else _sglang
        with httpx.Client(trust_env=False, timeout=PROBE_TIMEOUT_S, **extra) as http:
            ok = probe(http, base, rid)
    except _Refused as e:
        return f"identity probe refused: {e}"
    except (httpx.HTTPError, ValueError, AttributeError, TypeError) as e:
        return f"identity probe failed: {type(e).__name__}"
    return "" if ok else "identity probe echo mismatch"


class _Refused(Exception):
    """The engine refused the probe request itself (a 4xx with its own reason)."""


def _vllm(http: httpx.Client, base: str, rid: str) -> bool:
    """POST a 1-token completion without ``model``; True when ``id`` echoes ``rid``."""
    r = http.post(
        f"{base}/v1/completions",
        headers={"X-Request-Id": rid},
        json={"prompt": PROBE_PROMPT, "max_tokens": 1, "request_id": rid},
    )
    if r.status_code in (400, 404, 422):
        raise _Refused(f"HTTP {r.status_code}: {_error_message(r)}")
    r.raise_for_status()
    body = r.json()
    return bool(body.get("id") == "cmpl-" + rid)


def _sglang(http: httpx.Client, base: str, rid: str) -> bool:
    """POST a 1-token ``/generate``; True when ``meta_info`` echoes ``rid`` and finished."""
    r = http.post(
        f"{base}/generate",
        json={"text": PROBE_PROMPT, "rid": rid, "sampling_params": {"max_new_tokens": 1}},
    )
    r.raise_for_status()
    meta = r.json().get("meta_info") or {}
    return bool(meta.get("id") == rid and meta.get("finish_reason") is not None)


def _error_message(r: httpx.Response) -> str:
    """The engine's error message, from either OpenAI error shape, bounded."""
    try:
        body = r.json()
    except ValueError:
        body = r.text[:120] or "no body"
    err = body.get("error") if isinstance(body, dict) else None
    message = err.get("message") if isinstance(err, dict) else None
    if message is None and isinstance(body, dict):
        message = body.get("message")
    text = str(message if message is not None else body)[:120]
    return "".join(c if c.isprintable() else "?" for c in text)
