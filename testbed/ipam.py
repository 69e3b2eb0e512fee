"""The bed's Pod address allocator (``python -m testbed.ipam``), in place of kwok's pool.

kwok v0.8.0 hands out Pod addresses from an in-memory pool (``ipPool`` in
``pkg/kwok/controllers/utils.go``) that can give one address to two Pods and runs out of
its range:

* the pool is created on first use with ``Load`` then ``Store`` (not ``LoadOrStore``,
  ``PodController.ipPool`` in ``pkg/kwok/controllers/pod_controller.go``): two stage
  workers (4 by default) rendering the first Pods at once each create a pool and hand out
  the same first addresses;
* ``Get()`` runs every time the pod-ready template is rendered, also for a stale copy of
  a Pod (the job queue is keyed by namespace/name, a job is not cancelled once a worker
  took it, and patches and deletes go by name without a UID precondition), and every retry
  of a failed patch renders again; each extra render takes an address that is never
  returned (``Put`` only runs on the Pod's DELETED event, for the address it shows then);
* ``new()`` counts past the end of the range (``AddIP(cidr.IP, index)`` is never
  checked against the CIDR): a /24 gave addresses in the Service range and beyond;
* a restarted kwok knows no address of the running Pods (``markPodIP`` runs only when a
  stage patches a Pod), so it gives them out again.

This allocator is the only writer of ``status.podIP``: it watches the Pods on the kwok
node, gives each Pod without an address the next free address of the Pod range (freed
addresses go to the back of the queue, so an address is reused as late as possible), and
writes it with the Pod's UID as a precondition, so it lands on that Pod or nowhere.  An
address is freed only when the Pod that holds it is gone.  On start and after every
re-list it takes the addresses the live Pods already show.  The bed's pod-ready stage
(``testbed/kwok/pod-ready.yaml``) waits for the address and does not render one.
"""

from __future__ import annotations

import argparse
import collections
import ipaddress
import logging
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("testbed.ipam")
READY_LINE = "ipam: ready"


class Allocator:
    """Addresses of one Pod range, keyed by Pod UID."""

    def __init__(self, cidr: str) -> None:
        self.net = ipaddress.ip_network(cidr)
        self._free: collections.deque[str] = collections.deque(str(h) for h in self.net.hosts())
        self._taken: set[str] = set()
        self.by_uid: dict[str, str] = {}
        self.lock = threading.Lock()

    def holds(self, uid: str) -> str | None:
        """The address given to ``uid``, if any."""
        with self.lock:
            return self.by_uid.get(uid)

    def take(self, uid: str, ip: str) -> None:
        """Record that ``uid`` shows ``ip`` (a Pod that already has one)."""
        with self.lock:
            if uid in self.by_uid or ipaddress.ip_address(ip) not in self.net:
                return
            self.by_uid[uid] = ip
            self._taken.add(ip)

    def give(self, uid: str) -> str:
        """A free address for ``uid`` (the same one when asked again)."""
        with self.lock:
            if uid in self.by_uid:
                return self.by_uid[uid]
            while self._free:
                ip = self._free.popleft()
                if ip not in self._taken:
                    self._taken.add(ip)
                    self.by_uid[uid] = ip
                    return ip
            raise RuntimeError(f"Pod range {self.net} exhausted")

    def free(self, uid: str) -> None:
        """``uid`` is gone: its address goes to the back of the queue."""
        with self.lock:
            ip = self.by_uid.pop(uid, None)
            if ip is not None:
                self._taken.discard(ip)
                self._free.append(ip)

    def reset(self, live: dict[str, str | None]) -> None:
        """After a re-list: forget the UIDs that are gone, take what live Pods show."""
        with self.lock:
            gone = [u for u in self.by_uid if u not in live]
        for uid in gone:
            self.free(uid)
        for uid, ip in live.items():
            if ip:
                self.take(uid, ip)


