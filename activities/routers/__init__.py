"""Asking routers which workers they select (SPEC section 6): one observer per router kind.

Upstream routers may keep a worker whose label was removed until a periodic re-list, so
where a router exposes a removal call the observer asks for it, and the next observation
still has to verify that the worker is gone.  The restore undoes such a removal with the
router's add-worker call, verified the same way (a later ``view`` selects the worker).  A
router without such calls (llm-d's picker) is passive: it is only watched.

Modules: ``view`` (the answer, its freshness bound and the boot-generation rule),
``common`` (the observer protocol, bounded reads), one module per router kind (``vllm``,
``sglang``, ``patched``, ``llmd``), ``kinds`` (which observer reads which kind) and
``pods`` (the address of a router Pod).  Every doubt (no answer, a wrong shape, a worker
named by hostname, a stale or restarted router, an unknown kind) reads UNKNOWN: never
"withdrawn".
"""

from activities.routers.common import TIMEOUT_S, RouterObserver
from activities.routers.kinds import OBSERVERS, PATCHED_ENV, observer_for, unknown_kind
from activities.routers.llmd import TOKEN_FILE_ENV, LlmdPicker
from activities.routers.patched import ObserverEndpoints
from activities.routers.pods import resolve, router_base, router_port
from activities.routers.sglang import SGLangGateway
from activities.routers.view import (
    FRESHNESS_S,
    Generations,
    RouterView,
    canonical_ip,
    worker_host,
    worker_url,
)
from activities.routers.vllm import VllmRouter

__all__ = [
    "FRESHNESS_S",
    "OBSERVERS",
    "PATCHED_ENV",
    "TIMEOUT_S",
    "TOKEN_FILE_ENV",
    "Generations",
    "LlmdPicker",
    "ObserverEndpoints",
    "RouterObserver",
    "RouterView",
    "SGLangGateway",
    "VllmRouter",
    "canonical_ip",
    "observer_for",
    "resolve",
    "router_base",
    "router_port",
    "unknown_kind",
    "worker_host",
    "worker_url",
]
