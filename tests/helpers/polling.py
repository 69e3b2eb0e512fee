"""Waiting for a condition in tests: one polling rule, sync and async.

Tests poll instead of sleeping a fixed time, so they are as fast as the system allows
and fail with what was last seen instead of a bare ``False``. Exceptions from the check
propagate unless the caller names them in ``ignore`` (for example "not created yet").

The rule: call ``check`` every ``interval`` s; a value that is not None and passes
``accept`` (default: is truthy) is returned; after ``timeout`` s the last value (or the
last ignored exception) is reported in an AssertionError.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

__all__ = ["eventually", "eventually_async", "eventually_in_thread"]

T = TypeVar("T")


class _Poll(Generic[T]):
    """One wait: what it waits for, until when, and the last thing seen."""

    def __init__(
        self,
        *,
        what: str,
        timeout: float,
        accept: Callable[[T], bool] | None,
        ignore: tuple[type[Exception], ...],
    ) -> None:
        self.what, self.timeout, self.accept, self.ignore = what, timeout, accept, ignore
        self.deadline = time.monotonic() + timeout
        self.last: object = None
        self.value: T | None = None

    def offer(self, value: T | None) -> bool:
        """Record one answer; True (and ``value`` kept) when it is accepted."""
        self.last = value
        if value is None or not (self.accept(value) if self.accept else bool(value)):
            return False
        self.value = value
        return True

    def miss(self, exc: Exception) -> bool:
        """Record an ignored exception (never accepted)."""
        self.last = exc
        return False

    def result(self) -> T:
        """The accepted value."""
        assert self.value is not None
        return self.value

    def fail_if_expired(self) -> None:
        """Raise the AssertionError that says what was awaited and what was last seen."""
        if time.monotonic() >= self.deadline:
            raise AssertionError(
                f"{self.what}: not true after {self.timeout:g} s (last: {self.last!r})"
            )


def eventually(
    check: Callable[[], T | None],
    *,
    what: str = "condition",
    timeout: float = 30.0,
    interval: float = 0.2,
    accept: Callable[[T], bool] | None = None,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Call ``check`` until its value is accepted (see the module's rule); return it."""
    poll = _Poll(what=what, timeout=timeout, accept=accept, ignore=ignore)

    def sample() -> bool:
        try:
            value = check()
        except poll.ignore as exc:
            return poll.miss(exc)
        return poll.offer(value)

    while not sample():
        poll.fail_if_expired()
        time.sleep(interval)
    return poll.result()


async def eventually_async(
    check: Callable[[], Awaitable[T | None]],
    *,
    what: str = "condition",
    timeout: float = 30.0,
    interval: float = 0.2,
    accept: Callable[[T], bool] | None = None,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """:func:`eventually` for an async ``check``, sleeping on the event loop between tries."""
    poll = _Poll(what=what, timeout=timeout, accept=accept, ignore=ignore)

    async def sample() -> bool:
        try:
            value = await check()
        except poll.ignore as exc:
            return poll.miss(exc)
        return poll.offer(value)

    while not await sample():
        poll.fail_if_expired()
        await asyncio.sleep(interval)
    return poll.result()


async def eventually_in_thread(
    check: Callable[[], T | None],
    *,
    what: str = "condition",
    timeout: float = 30.0,
    interval: float = 0.2,
    accept: Callable[[T], bool] | None = None,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """:func:`eventually` for a blocking ``check``, awaited off the event loop.

    For async tests whose Temporal worker shares the loop: a blocking Kubernetes call on
    the loop would stall the worker the test is waiting for.
    """
    return await asyncio.to_thread(
        eventually,
        check,
        what=what,
        timeout=timeout,
        interval=interval,
        accept=accept,
        ignore=ignore,
    )
