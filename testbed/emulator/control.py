"""Validation of the hub's control API bodies: a new Pod's engine, a traps change, and a
container termination (preStop, grace period).

Every field is checked before anything is applied, so a bad request is a 400 that
changes nothing (the hub runs inside the bed's namespace and is driven from tests).
"""

from __future__ import annotations

import ipaddress
from typing import Any

from testbed.emulator.engine import EngineEmulator
from testbed.emulator.fields import int_field, seconds_field
from testbed.emulator.spec import MODEL_NAME, EngineKind, PodEngineSpec
from testbed.emulator.traps import is_metrics_mode
from testbed.emulator.wire import BadRequest

__all__ = ["apply_traps", "spec_from_json", "termination_from_json"]

_TRAP_FIELDS = frozenset(
    {
        "stale_gauges",
        "frontend_hidden",
        "metrics_mode",
        "clear",
        "request_seconds",
        "healthy",
        "silent",
    }
)


_MAX_SERVED_NAMES = 16
_MAX_NAME_LEN = 1024
_MAX_ARGS = 512
_MAX_ARG_LEN = 4096


def _model_name(value: Any, key: str) -> str:
    """A model name or path: a non-empty string of bounded length."""
    if not isinstance(value, str) or not value or len(value) > _MAX_NAME_LEN:
        raise BadRequest(f"{key} must be a non-empty string of at most {_MAX_NAME_LEN} chars")
    return value


def _served_names(body: dict[str, Any], kind: EngineKind) -> tuple[str, ...]:
    """``served_model_name``: a name or a list of names (vLLM's ``--served-model-name``
    takes several, SGLang's one); the default is :data:`MODEL_NAME`."""
    value = body.get("served_model_name")
    if value is None:
        return (MODEL_NAME,)
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not 1 <= len(names) <= _MAX_SERVED_NAMES:
        raise BadRequest(
            f"served_model_name must be a string or a list of 1..{_MAX_SERVED_NAMES} strings"
        )
    out = tuple(_model_name(n, "served_model_name") for n in names)
    if kind is EngineKind.SGLANG and len(out) != 1:
        raise BadRequest("SGLang serves exactly one model name")
    return out


def spec_from_json(body: dict[str, Any]) -> PodEngineSpec:
    """Validate a POST /pods body. ``args`` is the engine container's rendered command line
    (see :class:`PodEngineSpec`); a line the engine would refuse to start with is refused
    when the emulator is made (the hub answers 500 ``cannot start``)."""
    name = body.get("name")
    if not isinstance(name, str) or not name or "/" in name or len(name) > 253:
        raise BadRequest("name must be a non-empty string without '/'")
    engine_text = body.get("engine")
    kinds = {k.value.lower(): k for k in EngineKind}
    if not isinstance(engine_text, str) or engine_text.lower() not in kinds:
        raise BadRequest("engine must be 'vLLM' or 'SGLang'")
    host = body.get("serve_host")
    if not isinstance(host, str):
        raise BadRequest("serve_host must be an IP address")
    try:
        ipaddress.ip_address(host)
    except ValueError as exc:
        raise BadRequest("serve_host must be an IP address") from exc
    ports: list[int] = []
    for key in ("serve_port", "metrics_port"):
        value = body.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
            raise BadRequest(f"{key} must be an integer port")
        ports.append(value)
    dp = int_field(body, "dp_ranks", 1, minimum=1)
    if dp > 64:
        raise BadRequest("dp_ranks must be <= 64")
    seconds = seconds_field(body, "request_seconds")
    kind = kinds[engine_text.lower()]
    served = _served_names(body, kind)
    path = body.get("model_path")
    shutdown_timeout = seconds_field(body, "shutdown_timeout")
    force = body.get("force_shutdown", False)
    if not isinstance(force, bool):
        raise BadRequest("force_shutdown must be a boolean")
    args = body.get("args", [])
    if (
        not isinstance(args, list)
        or len(args) > _MAX_ARGS
        or not all(isinstance(a, str) and len(a) <= _MAX_ARG_LEN for a in args)
    ):
        raise BadRequest(f"args must be a list of at most {_MAX_ARGS} strings")
    step = seconds_field(body, "step_seconds")
    if step is not None and step <= 0:
        raise BadRequest("step_seconds must be > 0")
    return PodEngineSpec(
        name=name,
        engine=kind,
        serve_host=host,
        serve_port=ports[0],
        metrics_port=ports[1],
        dp_ranks=dp,
        request_seconds=1.0 if seconds is None else seconds,
        served_model_names=served,
        model_path=MODEL_NAME if path is None else _model_name(path, "model_path"),
        shutdown_timeout=0.0 if shutdown_timeout is None else shutdown_timeout,
        force_shutdown=force,
        args=tuple(args),
        **({} if step is None else {"step_seconds": step}),
    )


def termination_from_json(body: dict[str, Any]) -> tuple[float, float]:
    """Validate a POST /pods/{name}/terminate body: ``(prestop_seconds, grace_seconds)``.

    ``grace_seconds`` (the Pod's ``deletionGracePeriodSeconds``) is required;
    ``prestop_seconds`` (its preStop sleep) defaults to 0."""
    unknown = sorted(set(body) - {"prestop_seconds", "grace_seconds"})
    if unknown:
        raise BadRequest(f"unknown termination fields: {unknown}")
    grace = seconds_field(body, "grace_seconds")
    if grace is None:
        raise BadRequest("grace_seconds is required")
    prestop = seconds_field(body, "prestop_seconds")
    return (0.0 if prestop is None else prestop), grace


def apply_traps(emu: EngineEmulator, body: dict[str, Any]) -> None:
    """Validate and apply a POST /pods/{name}/traps body (``clear`` first)."""
    unknown = sorted(set(body) - _TRAP_FIELDS)
    if unknown:
        raise BadRequest(f"unknown trap fields: {unknown}")
    stale = body.get("stale_gauges")
    if stale is not None and (
        not isinstance(stale, list)
        or not 1 <= len(stale) <= 2
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in stale)
    ):
        raise BadRequest("stale_gauges must be [running, waiting] of integers >= 0")
    hidden = seconds_field(body, "frontend_hidden")
    seconds = seconds_field(body, "request_seconds")
    mode = body.get("metrics_mode")
    if mode is not None and not isinstance(mode, str):
        raise BadRequest("metrics_mode must be a string")
    healthy = body.get("healthy")
    if healthy is not None and not isinstance(healthy, bool):
        raise BadRequest("healthy must be a boolean")
    silent = body.get("silent")
    if silent is not None and not isinstance(silent, bool):
        raise BadRequest("silent must be a boolean")
    if mode is not None and not is_metrics_mode(mode):
        raise BadRequest(f"unknown metrics_mode {mode!r}")
    if body.get("clear"):
        emu.clear_traps()
    if stale is not None:
        emu.set_stale_gauges(stale[0], stale[1] if len(stale) > 1 else 0)
    if hidden is not None:
        emu.set_frontend_hidden(hidden)
    if mode is not None:
        emu.set_metrics_mode(mode)
    if healthy is not None:
        emu.set_healthy(healthy)
    if silent is not None:
        emu.set_silent(silent)
    if seconds is not None:
        emu.set_request_seconds(seconds)
