"""One router's answer (``RouterView``) and the rules that decide whether it may count:
the freshness bound, and the boot generation of the router that gave it.

Freshness bounds the age of the router's *own* view where the router reports one (the
patched routers' ``router.now_ms``), and otherwise the time of the response: a view older
than ``FRESHNESS_S`` never counts, nor one stamped more than ``FRESHNESS_S`` ahead of this
process's clock (the two clocks disagree by more than the bound, so the age cannot be told).

A router that restarted forgets what it was told: a removal asked of it, a registry it had
converged to.  ``Generations`` remembers, per router Pod, the ``boot_generation`` (and the
``registry_revision``) its answers were given under in one phase; an answer under another
generation reads UNKNOWN once, with the reason, and the next answers count again under the
new one.  Routers that report no generation are tracked as "none", so an answer switching
between reporting one and not is a change too.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

FRESHNESS_S = 15.0


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


def endpoint_of_pod(endpoint: str, pods: Iterable[str]) -> bool:
    """Whether an endpoint picker's endpoint name belongs to one of ``pods``: the Pod name
    itself, or ``<pod>-rank-<n>`` (one endpoint per target port).  An endpoint that could be
    either of two Pods' (``a-rank-0`` for Pod ``a``, or a Pod named so) belongs to both:
    a doubt never reads as "not selected"."""
    for pod in pods:
        if endpoint == pod:
            return True
        if endpoint.startswith(f"{pod}-rank-") and _RANK.fullmatch(endpoint[len(pod) + 6 :]):
            return True
    return False


_RANK = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class RouterView:
    """One router's answer: the workers it has and how, when it said so, or why unknown.

    A worker is *in selection* (a new request may go to it now), *idle* (registered but
    out of selection now, e.g. unhealthy or its circuit open: it may come back without
    anyone asking), or *leaving* (smg's ``draining``: never selected again, removed soon).
    Withdrawal needs every target worker gone or leaving (``holding`` is empty); the
    restore needs it in selection again (``selecting``)."""

    workers: dict[str, str]  # url -> worker id ('' where the router has no ids)
    fetched_at: float  # when the answer arrived, on this process's clock (epoch seconds)
    error: str = ""
    #: Endpoints named by Pod (llm-d's picker), not by URL.
    endpoints: frozenset[str] = frozenset()
    idle: frozenset[str] = frozenset()  # worker URLs registered but out of selection now
    leaving: frozenset[str] = frozenset()  # worker URLs being drained out: never selected
    #: The router's own clock at its answer (``now_ms``), its boot generation and registry
    #: revision, where it reports them.
    router_ms: int | None = None
    generation: str | None = None
    revision: int | None = None
    #: How long the restore must see this router select a worker again before it counts:
    #: 0 for a router that removes a worker only when asked or at once; smg removes a
    #: de-labelled worker by a job (draining, then removal ``drain_settle_secs`` later) that
    #: still fires when the worker was re-added meanwhile (seen on the bed).
    confirm_s: float = 0.0

    def stale(self, now: float) -> str:
        """Why the answer may not count at ``now`` ("" when it may): an error, an answer
        older than the freshness bound, or a router view older (or further ahead) than it."""
        if self.error:
            return self.error
        age, bound = now - self.fetched_at, f"bound {FRESHNESS_S:g} s"
        if age > FRESHNESS_S:
            return f"answer is {age:.1f} s old ({bound})"
        if self.router_ms is not None:
            own = now - self.router_ms / 1000
            if own > FRESHNESS_S:
                return f"the router's view is {own:.1f} s old by its now_ms ({bound})"
            if own < -FRESHNESS_S:
                return f"the router's now_ms is {-own:.1f} s ahead of this clock: age unknown"
        return ""

    def fresh(self, now: float) -> bool:
        """Whether the answer is recent enough to count (the 15 s freshness bound)."""
        return not self.stale(now)

    def _matching(self, addresses: set[str], pods: Iterable[str]) -> list[str]:
        wanted = {canonical_ip(a) or a for a in addresses}
        urls = [u for u in self.workers if worker_host(u) in wanted]
        names = list(pods)
        return sorted(urls) + sorted(e for e in self.endpoints if endpoint_of_pod(e, names))

    def holding(self, addresses: set[str], pods: Iterable[str] = ()) -> list[str]:
        """The workers (URL, or endpoint name) of the targets that the router still selects
        or may select again without being asked: all but those leaving."""
        return [w for w in self._matching(addresses, pods) if w not in self.leaving]

    def selecting(self, addresses: set[str], pods: Iterable[str] = ()) -> list[str]:
        """The workers (URL, or endpoint name) of the targets in selection now: a worker
        whose host is one of ``addresses``, or an endpoint of one of ``pods``."""
        return [
            w
            for w in self._matching(addresses, pods)
            if w not in self.leaving and w not in self.idle
        ]

    def describe(self, workers: list[str]) -> str:
        """How the router holds ``workers``, for the reading a person reads."""
        selected = [w for w in workers if w not in self.idle]
        idle = [w for w in workers if w in self.idle]
        parts = [f"still selects {', '.join(selected)}"] if selected else []
        if idle:
            parts.append(f"still registers {', '.join(idle)} (out of selection now, may return)")
        return "; ".join(parts)


class Generations:
    """The boot generation and registry revision each router Pod answered under, within one
    phase (one activity attempt): see the module's docstring."""

    def __init__(self, seen: Mapping[str, tuple[str | None, int | None]] | None = None) -> None:
        self._seen: dict[str, tuple[str | None, int | None]] = dict(seen or {})

    def admit(self, router: str, view: RouterView) -> str:
        """Record a fresh answer of router Pod ``router`` (its UID); "" when it may count,
        else why not (a restart, or a registry revision that went back)."""
        before = self._seen.get(router)
        revision = view.revision
        if before is not None and before[0] == view.generation and before[1] is not None:
            revision = before[1] if revision is None else max(revision, before[1])
        self._seen[router] = (view.generation, revision)
        if before is None:
            return ""
        generation, last = before
        if generation != view.generation:
            return (
                f"router restarted (boot_generation {generation or 'none'} -> "
                f"{view.generation or 'none'}): its earlier answers do not count"
            )
        if last is not None and view.revision is not None and view.revision < last:
            return f"registry_revision went back from {last} to {view.revision}"
        return ""

    def snapshot(self) -> dict[str, tuple[str | None, int | None]]:
        """What was seen, per router Pod UID (a caller may keep it across attempts)."""
        return dict(self._seen)
