"""The mirror's snapshots a phase activity carries, published on a thread of their own
while the phase runs (``PhaseInput.mirror``, ``workflows.mirror.Mirror.take``).

Published by an activity of its own, every snapshot cost the workflow one more workflow
task when that activity completed: 7 of the ~10 workflow tasks of a retirement, queued
with the phase changes of every other retirement when a fleet goes idle at once.  Carried
by the phase activity the workflow starts anyway, they cost none, and the phase does not
wait for them: they go out on their own thread while it works.

What the mirror promises stays: in order (one thread, one snapshot after the other, and
the workflow hands out snapshots only when no publish activity is running), never a
delay to the phase (at its end the phase waits at most ``END_WAIT_S`` for them, and not
at all when it ends in an error or a cancellation), and nothing lost: the phase reports
how many it published (``reported``); the workflow gives the rest to its publish
activity, which retries them durably.  A thread left behind is stopped before its next
request (``publish``'s ``go_on``), and so is one whose attempt went quiet past its
heartbeat timeout (its claim, ``activities.fencing``): the server may have moved on, and
the workflow may be publishing later ones.  A status write already sent carries the
resourceVersion it read, so it cannot land after a later snapshot's write (409); a
snapshot published twice is the same write and the same Event (a fixed name).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

from activities.fencing import Claim
from activities.publish import publish
from kube.api import KubeApi
from retirement.models import PublishInput
from retirement.reports import DeleteResult, Observation

log = logging.getLogger(__name__)

#: How long a phase that has its result waits for its snapshots still going out.
END_WAIT_S = 1.0

R = TypeVar("R", Observation, DeleteResult)


class Alongside:
    """The snapshots of one phase attempt going out on their own thread."""

    def __init__(
        self, api: KubeApi, snapshots: list[PublishInput], claim: Claim | None = None
    ) -> None:
        self._api = api
        self._claim = claim
        self._snapshots = list(snapshots)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._published = 0
        self._thread: threading.Thread | None = None
        if self._snapshots:
            self._thread = threading.Thread(target=self._run, name="mirror-alongside", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        for snapshot in self._snapshots:
            try:
                done = publish(self._api, snapshot, go_on=self._go_on)
            except Exception as e:  # the workflow's publish activity tries it again
                log.warning("mirror %s alongside the phase: %s", snapshot.phase, e)
                return
            if not done:
                return
            with self._lock:
                if self._stop.is_set():  # reported already: this one is counted as not sent
                    return
                self._published += 1

    def _go_on(self) -> bool:
        """Neither stopped nor the attempt's claim lost (a phase thread stuck past the
        heartbeat timeout: the workflow may be publishing later snapshots already)."""
        if self._stop.is_set():
            return False
        return self._claim is None or not self._claim.refusal_now()

    def stop(self, *, wait_s: float) -> int:
        """Wait up to ``wait_s`` for the thread, stop it, and say how many snapshots (in
        order from the first) were published; what is left the workflow publishes."""
        if self._thread is not None:
            self._thread.join(wait_s)
        with self._lock:
            self._stop.set()
            return self._published

    def reported(self, result: R) -> R:
        """``result`` saying how many of its snapshots the phase published."""
        return result.model_copy(update={"mirrored": self.stop(wait_s=END_WAIT_S)})


@contextmanager
def alongside(
    api: KubeApi, snapshots: list[PublishInput], *, claim: Claim | None = None
) -> Iterator[Alongside]:
    """Publish ``snapshots`` while the body runs, under the attempt's ``claim`` (None:
    outside an activity); an error or a cancellation leaving the body stops them at once
    (the workflow counts none of them published)."""
    carried = Alongside(api, snapshots, claim)
    try:
        yield carried
    finally:
        carried.stop(wait_s=0)
