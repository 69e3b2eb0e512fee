"""Bounded HTTP calls: what the activities ask a router or an engine over HTTP (router
views, removals and re-adds, identity probes) is bounded in size and in time, whatever the
other end sends.

- **Size**: the answer is read as a stream and reading stops at the first byte past the
  cap (``Overrun``, a ``ValueError``: the reading says why, UNKNOWN).  Nothing is read whole
  first: a 300 MB answer costs at most the cap.
- **Time**: one call (connect, request, answer headers, the whole body) has an overall
  deadline, not only httpx's per-phase timeouts, which a peer that sends one byte before
  each read timeout would stretch for ever.  The deadline is checked between chunks, and a
  watchdog thread shuts the call's socket down at the deadline, so even a read that blocks
  returns then (``CallDeadline``, an ``httpx.TimeoutException``).  The socket is taken from
  httpcore's ``trace`` extension when the connection is made, so every call asks for its
  own connection (``Connection: close``): a kept-alive one would be reused without it.

A cancellation of the activity (``temporalio.exceptions.CancelledError``, raised into the
activity's thread) is never caught here: it is not one of the errors a reading turns into a
reason.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

#: The overall bound of one call, in seconds (connect to last byte).  Inside the phase
#: activities' 10 s heartbeat timeout, with room for the Kubernetes reads of a poll.
CALL_DEADLINE_S = 5.0
#: The most of a view read (a router's worker list, llm-d's picker's metrics): thousands of
#: workers fit far below it.
VIEW_CAP = 4 << 20
#: The most of the answer to a removal or a re-add read: only its first words go into a
#: reason.
CALL_CAP = 64 << 10
#: JSON containers (objects and arrays) a decoded answer may hold: ``json.loads`` spends
#: ~100 MiB on 4 MiB of ``[{},{},...]``; a list of thousands of workers holds a few per
#: worker.  Counted on the raw bytes (brackets inside strings count too: the count only
#: errs towards refusing).
MAX_JSON_CONTAINERS = 100_000


class Overrun(ValueError):
    """The answer went on past its cap: not read further."""


class CallDeadline(httpx.TimeoutException):
    """The call did not end within its overall deadline."""


@dataclass(frozen=True)
class Answer:
    """A bounded answer: the response (closed: its body is ``body``, never read from it),
    the body read (at most the cap), and when it ended (epoch seconds)."""

    response: httpx.Response
    body: bytes
    at: float
    #: Whether the body went on past the cap (``body`` is then its first ``cap`` bytes).
    cut: bool = False

    @property
    def status(self) -> int:
        return self.response.status_code

    def raise_for_status(self) -> None:
        """``httpx.HTTPStatusError`` unless the status is 2xx."""
        if not self.response.is_success:
            r = self.response
            raise httpx.HTTPStatusError(
                f"HTTP {r.status_code} {r.reason_phrase}".strip(), request=r.request, response=r
            )

    def text(self, limit: int = 120) -> str:
        """The start of the body as printable text, for a reason."""
        head = self.body[:limit].decode("utf-8", "replace")
        return "".join(c if c.isprintable() else "?" for c in head)


class _Watchdog:
    """One daemon thread that shuts down the sockets of calls past their deadline."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._armed: dict[int, socket.socket] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, at: float, sock: socket.socket) -> int:
        """Shut ``sock`` down at monotonic time ``at`` unless disarmed first."""
        with self._cond:
            key = next(self._ids)
            self._armed[key] = sock
            heapq.heappush(self._heap, (at, key))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)
                self._thread.start()
            self._cond.notify()
            return key

    def disarm(self, key: int) -> None:
        with self._cond:
            self._armed.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._armed:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                at, key = self._heap[0]
                wait = at - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                sock = self._armed.pop(key)
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    """Shut a socket down in both directions: a read blocked on it returns at once.  The
    plain socket's own call, also for a TLS socket (whose ``shutdown`` would drop its TLS
    state under a reading thread)."""
    with contextlib.suppress(OSError, ValueError):  # closed already
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


_WATCHDOG = _Watchdog()


@dataclass
class Deadline:
    """The overall deadline of one call, and the sockets the call opened."""

    seconds: float
    at: float = field(init=False)
    fired: bool = field(default=False, init=False)
    _keys: list[int] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.at = time.monotonic() + self.seconds

    def left(self) -> float:
        return self.at - time.monotonic()

    def check(self) -> None:
        """Raise ``CallDeadline`` once the deadline has passed."""
        if self.left() <= 0:
            self.fired = True
            raise self.error()

    def error(self) -> CallDeadline:
        return CallDeadline(f"no whole answer within the call's {self.seconds:g} s deadline")

    def trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's ``trace`` extension: arm the watchdog on each new connection."""
        if name != "connection.connect_tcp.complete":
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            self._keys.append(_WATCHDOG.arm(self.at, sock))

    def close(self) -> None:
        for key in self._keys:
            _WATCHDOG.disarm(key)
        self._keys.clear()
        if self.left() <= 0:
            self.fired = True


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[Deadline]:
    d = Deadline(seconds)
    try:
        yield d
    except httpx.HTTPError as e:
        d.close()  # past the deadline: ``fired``, whatever broke the call
        if d.fired:
            raise d.error() from e
        raise
    finally:
        d.close()


def call(
    http: httpx.Client,
    method: str,
    url: str,
    *,
    cap: int,
    cut_ok: bool = False,
    deadline_s: float | None = None,
    **kwargs: Any,
) -> Answer:
    """One HTTP call bounded by ``cap`` bytes of answer and ``deadline_s`` seconds in all
    (``CALL_DEADLINE_S`` when None).

    A body past the cap raises ``Overrun``, unless ``cut_ok`` (the first ``cap`` bytes are
    then kept and ``cut`` set: for answers only a reason reads).  Redirects are never
    followed (a credential sent with the request stays with the address it was meant for).
    Raises ``httpx.HTTPError`` (``CallDeadline`` past the deadline) or ``Overrun``."""
    headers = httpx.Headers(kwargs.pop("headers", None))
    headers["Connection"] = "close"  # a connection of its own: see the module's docstring
    with _deadline(CALL_DEADLINE_S if deadline_s is None else deadline_s) as d:
        extensions = {"trace": d.trace}
        with http.stream(
            method, url, headers=headers, follow_redirects=False, extensions=extensions, **kwargs
        ) as r:
            d.check()
            chunks: list[bytes] = []
            size = 0
            cut = False
            for chunk in r.iter_bytes():
                d.check()
                room = cap - size
                if len(chunk) > room:
                    if not cut_ok:
                        raise Overrun(f"answer longer than its {cap}-byte cap: not read further")
                    chunks.append(chunk[:room])
                    cut = True
                    break
                chunks.append(chunk)
                size += len(chunk)
            d.check()
            return Answer(r, b"".join(chunks), time.time(), cut)
    raise AssertionError("unreachable")  # pragma: no cover (the context manager re-raises)


def json_containers_ok(body: bytes) -> None:
    """Raise ``Overrun`` when a JSON body holds more containers than ``MAX_JSON_CONTAINERS``
    (counted before decoding it)."""
    count = body.count(b"{") + body.count(b"[")
    if count > MAX_JSON_CONTAINERS:
        raise Overrun(
            f"answer holds {count} JSON objects and arrays, over {MAX_JSON_CONTAINERS}: not decoded"
        )
