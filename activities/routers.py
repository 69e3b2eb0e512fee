"""Asking routers which workers they select (SPEC section 6): one observer per router kind.

Upstream routers may keep a worker whose label was removed until a periodic re-list, so
where a router exposes a removal call the observer asks for it, and the next observation
still has to verify that the worker is gone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlsplit

import httpx

FRESHNESS_S = 15.0
TIMEOUT_S = 3.0


@dataclass(frozen=True)
class RouterView:
    """One router's answer: the worker URLs it selects, when it said so, or why unknown."""

    workers: dict[str, str]  # url -> worker id ('' where the router has no ids)
    fetched_at: float
    error: str = ""

    def fresh(self, now: float) -> bool:
        """Whether the answer is recent enough to count (the 15 s freshness bound)."""
        return not self.error and now - self.fetched_at <= FRESHNESS_S

    def selecting(self, addresses: set[str]) -> list[str]:
        """The selected worker URLs whose host is one of ``addresses``."""
        return sorted(u for u in self.workers if (urlsplit(u).hostname or "") in addresses)


class RouterObserver(Protocol):
    """What withdrawal needs of a router."""

    kind: str

    def view(self, http: httpx.Client, base: str) -> RouterView:
        """Ask the router at ``base`` which workers it selects now."""

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        """Ask the router to drop a worker (verified by a later ``view``)."""


def _error(e: Exception) -> RouterView:
    return RouterView(workers={}, fetched_at=time.time(), error=f"{type(e).__name__}: {e}"[:200])


class SGLangGateway:
    """The SGLang model gateway: ``GET /workers``, ``DELETE /workers/{id}``."""

    kind = "sglang-gateway"

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            r = http.get(f"{base}/workers")
            r.raise_for_status()
            body = r.json()
            workers = {str(w["url"]): str(w.get("id", "")) for w in body["workers"]}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            return _error(e)
        return RouterView(workers=workers, fetched_at=time.time())

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        http.delete(f"{base}/workers/{quote(worker_id or url, safe='')}")


class VllmRouter:
    """vllm-router: ``GET /list_workers`` → ``{"urls": [...]}``, ``POST /remove_worker?url=``."""

    kind = "vllm-router"

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            r = http.get(f"{base}/list_workers")
            r.raise_for_status()
            urls = r.json()["urls"]
            workers = {str(u): "" for u in urls}
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            return _error(e)
        return RouterView(workers=workers, fetched_at=time.time())

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        http.post(f"{base}/remove_worker", params={"url": url})


OBSERVERS: dict[str, RouterObserver] = {o.kind: o for o in (SGLangGateway(), VllmRouter())}


def observer_for(kind: str) -> RouterObserver | None:
    """The observer of a router kind, or None where none is implemented (llm-d)."""
    return OBSERVERS.get(kind)
