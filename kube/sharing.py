"""``SharedReads``: concurrent callers of the same read share one request, and each still
gets an answer as fresh as one it would have sent itself.

Every withdrawal poll of a worker lists every Service and EndpointSlice of its namespace
(``activities.withdrawal``).  With 200 retirements in one namespace that was 400 lists a
second, each O(namespace): measured in the worker benchmark, the worker's CPU went to
decoding the same lists over and over.  Shared here, a namespace costs about one listing
per request time, whatever the number of polls.

The freshness rule is what makes sharing safe: a caller joins only a request that has not
been sent yet.  When one is in flight, the caller waits for the next one, which is sent
once the one in flight has answered; every caller that arrives meanwhile joins it.  So
each caller's answer comes from a request sent after the caller asked, exactly as if it
had sent its own: a reading of "withdrawn" is never older than the poll that took it.
Errors are shared the same way (the request each caller would have sent failed).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class _Flight:
    """One request and the callers waiting for its answer."""

    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None

    def answer(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.value


@dataclass
class _Key:
    """A key's request in flight (sent) and the next one (gathering callers, not sent)."""

    running: _Flight | None = None
    next: _Flight | None = None


@dataclass
class SharedReads:
    """Single-flight reads with the freshness rule above (thread-safe)."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _keys: dict[Hashable, _Key] = field(default_factory=dict, repr=False)
    #: Reads asked and requests sent (what sharing saved; read by the tests).
    asked: int = 0
    sent: int = 0

    def read(self, key: Hashable, fetch: Callable[[], Any]) -> Any:
        """``fetch()``'s answer (or error) from a call started after this one began,
        shared with every caller of ``key`` that joined the same call."""
        ahead: _Flight | None = None
        with self._lock:
            self.asked += 1
            state = self._keys.setdefault(key, _Key())
            joined = state.next
            if joined is None:
                flight = _Flight()
                if state.running is None:
                    state.running = flight
                else:
                    ahead, state.next = state.running, flight
        if joined is not None:
            return joined.answer()
        if ahead is not None:
            ahead.done.wait()  # bounded: every fetch is (the client's request timeout)
            with self._lock:
                state.running, state.next = flight, None
        return self._send(key, state, flight, fetch)

    def _send(self, key: Hashable, state: _Key, flight: _Flight, fetch: Callable[[], Any]) -> Any:
        try:
            flight.value = fetch()
        except BaseException as e:
            flight.error = e
        finally:
            with self._lock:
                self.sent += 1
                if state.running is flight:
                    state.running = None
                if state.running is None and state.next is None:
                    self._keys.pop(key, None)
            flight.done.set()
        return flight.answer()
