"""The bed's network: one network namespace joined to the host by a veth pair.

Every simulated Pod address lives inside the namespace (EndpointSlices reject loopback
addresses, and nothing may ever be sent to an address outside loopback and the bed's own
namespace).  Layout, all inside 198.18.0.0/15 (the benchmarking range, RFC 2544):

    host end of the veth   198.18.0.1/24    the API server binds here
    namespace end          198.18.0.2/24    kwok's node address (exec, the kubelet API)
    Service ClusterIPs     198.18.2.0/24    virtual: nothing ever connects to them
    Pod addresses          198.19.0.0/16    65,534 addresses, given out by testbed/ipam.py;
                                            routed via .2, local inside the namespace

Inside the namespace the whole Pod range is one ``local`` route on the loopback, so a
server can bind any Pod address and nothing needs a ``/32`` per Pod (5,000 Pods cost
nothing here; ``add_pod_address`` still puts a ``/32`` on the loopback for the Pods that
serve, which is harmless).  A Pod address nothing listens on refuses at once.

kwok, the engine emulators and the routers run inside the namespace, so an exec'd
one-shot's ``127.0.0.1`` is the namespace's loopback.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
from dataclasses import dataclass

PREFIX = "rbed"


@dataclass(frozen=True)
class BedNet:
    """Names and addresses of one bed network."""

    name: str = PREFIX
    host_ip: str = "198.18.0.1"
    ns_ip: str = "198.18.0.2"
    link_cidr: str = "198.18.0.0/24"
    pod_cidr: str = "198.19.0.0/16"
    service_cidr: str = "198.18.2.0/24"

    @property
    def host_if(self) -> str:
        """The veth end in the host namespace."""
        return f"{self.name}-h"

    @property
    def ns_if(self) -> str:
        """The veth end inside the namespace."""
        return f"{self.name}-n"

    def owns(self, address: str) -> bool:
        """Whether ``address`` is loopback or one of this bed's (a safe destination): the
        veth's link or the Pod range (Service ClusterIPs are virtual, so not a destination)."""
        ip = ipaddress.ip_address(address)
        if ip.is_loopback:
            return True
        return any(ip in ipaddress.ip_network(n) for n in (self.link_cidr, self.pod_cidr))

    def in_ns(self, argv: list[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["ip", "netns", "exec", self.name, *argv]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def exists(net: BedNet) -> bool:
    """Whether the namespace exists."""
    out = _ip("netns", "list", check=False).stdout
    return any(line.split()[0] == net.name for line in out.splitlines() if line.strip())


def destroy(net: BedNet) -> None:
    """Kill whatever still runs inside the namespace and delete it (and so the veth)."""
    if exists(net):
        pids = _ip("netns", "pids", net.name, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        _ip("netns", "del", net.name, check=False)
    _ip("link", "del", net.host_if, check=False)


def create(net: BedNet) -> None:
    """Create the namespace, the veth pair, the addresses and the route to the Pods.

    A namespace of the same name left by a killed run is destroyed first.
    """
    destroy(net)
    _ip("netns", "add", net.name)
    _ip("link", "add", net.host_if, "type", "veth", "peer", "name", net.ns_if)
    _ip("link", "set", net.ns_if, "netns", net.name)
    prefix = ipaddress.ip_network(net.link_cidr).prefixlen
    _ip("addr", "add", f"{net.host_ip}/{prefix}", "dev", net.host_if)
    _ip("link", "set", net.host_if, "up")
    inside = ["-n", net.name]
    _ip(*inside, "link", "set", "lo", "up")
    _ip(*inside, "addr", "add", f"{net.ns_ip}/{prefix}", "dev", net.ns_if)
    _ip(*inside, "link", "set", net.ns_if, "up")
    _ip(*inside, "route", "replace", "local", net.pod_cidr, "dev", "lo")
    _ip("route", "replace", net.pod_cidr, "via", net.ns_ip, "dev", net.host_if)


def add_pod_address(net: BedNet, address: str) -> None:
    """Give a Pod address to the namespace's loopback (idempotent; not needed to bind it,
    the Pod range is local there, but it shows in ``ip addr``)."""
    if ipaddress.ip_address(address) not in ipaddress.ip_network(net.pod_cidr):
        raise ValueError(f"{address} is not a Pod address of this bed")
    _ip("-n", net.name, "addr", "replace", f"{address}/32", "dev", "lo")