class Ipam:
    """Watches the Pods of one node and writes their addresses."""

    def __init__(self, api: client.ApiClient, *, cidr: str, node: str, parallel: int) -> None:
        self.core = client.CoreV1Api(api)
        self.alloc = Allocator(cidr)
        self.node = node
        self.pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="ipam")
        self.stop = threading.Event()
        #: How long one address write is retried (an API server restart takes seconds)
        #: before the address is freed, to be given again at the next look at the Pod.
        self.write_for_s = 60.0

    def _selector(self) -> str:
        return f"spec.nodeName={self.node}"

    def _relist(self) -> str:
        pods = self.core.list_pod_for_all_namespaces(field_selector=self._selector())
        live: dict[str, str | None] = {}
        for p in pods.items:
            live[p.metadata.uid] = p.status.pod_ip if p.status else None
        self.alloc.reset(live)
        for p in pods.items:
            self._consider(p)
        return str(pods.metadata.resource_version)

    def _consider(self, pod: Any) -> None:
        meta = pod.metadata
        if meta.deletion_timestamp is not None or (pod.spec and pod.spec.host_network):
            return
        if pod.status and pod.status.pod_ip:
            self.alloc.take(meta.uid, pod.status.pod_ip)
            return
        if self.alloc.holds(meta.uid) is not None:
            return  # written (or being written); the event showing it is on its way
        ip = self.alloc.give(meta.uid)
        self.pool.submit(self._write, meta.namespace, meta.name, meta.uid, ip)

    def _write(self, namespace: str, name: str, uid: str, ip: str) -> None:
        """Write ``ip`` into the Pod's status, retried for ``write_for_s``; an address that
        could not be written is freed, so the next look at the Pod (a re-list, an event)
        gives it one again instead of taking it for written."""
        body = {"metadata": {"uid": uid}, "status": {"podIP": ip, "podIPs": [{"ip": ip}]}}
        deadline = time.monotonic() + self.write_for_s
        attempt = 0
        while not self.stop.is_set():
            try:
                self.core.patch_namespaced_pod_status(name, namespace, body)
                return
            except ApiException as e:
                if e.status in (404, 409, 422):  # gone, or another Pod under that name
                    return  # its DELETED event frees the address
                log.warning("ipam: %s/%s: HTTP %s, retrying", namespace, name, e.status)
            except Exception as e:
                log.warning("ipam: %s/%s: %s, retrying", namespace, name, e)
            attempt += 1
            if time.monotonic() >= deadline:
                break
            time.sleep(min(2.0, 0.2 * attempt))
        log.warning("ipam: %s/%s: address %s not written; freed", namespace, name, ip)
        self.alloc.free(uid)

    def _events(self, rv: str) -> Iterator[dict[str, Any]]:
        """The Pod watch from ``rv`` (one server-side timeout long)."""
        return watch.Watch().stream(  # type: ignore[no-any-return]
            self.core.list_pod_for_all_namespaces,
            field_selector=self._selector(),
            resource_version=rv,
            timeout_seconds=60,
            allow_watch_bookmarks=True,
        )

    def run(self) -> None:
        """List, then watch until stopped; re-list after any watch error, and keep trying
        while the API server is away (a restart: it must never end the allocator)."""
        rv: str | None = self._relist()
        print(READY_LINE, flush=True)
        while not self.stop.is_set():
            try:
                if rv is None:
                    rv = self._relist()
                for ev in self._events(rv):
                    obj = ev["object"]
                    if ev["type"] == "BOOKMARK" or isinstance(obj, dict):
                        meta = obj.get("metadata", {}) if isinstance(obj, dict) else {}
                        rv = meta.get("resourceVersion") or rv
                        continue
                    rv = obj.metadata.resource_version or rv
                    if ev["type"] == "DELETED":
                        self.alloc.free(obj.metadata.uid)
                    elif ev["type"] in ("ADDED", "MODIFIED"):
                        self._consider(obj)
            except Exception as e:
                if self.stop.is_set():
                    return
                log.warning("ipam: watch ended (%s); re-listing", e)
                time.sleep(0.5)
                rv = None


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    p = argparse.ArgumentParser(prog="python -m testbed.ipam")
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--cidr", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--parallel", type=int, default=4)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout)
    cfg = client.Configuration()
    config.load_kube_config(config_file=a.kubeconfig, client_configuration=cfg)
    cfg.proxy = None
    cfg.connection_pool_maxsize = a.parallel + 2
    Ipam(client.ApiClient(cfg), cidr=a.cidr, node=a.node, parallel=a.parallel).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
