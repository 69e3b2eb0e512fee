"""The worker's exec and poll slots are shared fairly between namespaces
(``activities.fairslots.FairSlots``; the security review's M3): a tenant that scales down
many deployments at once queues behind its own reads, not ahead of another tenant's."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from activities import sampling as sampling_module
from activities.fairslots import FairSlots
from activities.polling import DEFAULT_POLL_SLOTS, limit_polls, poll_slots
from activities.sampling import DEFAULT_EXEC_SLOTS, exec_oneshot, limit_execs
from kube.api import ExecResult
from retirement.models import MemberTarget, Target
from tests.helpers.fake_kube import oneshot_stdout


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.01)


# ------------------------------------------------------------------ the rule


def test_a_tenant_alone_uses_every_slot() -> None:
    slots = FairSlots(3)
    assert all(slots.acquire(0, "a") for _ in range(3))
    assert not slots.acquire(0.01, "a")
    assert slots.holding() == {"a": 3}
    for _ in range(3):
        slots.release("a")
    assert slots.holding() == {}


def test_a_freed_slot_goes_to_the_tenant_holding_fewest_not_the_longest_queue() -> None:
    slots = FairSlots(2)
    assert slots.acquire(0, "big") and slots.acquire(0, "big")
    order: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def wait(tenant: str) -> None:
        assert slots.acquire(10, tenant)
        with lock:
            order.append(tenant)
        done.wait(10)
        slots.release(tenant)

    big = [threading.Thread(target=wait, args=("big",)) for _ in range(5)]
    for t in big:
        t.start()
    time.sleep(0.1)  # the big tenant's five wait first
    small = threading.Thread(target=wait, args=("small",))
    small.start()
    time.sleep(0.1)
    slots.release("big")
    wait_for(lambda: len(order) == 1)
    assert order == ["small"]  # it held none; the big tenant held one
    slots.release("big")
    wait_for(lambda: len(order) == 2)
    assert order == ["small", "big"]
    done.set()  # every waiter now takes its turn and gives it back
    for t in [*big, small]:
        t.join(10)
    assert order.count("big") == 5 and slots.holding() == {}


def test_a_waiter_that_times_out_leaves_the_queue() -> None:
    slots = FairSlots(1)
    assert slots.acquire(0, "a")
    assert not slots.acquire(0.05, "b")
    slots.release("a")
    assert slots.holding() == {}
    assert slots.acquire(0, "c")  # nobody left waiting took it


def test_release_of_a_slot_not_held_is_an_error() -> None:
    slots = FairSlots(1)
    with pytest.raises(ValueError):
        slots.release("a")
    with pytest.raises(ValueError):
        FairSlots(0)


def test_under_contention_every_slot_given_is_given_back() -> None:
    slots = FairSlots(4)
    peak = [0]
    lock = threading.Lock()

    def work(tenant: str) -> None:
        for _ in range(50):
            with slots.slot(5, tenant) as got:
                assert got
                with lock:
                    peak[0] = max(peak[0], sum(slots.holding().values()))

    threads = [threading.Thread(target=work, args=(f"t{i % 3}",)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert peak[0] <= 4 and slots.holding() == {}


# ------------------------------------------------------------------ where the worker uses it


class HeldExecs:
    """Execs that hold until released: the quiet namespace's at once, the busy one's one
    permit at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started: list[str] = []
        self.busy = threading.Semaphore(0)

    def exec_pod(self, *, namespace: str, **_: Any) -> ExecResult:
        with self.lock:
            self.started.append(namespace)
        if namespace == "busy":
            self.busy.acquire(timeout=30)
        return ExecResult(stdout=oneshot_stdout(), exit_code=0)


def target_in(namespace: str) -> tuple[Target, MemberTarget]:
    m = MemberTarget(
        pod="llm-1", uid="u1", container_id="c1", ip="198.18.1.11", measured=True, metrics_port=8000
    )
    return Target.model_construct(namespace=namespace, engine="vLLM", members=[m]), m


