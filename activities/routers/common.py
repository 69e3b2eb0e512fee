"""What every observer shares: the protocol withdrawal and the restore call, bounded reads
that turn every failure into a reason (never an exception), and the check that every
worker URL names an IP address (a hostname cannot be matched to a member, so it would
read "not selected" where nothing is known)."""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

import httpx

from activities.routers.bounded import CALL_CAP, VIEW_CAP, call, json_containers_ok
from activities.routers.view import RouterView, worker_host

#: httpx's per-phase timeout of a router call (connect, write, each read); the whole call is
#: bounded by ``bounded.CALL_DEADLINE_S`` as well.
TIMEOUT_S = 3.0
#: The most of a view's answer read (``bounded.VIEW_CAP``).
MAX_BODY_BYTES = VIEW_CAP

#: What an observer's calls may raise that means "no usable answer" (never a crash).  Not
#: ``temporalio.exceptions.CancelledError``: a cancelled activity stops, it does not read
#: UNKNOWN.
READ_ERRORS: tuple[type[Exception], ...] = (
    httpx.HTTPError,
    httpx.InvalidURL,
    ValueError,
    KeyError,
    TypeError,
    RecursionError,
    OSError,
)


class RouterObserver(Protocol):
    """What withdrawal and the restore need of a router."""

    kind: str
    #: Whether the router has calls to remove and add a worker.  A passive router is only
    #: watched: withdrawal waits for it to drop the member, the restore for it to pick the
    #: member up again.
    active: bool
    #: The container port names its API is on, preferred in order (``activities.routers.pods``).
    port_names: tuple[str, ...]

    def view(self, http: httpx.Client, base: str) -> RouterView:
        """Ask the router at ``base`` which workers it selects now (never raises)."""

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        """Ask the router to drop a worker (verified by a later ``view``); never raises."""

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        """Ask the router to select a worker again (verified by a later ``view``); never
        raises.  Returns what the router answered, for the reason a person reads."""


def failed(e: BaseException | str) -> RouterView:
    """The view of an answer that could not be had or read: never "not selected"."""
    why = e if isinstance(e, str) else f"{type(e).__name__}: {e}"
    return RouterView(workers={}, fetched_at=time.time(), error=why[:200])


def get_body(
    http: httpx.Client, url: str, *, headers: dict[str, str] | None = None
) -> tuple[bytes, float]:
    """GET ``url``: the body of a 2xx answer (at most ``MAX_BODY_BYTES``, within the call's
    overall deadline) and when it arrived; raises one of ``READ_ERRORS`` otherwise.
    Redirects are never followed (a credential sent with the request stays with the
    address it was meant for)."""
    answer = call(http, "GET", url, cap=MAX_BODY_BYTES, headers=headers)
    answer.raise_for_status()
    return answer.body, answer.at


def get_json(http: httpx.Client, url: str) -> tuple[Any, float]:
    """GET ``url`` and decode its JSON body (refused undecoded when it holds more objects
    and arrays than ``bounded.MAX_JSON_CONTAINERS``), and when it arrived."""
    body, at = get_body(http, url)
    json_containers_ok(body)
    return json.loads(body), at


def string(value: Any, what: str) -> str:
    """``value`` when it is a string; TypeError naming ``what`` otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{what} is {type(value).__name__}, not a string")
    return value


def obj(value: Any, what: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; TypeError naming ``what`` otherwise."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} is {type(value).__name__}, not an object")
    return value


def array(value: Any, what: str) -> list[Any]:
    """``value`` when it is a JSON array; TypeError naming ``what`` otherwise."""
    if not isinstance(value, list):
        raise TypeError(f"{what} is {type(value).__name__}, not a list")
    return value


def opaque_worker(urls: list[str] | dict[str, str]) -> str:
    """Why the answer cannot be used when a worker URL's host is not an IP address ("" when
    every one is): such a worker cannot be matched to a member either way."""
    opaque = sorted(u for u in urls if worker_host(u) is None)
    return f"worker URL host is not an IP address: {opaque[0]!r}"[:200] if opaque else ""


def sent(http: httpx.Client, method: str, url: str, **kwargs: Any) -> str:
    """Make one mutating call (bounded like every call, its answer read up to
    ``bounded.CALL_CAP``): what it answered, or how it failed (never raises)."""
    try:
        answer = call(http, method, url, cap=CALL_CAP, cut_ok=True, **kwargs)
    except READ_ERRORS as e:
        return f"{type(e).__name__}: {e}"[:200]
    return f"HTTP {answer.status} {answer.text()}".strip()
