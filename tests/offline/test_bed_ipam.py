"""The bed's Pod address allocator (``testbed/ipam.py``) rides out an API server restart:
a re-list that fails while the server is away does not end it, and an address it could
not write is freed so the Pod is given one again (a kill -9 of the kube-apiserver in the
fault campaign left every later Pod without an address: the allocator had died)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kubernetes import client

from testbed.ipam import Ipam


class Flaky(Ipam):
    """An allocator whose list and watch are scripted: each entry of ``lists`` is a
    resource version or an exception to raise; every watch fails at once."""

    def __init__(self, lists: list[str | Exception]) -> None:
        super().__init__(client.ApiClient(), cidr="10.0.0.0/29", node="n", parallel=1)
        self.lists = lists
        self.listed = 0

    def _relist(self) -> str:
        self.listed += 1
        item = self.lists.pop(0)
        if not self.lists:
            self.stop.set()  # the script is over: the next loop test ends the run
        if isinstance(item, Exception):
            raise item
        return item

    def _events(self, rv: str) -> Iterator[dict[str, Any]]:
        raise ConnectionResetError("watch cut")


def test_a_relist_that_fails_while_the_server_is_away_does_not_end_the_allocator() -> None:
    ipam = Flaky(["1", ConnectionRefusedError("away"), ConnectionRefusedError("away"), "2"])
    ipam.run()  # before the fix: ConnectionRefusedError out of run(), the allocator dead
    assert ipam.listed == 4


class Refusing:
    """A CoreV1Api whose status writes always fail as a connection would."""

    def __init__(self) -> None:
        self.calls = 0

    def patch_namespaced_pod_status(self, *_: Any) -> None:
        self.calls += 1
        raise ConnectionRefusedError("away")


def test_an_address_that_could_not_be_written_is_freed_to_be_given_again() -> None:
    ipam = Ipam(client.ApiClient(), cidr="10.0.0.0/29", node="n", parallel=1)
    ipam.core = Refusing()  # type: ignore[assignment]
    ipam.write_for_s = 0.3
    ip = ipam.alloc.give("uid-1")
    ipam._write("ns", "pod", "uid-1", ip)
    assert ipam.core.calls >= 2  # type: ignore[attr-defined]
    assert ipam.alloc.holds("uid-1") is None  # before the fix: held, never written again
