"""The controller's work queue of deployment keys (client-go's semantics, on asyncio).

- De-duplication: a key added while it waits is queued once; a key added while it is
  being reconciled is queued again only after that reconcile is ``done``, so one
  deployment is never reconciled twice at once and no change is lost.
- Delayed adds (``add_after``): a refusal's back-off ends, a periodic resync.
- Rate-limited requeue after a failure: 0.5 s doubling per consecutive failure of the key
  up to ``max_delay_s``; ``forget`` resets it after a success.

Single-threaded: every method is called on the event loop (informer threads go through
``loop.call_soon_threadsafe``).  A key made ready wakes one waiting ``get``, not all of
them (each waiter is a future of its own): with four workers, waking all four for every
event cost a tenth of the watcher's CPU per event (``python -m bench watcher-profile``).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field


@dataclass
class WorkQueue:
    """Keys to reconcile, each at most once in the queue and once in flight."""

    base_delay_s: float = 0.5
    max_delay_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _queue: deque[Hashable] = field(default_factory=deque, init=False)
    _dirty: set[Hashable] = field(default_factory=set, init=False)
    _processing: set[Hashable] = field(default_factory=set, init=False)
    _failures: dict[Hashable, int] = field(default_factory=dict, init=False)
    _delayed: list[tuple[float, int, Hashable]] = field(default_factory=list, init=False)
    _seq: itertools.count[int] = field(default_factory=itertools.count, init=False)
    #: The ``get`` calls waiting for a key, oldest first (each wakes on its own future).
    _waiters: deque[asyncio.Future[None]] = field(default_factory=deque, init=False)
    _closed: bool = field(default=False, init=False)
    #: Keys added in all (duplicates included) and keys actually queued.
    added: int = field(default=0, init=False)
    queued: int = field(default=0, init=False)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: Hashable) -> None:
        """Queue ``key`` unless it already waits."""
        self.added += 1
        if self._closed or key in self._dirty:
            return
        self._dirty.add(key)
        if key not in self._processing:
            self._queue.append(key)
            self.queued += 1
            self._wake_one()

    def add_after(self, key: Hashable, delay_s: float) -> None:
        """Queue ``key`` after ``delay_s`` seconds (at once when not positive)."""
        if delay_s <= 0:
            self.add(key)
            return
        heapq.heappush(self._delayed, (self.clock() + delay_s, next(self._seq), key))
        self._wake_one()  # it waits for the earliest delayed key: maybe this one

    def add_rate_limited(self, key: Hashable) -> float:
        """Queue ``key`` again after its failure back-off; returns the delay."""
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        delay = min(self.base_delay_s * 2.0**n, self.max_delay_s)
        self.add_after(key, delay)
        return delay

    def forget(self, key: Hashable) -> None:
        """``key`` succeeded: its next failure starts the back-off over."""
        self._failures.pop(key, None)

    def in_flight(self, key: Hashable) -> bool:
        """Whether ``key`` was handed out by ``get`` and is not ``done`` yet."""
        return key in self._processing

    def failures(self, key: Hashable) -> int:
        """Consecutive failures of ``key``."""
        return self._failures.get(key, 0)

    async def get(self) -> Hashable | None:
        """The next key to reconcile (it is in flight until ``done``); None once closed."""
        while True:
            self._promote()
            if self._closed:
                return None
            if self._queue:
                key = self._queue.popleft()
                self._dirty.discard(key)
                self._processing.add(key)
                if self._queue or self._delayed:
                    self._wake_one()  # more to hand out, or a delay to watch: pass it on
                return key
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            timer = (
                loop.call_later(max(0.0, self._delayed[0][0] - self.clock()), _wake, waiter)
                if self._delayed
                else None
            )
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken, then cancelled: the wake goes to another
                raise
            finally:
                if timer is not None:
                    timer.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def done(self, key: Hashable) -> None:
        """The reconcile of ``key`` ended; queue it again if it was added meanwhile."""
        self._processing.discard(key)
        if key in self._dirty:
            self._queue.append(key)
            self.queued += 1
            self._wake_one()

    def close(self) -> None:
        """Wake every waiting ``get`` with None."""
        self._closed = True
        for waiter in self._waiters:
            _wake(waiter)

    def _wake_one(self) -> None:
        """Wake the oldest waiting ``get`` that is not woken yet."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
                return

    def _promote(self) -> None:
        now = self.clock()
        while self._delayed and self._delayed[0][0] <= now:
            _, _, key = heapq.heappop(self._delayed)
            self.add(key)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
