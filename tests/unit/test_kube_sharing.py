"""``kube.sharing.SharedReads``: callers of one key share a request, and none gets an
answer from a request sent before it asked."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from kube.sharing import SharedReads


class Source:
    """A fetch whose calls are numbered and held until the test lets each go."""

    def __init__(self) -> None:
        self.started = 0
        self.gates: list[threading.Event] = []
        self.lock = threading.Lock()

    def fetch(self) -> int:
        with self.lock:
            self.started += 1
            n = self.started
            gate = threading.Event()
            self.gates.append(gate)
        assert gate.wait(5), "the test never let this call go"
        return n

    def let_go(self, n: int) -> None:
        wait_for(lambda: len(self.gates) >= n)
        self.gates[n - 1].set()


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def call(
    reads: SharedReads, key: Any, fetch: Callable[[], Any]
) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(reads.read(key, fetch))
        except Exception as e:
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_a_lone_caller_sends_its_own_request() -> None:
    reads = SharedReads()
    assert reads.read("k", lambda: 41) == 41
    assert reads.read("k", lambda: 42) == 42  # nothing kept between reads
    assert (reads.asked, reads.sent) == (2, 2)
    assert reads._keys == {}


def test_callers_arriving_while_a_request_is_in_flight_share_the_next_one() -> None:
    reads, src = SharedReads(), Source()
    first, first_out = call(reads, "k", src.fetch)
    wait_for(lambda: src.started == 1)
    later = [call(reads, "k", src.fetch) for _ in range(15)]
    wait_for(lambda: reads.asked == 16)
    time.sleep(0.05)
    assert src.started == 1  # the 15 wait: the request in flight was sent before they asked
    src.let_go(1)
    first.join(5)
    assert first_out == [1]
    src.let_go(2)  # one request for the 15, sent after every one of them asked
    for t, out in later:
        t.join(5)
        assert out == [2]
    assert src.started == 2 and (reads.asked, reads.sent) == (16, 2)
    assert reads._keys == {}


def test_no_caller_takes_an_answer_sent_before_it_asked() -> None:
    """Many rounds of callers at random moments: each answer's request number is later
    than every request already sent when the caller asked."""
    reads = SharedReads()
    started = [0]
    lock = threading.Lock()

    def fetch() -> int:
        with lock:
            started[0] += 1
            n = started[0]
        time.sleep(0.003)
        return n

    bad: list[tuple[int, int]] = []

    def run() -> None:
        for _ in range(50):
            with lock:
                before = started[0]
            got = reads.read("k", fetch)
            if got <= before:
                bad.append((before, got))

    threads = [threading.Thread(target=run) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert bad == []
    assert reads.asked == 600 and reads.sent < reads.asked
    assert reads._keys == {}


def test_an_error_is_shared_like_an_answer_and_the_next_read_asks_again() -> None:
    reads, gate = SharedReads(), threading.Event()
    calls = [0]

    def failing() -> int:
        calls[0] += 1
        if calls[0] == 1:
            gate.wait(5)
            return 1
        raise RuntimeError("API server unavailable")

    first, first_out = call(reads, "k", failing)
    wait_for(lambda: calls[0] == 1)
    later = [call(reads, "k", failing) for _ in range(3)]
    wait_for(lambda: reads.asked == 4)
    gate.set()
    first.join(5)
    assert first_out == [1]
    for t, out in later:
        t.join(5)
        assert isinstance(out[0], RuntimeError)
    assert calls[0] == 2
    assert reads.read("k", lambda: 7) == 7


def test_keys_do_not_share() -> None:
    reads, src = SharedReads(), Source()
    a, a_out = call(reads, ("services", "ns-a"), src.fetch)
    wait_for(lambda: src.started == 1)
    b, b_out = call(reads, ("services", "ns-b"), src.fetch)
    wait_for(lambda: src.started == 2)  # not held behind ns-a's request
    src.let_go(2)
    b.join(5)
    src.let_go(1)
    a.join(5)
    assert (a_out, b_out) == ([1], [2])


def test_a_base_exception_in_fetch_still_releases_the_waiters() -> None:
    reads = SharedReads()

    def interrupted() -> int:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reads.read("k", interrupted)
    assert reads._keys == {} and reads.read("k", lambda: 3) == 3
