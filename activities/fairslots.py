"""``FairSlots``: a bound on concurrent work in one worker process, shared fairly between
tenants (the namespaces the retirements run in).

The worker bounds its concurrent execs (``activities.sampling``) and polls
(``activities.polling``): without a bound a fleet's reads all start at once and time out
together.  A plain semaphore serves waiters in arrival order, so one tenant that scales
down a hundred deployments at once queues ahead of every other tenant's single
retirement, whose reads then wait (and read UNKNOWN, and run out of budget) behind
reads it has nothing to do with (the security review's M3).

Here a freed slot goes to the waiting tenant that holds the fewest slots now (ties: the
tenant whose oldest waiter came first); within a tenant, first come first served.  A
tenant alone uses every slot; two busy tenants share them evenly, whatever their queue
lengths.  A slot is given to a waiter, never taken back.

How many slots are given out at most can follow the work's own latency (``congested``,
``uncongested``: additive increase, multiplicative decrease, as TCP does): the exec reads
of a fleet that drains at once all share one node's CPU and one API server, and past a
point every exec more makes each one slower, until they pass their bound together, read
UNKNOWN, and are tried again, with more work for the same CPU (measured: 200 retirements
at once on this bed, 164 aborted that way, every one of them safely).  Halved when work
overran its bound, the reads in flight have the node to themselves sooner; one slot more
for each read that was quick brings the bound back when the node has room.  (Not shown to
prevent that collapse on this bed yet: ``docs/benchmarks.md``.)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class _Waiter:
    seq: int
    granted: threading.Event = field(default_factory=threading.Event)


@dataclass
class Ticket:
    """A place in the queue for one slot (``FairSlots.request``)."""

    slots: FairSlots
    tenant: str
    waiter: _Waiter

    def wait(self, timeout: float | None) -> bool:
        """True once the slot is given (then the caller holds it)."""
        return self.waiter.granted.wait(timeout)

    def cancel(self) -> bool:
        """Leave the queue; True when the slot had been given meanwhile (then held)."""
        return self.slots._withdraw(self)


class FairSlots:
    """At most ``size`` holders at once, handed out fairly between tenants."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"slots must be at least 1, not {size}")
        self.size = size
        #: Slots given out at most now: ``size``, unless ``congested`` lowered it.
        self.limit = size
        self._lowered_at = -float("inf")
        self._lock = threading.Lock()
        self._free = size
        self._held: dict[str, int] = {}
        self._waiting: dict[str, deque[_Waiter]] = {}
        self._seq = itertools.count()

    def acquire(self, timeout: float | None = None, tenant: str = "") -> bool:
        """Take a slot for ``tenant``, waiting up to ``timeout`` seconds (None: for ever);
        False when none was given in time."""
        ticket = self.request(tenant)
        return ticket.wait(timeout) or ticket.cancel()

    def request(self, tenant: str = "") -> Ticket:
        """Queue for a slot and keep the place: a caller that waits in several steps (to
        heartbeat in between) waits with one ticket, so it is not passed by those who
        came after it.  The ticket must end granted (then ``release``) or cancelled."""
        ticket = Ticket(self, tenant, _Waiter(next(self._seq)))
        with self._lock:
            self._waiting.setdefault(tenant, deque()).append(ticket.waiter)
            self._dispatch()
        return ticket

    def _withdraw(self, ticket: Ticket) -> bool:
        """Take ``ticket`` out of the queue; True when it had been given a slot already
        (the caller then holds it)."""
        with self._lock:
            if ticket.waiter.granted.is_set():
                return True
            queue = self._waiting.get(ticket.tenant)
            if queue is not None and ticket.waiter in queue:
                queue.remove(ticket.waiter)
                if not queue:
                    del self._waiting[ticket.tenant]
            return False

    def release(self, tenant: str = "") -> None:
        """Give back a slot ``tenant`` held."""
        with self._lock:
            held = self._held.get(tenant, 0)
            if held <= 0:
                raise ValueError(f"release of a slot tenant {tenant!r} does not hold")
            if held == 1:
                del self._held[tenant]
            else:
                self._held[tenant] = held - 1
            self._free += 1
            self._dispatch()

    @contextmanager
    def slot(self, wait_s: float, tenant: str = "") -> Iterator[bool]:
        """Hold a slot for the block; yields False when none was given within ``wait_s``."""
        got = self.acquire(wait_s, tenant)
        try:
            yield got
        finally:
            if got:
                self.release(tenant)

    def congested(self, *, hold_s: float) -> None:
        """Work in a slot overran its bound: give out half as many slots (at least one).
        Once per ``hold_s`` at most: the work begun before the cut ends within it, and its
        overruns are of the old bound, not of the new one."""
        with self._lock:
            now = time.monotonic()
            if now - self._lowered_at < hold_s:
                return
            self._lowered_at = now
            self.limit = max(1, self.limit // 2)

    def uncongested(self) -> None:
        """Work in a slot went quickly: one slot more, up to ``size``."""
        with self._lock:
            if self.limit < self.size:
                self.limit += 1
                self._dispatch()

    def holding(self) -> dict[str, int]:
        """Slots held now, by tenant (for tests and metrics)."""
        with self._lock:
            return dict(self._held)

    def _dispatch(self) -> None:
        """Give free slots to waiters (the lock is held)."""
        while self._free > 0 and self._waiting and self.size - self._free < self.limit:
            tenant = min(
                self._waiting,
                key=lambda t: (self._held.get(t, 0), self._waiting[t][0].seq),
            )
            queue = self._waiting[tenant]
            waiter = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self._free -= 1
            self._held[tenant] = self._held.get(tenant, 0) + 1
            waiter.granted.set()


#: Waits for idle one worker runs at once (``WorkerSlots.waits``, ``retire-worker
#: --max-concurrent-waits``): one per busy member of a retirement whose engine counts
#: exactly; past it, a busy member's next read is spaced as it would be without waiting
#: (``retirement.drain.next_read_in``), each read an exec.  A wait runs on its phase
#: activity's own thread and holds a websocket to the API server and a sleeping process
#: in the engine's container while it lasts.  Measured in the worker benchmark at N = 200
#: (docs/benchmarks.md): when every retirement is already withdrawing as its engine goes
#: idle (as with admission run locally, since reverted) 64 left the rest to be read an
#: exec at a time and 4-12 of 200 withdrawals ran out of budget, where 256 let all 200
#: complete; on today's steps 64 completed 200 of 200 in five runs and 256 was not better
#: in three (52.7-57.1 s idle -> delete against 41.5-58.5 s).
DEFAULT_WAIT_SLOTS = 64


@dataclass(frozen=True)
class WorkerSlots:
    """One worker's bounds, owned by the ``RetirementActivities`` it builds: its exec
    slots (``activities.sampling``), its poll slots (``activities.polling``), and its wait
    slots (``activities.sampling.wait_for_idle``: execs that wait in the engine's container
    for its count to read 0; each holds a sleeping process and a websocket, so they are
    bounded apart from the reads, which each cost a process start and a parse)."""

    execs: FairSlots
    polls: FairSlots
    waits: FairSlots = field(default_factory=lambda: FairSlots(DEFAULT_WAIT_SLOTS))
