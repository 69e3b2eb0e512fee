"""The patched routers' read-only observer (the seed's builds of vllm-router and the SGLang
gateway, gpustack/gpustack-operator ``pack/llm-router/patches``): ``GET
/observer/endpoints``.

Wire format::

    {"router": {"boot_generation": <ms, u64>, "now_ms": <ms, u64>},
     "registry_revision": <u64>,
     "workers": [{"url", "port": "<digits>" | null, "role", "pod_hint", "worker_id",
                  "selection": {"registered", "healthy", "circuit_open", "in_selection"}}]}

``in_selection`` is the predicate the router's request path evaluates (healthy and the
circuit breaker lets a request through).  A registered worker out of selection still
counts as held (it comes back on its next good health check); only absence from the
registry is withdrawn.  ``boot_generation`` is the process start time (another value after
every restart), ``now_ms`` the time of the answer on the router's clock (freshness is
bounded on it), ``registry_revision`` grows whenever the worker array changes.

Every field is checked strictly (types, a port that is the URL's own, ``in_selection``
only for a registered healthy worker, no URL twice): a wrong shape reads UNKNOWN.  The
patches only add this view, so removal and re-adding use the router's own admin API,
through the observer of the unpatched kind (``upstream``).

Which deployments run patched builds is a worker setting (``activities.routers``), never
guessed by probing: vllm-router forwards a GET of a path it does not know to a worker.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import httpx

from activities.routers.common import (
    READ_ERRORS,
    RouterObserver,
    array,
    failed,
    get_json,
    obj,
    opaque_worker,
    string,
)
from activities.routers.view import RouterView

PATH = "/observer/endpoints"
_FLAGS = ("registered", "healthy", "circuit_open", "in_selection")


def _count(value: Any, what: str) -> int:
    """A non-negative integer (a JSON ``true`` is not one)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"{what} is {value!r:.40}, not a non-negative integer")
    return value


def _flags(value: Any, url: str) -> dict[str, bool]:
    selection = obj(value, f"selection of {url}")
    flags = {}
    for name in _FLAGS:
        flag = selection[name]
        if not isinstance(flag, bool):
            raise TypeError(f"selection.{name} of {url} is {type(flag).__name__}, not a bool")
        flags[name] = flag
    if flags["in_selection"] and not (flags["registered"] and flags["healthy"]):
        raise ValueError(f"{url} is in selection but not registered and healthy")
    return flags


def _port(value: Any, url: str) -> None:
    """The reported port must be the URL's own (or null when the URL has none)."""
    try:
        own = urlsplit(url).port
    except ValueError as e:
        raise ValueError(f"worker URL {url[:80]!r} does not parse") from e
    reported = None if value is None else string(value, f"port of {url}")
    if reported is not None and not (reported.isascii() and reported.isdigit()):
        raise ValueError(f"port of {url} is {reported[:20]!r}")
    if (None if reported is None else int(reported)) != own:
        raise ValueError(f"port of {url} is {reported!r}, its URL says {own}")


def parse(body: Any, at: float) -> RouterView:
    """The view of one ``/observer/endpoints`` document (raises on a wrong shape)."""
    doc = obj(body, "the answer")
    router = obj(doc["router"], "router")
    generation = _count(router["boot_generation"], "router.boot_generation")
    now_ms = _count(router["now_ms"], "router.now_ms")
    revision = _count(doc["registry_revision"], "registry_revision")
    workers: dict[str, str] = {}
    idle: set[str] = set()
    for w in array(doc["workers"], "workers"):
        w = obj(w, "a worker")
        url = string(w["url"], "a worker url")
        if url in workers:
            raise ValueError(f"worker {url[:80]!r} listed twice")
        _port(w["port"], url)
        string(w["role"], f"role of {url}")
        string(w["pod_hint"], f"pod_hint of {url}")
        workers[url] = string(w["worker_id"], f"worker_id of {url}")
        if not _flags(w["selection"], url)["in_selection"]:
            idle.add(url)
    if why := opaque_worker(workers):
        return failed(why)
    return RouterView(
        workers=workers,
        fetched_at=at,
        idle=frozenset(idle),
        router_ms=now_ms,
        generation=str(generation),
        revision=revision,
    )


class ObserverEndpoints:
    """A patched build of ``upstream``'s router: its view from ``/observer/endpoints``, its
    removal and re-adding through ``upstream``'s admin API."""

    port_names: tuple[str, ...] = ("http",)

    def __init__(self, upstream: RouterObserver) -> None:
        self.upstream = upstream
        self.kind = upstream.kind
        self.active = upstream.active

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            body, at = get_json(http, f"{base}{PATH}")
            return parse(body, at)
        except READ_ERRORS as e:
            return failed(e)

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        self.upstream.remove(http, base, url, worker_id)

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        return self.upstream.add(http, base, url)
