"""Asking routers which workers they select (SPEC section 6): one observer per router kind.

Upstream routers may keep a worker whose label was removed until a periodic re-list, so
where a router exposes a removal call the observer asks for it, and the next observation
still has to verify that the worker is gone.  The restore undoes such a removal with the
router's add-worker call, verified the same way (a later ``view`` selects the worker).

The wire formats, as measured on the released binaries:

- SGLang model gateway (``sglang-router`` 0.3.2; smg 1.x the same): ``GET /workers`` →
  ``{"workers": [{"id": <uuid>, "url": ...}, ...]}``; ``DELETE /workers/{id}`` (the id,
  a URL there is 400) → 202, removal queued; ``POST /workers`` with ``{"url": ...}`` →
  202 ``{"status": "accepted", "worker_id", "url", "location"}``, the addition queued
  (a worker that cannot be reached is accepted and never appears; smg answers 409 for a
  URL it already has, 0.3.2 202 again).  Both calls are asynchronous: only a later
  ``GET /workers`` says what happened.
- vllm-router 0.1.17: ``GET /list_workers`` → ``{"urls": [...]}``;
  ``POST /remove_worker?url=`` → 200 (also for an absent URL);
  ``POST /add_worker?url=`` → 200 once the worker answers its health check, which the
  router waits for (``--worker-startup-timeout-secs``, 600 s by default), 400 for a URL it
  already has or a worker that stayed unhealthy.  The URL is kept verbatim (a trailing
  ``/`` is another worker), so the add uses the exact URL the router listed before.

A worker URL whose host is not an IP address cannot be matched to a member: the whole
answer then reads UNKNOWN (never "not selected").
"""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import httpx

FRESHNESS_S = 15.0
TIMEOUT_S = 3.0

#: What an observer's calls may raise that means "no usable answer" (never a crash).
_READ_ERRORS = (
    httpx.HTTPError,
    httpx.InvalidURL,
    ValueError,
    KeyError,
    TypeError,
    RecursionError,
)


def canonical_ip(text: str) -> str | None:
    """``text`` as a canonical IP address, or None when it is not one."""
    try:
        return str(ipaddress.ip_address(text.strip("[]")))
    except ValueError:
        return None


def worker_host(url: str) -> str | None:
    """The canonical IP address a worker URL names, or None (a hostname, no host at all,
    or a URL that does not parse)."""
    try:
        host = urlsplit(url).hostname
    except ValueError:
        return None
    return canonical_ip(host) if host else None


def worker_url(ip: str, port: int, scheme: str = "http") -> str:
    """The URL of a worker at ``ip``:``port`` (an IPv6 address in brackets)."""
    canonical = canonical_ip(ip) or ip
    host = f"[{canonical}]" if ":" in canonical else canonical
    return f"{scheme}://{host}:{port}"


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
        wanted = {canonical_ip(a) or a for a in addresses}
        return sorted(u for u in self.workers if worker_host(u) in wanted)


class RouterObserver(Protocol):
    """What withdrawal and the restore need of a router."""

    kind: str

    def view(self, http: httpx.Client, base: str) -> RouterView:
        """Ask the router at ``base`` which workers it selects now."""

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        """Ask the router to drop a worker (verified by a later ``view``); never raises."""

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        """Ask the router to select a worker again (verified by a later ``view``); never
        raises.  Returns what the router answered, for the reason a person reads."""


def _error(e: Exception) -> RouterView:
    return RouterView(workers={}, fetched_at=time.time(), error=f"{type(e).__name__}: {e}"[:200])


def _checked(workers: dict[str, str]) -> RouterView:
    """The view of a well-formed answer: every worker URL must name an IP address."""
    opaque = sorted(u for u in workers if worker_host(u) is None)
    if opaque:
        return RouterView(
            workers={},
            fetched_at=time.time(),
            error=f"worker URL host is not an IP address: {opaque[0]!r}"[:200],
        )
    return RouterView(workers=workers, fetched_at=time.time())


def _string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not a string")
    return value


def _answered(r: httpx.Response) -> str:
    return f"HTTP {r.status_code} {r.text[:120]}".strip()


def _sent(call: Any) -> str:
    """Make one mutating call; what it answered, or how it failed (never raises)."""
    try:
        r: httpx.Response = call()
    except _READ_ERRORS as e:
        return f"{type(e).__name__}: {e}"[:200]
    return _answered(r)


class SGLangGateway:
    """The SGLang model gateway: ``GET /workers``, ``DELETE /workers/{id}``,
    ``POST /workers``."""

    kind = "sglang-gateway"

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            r = http.get(f"{base}/workers")
            r.raise_for_status()
            body = r.json()
            entries = body["workers"]
            if not isinstance(entries, list):
                raise TypeError(f"workers is {type(entries).__name__}, not a list")
            workers: dict[str, str] = {}
            for w in entries:
                if not isinstance(w, dict):
                    raise TypeError(f"a worker is {type(w).__name__}, not an object")
                url = _string(w["url"], "a worker url")
                wid = w.get("id", "")
                workers[url] = "" if wid is None else str(wid)
        except _READ_ERRORS as e:
            return _error(e)
        return _checked(workers)

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        _sent(lambda: http.delete(f"{base}/workers/{quote(worker_id or url, safe='')}"))

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        return _sent(lambda: http.post(f"{base}/workers", json={"url": url}))


class VllmRouter:
    """vllm-router: ``GET /list_workers`` → ``{"urls": [...]}``, ``POST /remove_worker?url=``,
    ``POST /add_worker?url=``."""

    kind = "vllm-router"

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            r = http.get(f"{base}/list_workers")
            r.raise_for_status()
            urls = r.json()["urls"]
            if not isinstance(urls, list):
                raise TypeError(f"urls is {type(urls).__name__}, not a list")
            workers = {_string(u, "a worker url"): "" for u in urls}
        except _READ_ERRORS as e:
            return _error(e)
        return _checked(workers)

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        _sent(lambda: http.post(f"{base}/remove_worker", params={"url": url}))

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        # The router answers only once the worker is healthy (or its startup timeout
        # passed): a timeout here is normal, and the router keeps trying.
        return _sent(lambda: http.post(f"{base}/add_worker", params={"url": url}))


OBSERVERS: dict[str, RouterObserver] = {o.kind: o for o in (SGLangGateway(), VllmRouter())}


def observer_for(kind: str) -> RouterObserver | None:
    """The observer of a router kind, or None where none is implemented (llm-d)."""
    return OBSERVERS.get(kind)
