"""The watcher's controller (``watcher.controller``) running over a ``World``
(``tests/helpers/watcher_world.py``), fed by list+watch through ``FakeSource``: the
``running`` fixture starts controllers (each stopped after the test), ``Running`` is what a
test reads of one, and ``until`` polls a condition without blocking the event loop.
Shared by ``tests/offline/test_watcher_controller.py`` and
``tests/offline/test_watcher_held_and_failing.py``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers import eventually_async
from tests.helpers.fake_source import FakeSource
from tests.helpers.watcher_world import World, make_world
from watcher.controller import Controller
from watcher.metrics import Health


@dataclass
class Running:
    world: World
    source: FakeSource
    controller: Controller
    health: Health
    stop: threading.Event

    def reconciled(self) -> float:
        return self.world.metric("retire_watcher_reconciles_total")


@pytest.fixture
async def running() -> AsyncIterator[Callable[..., Awaitable[Running]]]:
    started: list[tuple[threading.Event, asyncio.Task[None]]] = []

    async def start(world: World | None = None, **kw: Any) -> Running:
        w = world or make_world()
        source, health, stop = FakeSource(w.kube), Health(), threading.Event()
        ctl = Controller(
            rec=w.rec, source=source, health=health, refresh_s=0.05, resync_s=3600, **kw
        )
        task = asyncio.create_task(ctl.run(stop))
        started.append((stop, task))
        return Running(w, source, ctl, health, stop)

    yield start
    for stop, task in started:
        stop.set()
        await asyncio.wait_for(task, 5)


async def until(check: Callable[[], Any], what: str, timeout: float = 5) -> Any:
    return await eventually_async(
        lambda: asyncio.sleep(0, result=check()), what=what, timeout=timeout, interval=0.01
    )
