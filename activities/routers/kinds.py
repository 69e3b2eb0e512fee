"""Which observer reads which router kind.

The kind is ``spec.router`` of the ModelDeployment (its ``name``, gpustack's spelling, or
``kind``), matched exactly:

| kind | observer |
|---|---|
| ``vllm-router`` | ``GET /list_workers`` (``vllm.py``) |
| ``sglang-gateway`` | ``GET /workers`` (``sglang.py``; 0.3.x, and smg's ``status`` if present) |
| ``smg`` | the same, named so |
| ``llm-d``, ``llm-d-router`` | the endpoint picker's ``/metrics`` (``llmd.py``, passive) |

A kind listed in ``RETIRE_ROUTERS_WITH_OBSERVER`` (comma-separated, e.g.
``vllm-router,sglang-gateway`` on a cluster whose routers are the gpustack operator's
patched builds) is read through ``GET /observer/endpoints`` instead (``patched.py``), which
adds the router's clock and boot generation; removal and re-adding stay the kind's own.
It is a worker setting, not a guess from the router's answers: vllm-router answers a path
it does not know with one of its workers' answers.  Any other kind has no observer: its
router Pods read UNKNOWN, with the reason.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from activities.routers.common import RouterObserver
from activities.routers.llmd import LlmdPicker
from activities.routers.patched import ObserverEndpoints
from activities.routers.sglang import SGLangGateway
from activities.routers.vllm import VllmRouter

PATCHED_ENV = "RETIRE_ROUTERS_WITH_OBSERVER"

#: The observer of each kind, as it ships (unpatched routers).
OBSERVERS: dict[str, RouterObserver] = {
    o.kind: o
    for o in (
        VllmRouter(),
        SGLangGateway("sglang-gateway"),
        SGLangGateway("smg"),
        LlmdPicker("llm-d"),
        LlmdPicker("llm-d-router"),
    )
}


def patched_kinds(environ: Mapping[str, str] | None = None) -> frozenset[str]:
    """The router kinds whose Pods serve ``/observer/endpoints`` (``PATCHED_ENV``)."""
    env = os.environ if environ is None else environ
    return frozenset(k.strip() for k in env.get(PATCHED_ENV, "").split(",") if k.strip())


def observer_for(kind: str, environ: Mapping[str, str] | None = None) -> RouterObserver | None:
    """The observer of a router kind, or None where there is none."""
    obs = OBSERVERS.get(kind)
    if obs is not None and obs.active and kind in patched_kinds(environ):
        return ObserverEndpoints(obs)
    return obs


def unknown_kind(kind: str | None) -> str:
    """Why a router of ``kind`` cannot be observed."""
    if not kind:
        return "the deployment declares no router kind, yet a router Pod is labelled"
    known = ", ".join(sorted(OBSERVERS))
    return f"unknown router kind {kind[:60]!r} (observed: {known})"
