"""Whether a member counts its requests exactly (``exact_load``): what the drain reads
from a vLLM member's ``GET /load``, decided from its wiring and its engine version."""

from __future__ import annotations

from retirement.shape.wiring import Wiring, _on, _vllm_env_dp
from retirement.versions import at_least

#: The first vLLM release with ``--enable-server-load-tracking`` and ``GET /load``
#: (PR #13950; absent from 0.7.3).
LOAD_TRACKING_SINCE = (0, 8, 0)


def vllm_api_servers(wiring: Wiring) -> int | None:
    """How many API server processes ``vllm serve`` runs for ``wiring`` (None: cannot be
    told): ``--api-server-count``, else as vllm/entrypoints/cli/serve.py defaults it (0.25.1
    and 0.29.0 alike): 0 headless, 1 with an external or multi-port load balancer, the
    local data-parallel size with a hybrid one, the data-parallel size otherwise."""
    if wiring.raw("--api-server-count") is not None:
        return wiring.number("--api-server-count")
    if wiring.raw("--headless") == "true":
        return 0
    external = _on(wiring, "--data-parallel-external-lb") or (
        wiring.raw("--data-parallel-rank") is not None
    )
    if external or _on(wiring, "--data-parallel-multi-port-external-lb"):
        return 1
    if _on(wiring, "--data-parallel-hybrid-lb") or (
        wiring.raw("--data-parallel-start-rank") is not None
    ):
        if wiring.raw("--data-parallel-size-local") is None:
            return 1
        local = wiring.number("--data-parallel-size-local")
        return None if local is None else local or 1
    if wiring.raw("--data-parallel-size") is None:
        return _vllm_env_dp(wiring)
    return wiring.number("--data-parallel-size")


def exact_load(*, engine: str, version: str, wiring: Wiring | None) -> bool:
    """Whether a member running ``wiring`` counts its requests exactly at ``GET /load``:
    vLLM 0.8.0+ with ``--enable-server-load-tracking``, its own command line read without
    a problem, and one API server process (the count is per process: behind a shared
    port, one GET reads only one of them), not the Rust front end (not verified)."""
    if engine != "vLLM" or wiring is None or wiring.problems or wiring.unmanaged:
        return False
    if not at_least(version, LOAD_TRACKING_SINCE):
        return False
    if not _on(wiring, "--enable-server-load-tracking"):
        return False
    if "VLLM_USE_RUST_FRONTEND" in wiring.env:
        rust = wiring.env["VLLM_USE_RUST_FRONTEND"]  # None: not a literal, so unknown
        if rust is None or rust.strip().lower() not in ("", "0", "false"):
            return False
    return vllm_api_servers(wiring) == 1