@pytest.fixture
def restore_slots() -> Iterator[None]:
    yield
    limit_execs(DEFAULT_EXEC_SLOTS)
    limit_polls(DEFAULT_POLL_SLOTS)


def test_one_tenants_fleet_of_reads_does_not_starve_another_tenants_read(
    monkeypatch: pytest.MonkeyPatch, restore_slots: None
) -> None:
    """Two exec slots; the tenant "busy" has 2 reads running and 6 queued when the tenant
    "quiet" asks for one: the next slot freed is quiet's.  With arrival order (a plain
    semaphore), quiet's read ran last, behind all eight of busy's."""
    limit_execs(2)
    monkeypatch.setattr(sampling_module, "EXEC_SLOT_WAIT_S", 3.0)
    api = HeldExecs()
    busy_t, busy_m = target_in("busy")
    quiet_t, quiet_m = target_in("quiet")
    busy = [
        threading.Thread(target=exec_oneshot, args=(api, busy_t, busy_m), daemon=True)
        for _ in range(8)
    ]
    for t in busy:
        t.start()
    wait_for(lambda: len(api.started) == 2)
    time.sleep(0.1)  # six of busy's reads now wait for a slot
    result: list[tuple[str, str]] = []
    quiet = threading.Thread(target=lambda: result.append(exec_oneshot(api, quiet_t, quiet_m)))
    quiet.start()
    time.sleep(0.1)
    api.busy.release()  # one of busy's execs ends: its slot is the first freed
    quiet.join(10)
    assert result and result[0][1] == "", result
    assert api.started.index("quiet") == 2  # the first slot freed went to it, not to busy
    for _ in range(8):
        api.busy.release()
    for t in busy:
        t.join(10)
    assert api.started.count("busy") == 8


def test_poll_slots_are_shared_fairly_too(restore_slots: None) -> None:
    limit_polls(2)
    slots = poll_slots()
    assert slots.acquire(0, "busy") and slots.acquire(0, "busy")
    got: list[str] = []
    threads = [
        threading.Thread(target=lambda n=n: got.append(n) if slots.acquire(5, n) else None)
        for n in ("busy", "busy", "quiet")
    ]
    for t in threads:
        t.start()
        time.sleep(0.05)
    slots.release("busy")
    wait_for(lambda: len(got) == 1)
    assert got == ["quiet"]  # busy still held one, quiet none
    for tenant in ("quiet", "busy", "busy"):
        slots.release(tenant)
    for t in threads:
        t.join(5)
    assert sorted(got) == ["busy", "busy", "quiet"]


def test_a_poll_waiting_across_heartbeats_keeps_its_place(
    monkeypatch: pytest.MonkeyPatch, restore_slots: None
) -> None:
    """A poll waits for its slot in steps, heartbeating between them: with one ticket for
    the whole wait it is not passed by a poll that came later (re-queueing at each step,
    as a first version did, sent it to the back every heartbeat)."""
    from datetime import UTC, datetime, timedelta

    from activities import polling
    from tests.helpers.activity_env import attempt_env

    monkeypatch.setattr(polling, "HEARTBEAT_EVERY_S", 0.05)
    limit_polls(1)
    slots = poll_slots()
    assert slots.acquire(0, "ns")
    got: list[str] = []
    deadline = datetime.now(UTC) + timedelta(seconds=30)

    def early() -> None:
        if attempt_env().run(polling.take_slot, slots, deadline, None, "ns"):
            got.append("early")
            slots.release("ns")

    first = threading.Thread(target=early)
    first.start()
    time.sleep(0.3)  # several heartbeats of waiting
    late = threading.Thread(
        target=lambda: (slots.acquire(10, "ns") and got.append("late"), slots.release("ns"))
    )
    late.start()
    time.sleep(0.1)
    slots.release("ns")
    first.join(10)
    late.join(10)
    assert got == ["early", "late"]
