"""Identity-bound qualification probes (SPEC section 6): a 1-token completion whose echo
proves the answer came from this member's engine."""

from __future__ import annotations

import uuid

import httpx

from retirement.models import MemberTarget, Target

#: Engine versions known to echo the request id this way (from the reference behaviour).
PROBE_VERSIONS = {"vLLM": {"0.25.1", "0.29.0"}, "SGLang": {"0.5.18", "0.5.21"}}
PROBE_TIMEOUT_S = 5.0


def probes_supported(target: Target) -> bool:
    """Whether the target's engine version answers identity probes as expected."""
    return target.engine_version in PROBE_VERSIONS.get(target.engine, set())


def identity_probe(target: Target, member: MemberTarget) -> str:
    """Probe one member; '' when VERIFIED, else the reason it reads UNKNOWN."""
    if member.serve_port is None:
        return "no serving port"
    rid = f"gpustack-qualify-{uuid.uuid4().hex[:16]}"
    base = f"http://{member.ip}:{member.serve_port}"
    try:
        with httpx.Client(trust_env=False, timeout=PROBE_TIMEOUT_S) as http:
            if target.engine == "vLLM":
                r = http.post(f"{base}/v1/completions", headers={"X-Request-Id": rid},
                              json={"model": "probe", "prompt": "ping", "max_tokens": 1,
                                    "request_id": rid})
                r.raise_for_status()
                ok = r.json().get("id") == "cmpl-" + rid
            else:
                r = http.post(f"{base}/generate", json={
                    "text": "ping", "rid": rid, "sampling_params": {"max_new_tokens": 1}})
                r.raise_for_status()
                meta = r.json().get("meta_info") or {}
                ok = meta.get("id") == rid and meta.get("finish_reason") is not None
    except (httpx.HTTPError, ValueError, AttributeError) as e:
        return f"identity probe failed: {type(e).__name__}"
    return "" if ok else "identity probe echo mismatch"
