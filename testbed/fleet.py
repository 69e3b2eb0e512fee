"""Many Pods at once on the bed's kwok node, for the address test and the benchmarks.

kwok makes a Pod cheap (no container runs); a Pod that is never retired needs no engine
emulator, so a fleet is created directly (without the stand-in operator) with the labels
and annotations of SPEC section 2.
"""

from __future__ import annotations

import contextlib
import ipaddress
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from retirement.names import (
    ANNOTATION_PROM_PATH,
    ANNOTATION_PROM_PORT,
    ANNOTATION_PROM_SCHEME,
    APP_NAME,
    ENGINE_CONTAINER,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_ORDINAL,
    LABEL_ROLE_KIND,
)
from testbed.controlplane import NODE_NAME


def plain_pod(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Pod on the kwok node with one ``main`` container (no engine behind it)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": {
            "nodeName": NODE_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": ENGINE_CONTAINER, "image": "emulated/none:latest"}],
        },
    }


def member_pod(
    deployment: str, role: str, ordinal: int, *, eligible: bool = True, metrics_port: int = 9000
) -> dict[str, Any]:
    """A single-member replica's Pod as the gpustack operator labels it (SPEC section 2)."""
    labels = {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: deployment,
        LABEL_COMPONENT: role,
        LABEL_ROLE_KIND: "Server",
        LABEL_ORDINAL: str(ordinal),
    }
    if eligible:
        labels[LABEL_ELIGIBLE] = "true"
    pod = plain_pod(f"{deployment}-{role}-{ordinal}", labels)
    pod["metadata"]["annotations"] = {
        ANNOTATION_PROM_PORT: str(metrics_port),
        ANNOTATION_PROM_SCHEME: "http",
        ANNOTATION_PROM_PATH: "/metrics",
    }
    pod["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
    return pod


def create_pods(
    core: client.CoreV1Api,
    namespace: str,
    pods: Iterable[dict[str, Any]],
    *,
    parallel: int = 16,
    retry_s: float = 30.0,
) -> None:
    """Create every Pod, ``parallel`` at a time; a name still held by a terminating Pod is
    retried until ``retry_s`` (a recreate right after a delete)."""

    def one(pod: dict[str, Any]) -> None:
        deadline = time.monotonic() + retry_s
        while True:
            try:
                core.create_namespaced_pod(namespace, pod)
                return
            except ApiException as e:
                if e.status != 409 or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, list(pods)))


def delete_pods(
    core: client.CoreV1Api, namespace: str, names: Iterable[str], *, parallel: int = 16
) -> None:
    """Delete the Pods by name, at once (grace 0); a Pod already gone is fine."""

    def one(name: str) -> None:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    with ThreadPoolExecutor(max_workers=parallel) as pool:
        list(pool.map(one, list(names)))


def running_ips(core: client.CoreV1Api, namespace: str) -> dict[str, str]:
    """Pod name -> address of every live (not terminating) Pod of ``namespace`` that has one."""
    out: dict[str, str] = {}
    for p in core.list_namespaced_pod(namespace).items:
        if p.metadata.deletion_timestamp is None and p.status and p.status.pod_ip:
            out[p.metadata.name] = p.status.pod_ip
    return out


def wait_running(
    core: client.CoreV1Api,
    namespace: str,
    count: int,
    *,
    timeout: float = 300,
    progress: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Wait until ``count`` live Pods of ``namespace`` run with an address; name -> address."""
    deadline = time.monotonic() + timeout
    last_say = 0.0
    while True:
        ips = running_ips(core, namespace)
        if len(ips) >= count:
            return ips
        now = time.monotonic()
        if now > deadline:
            raise TimeoutError(f"{namespace}: {len(ips)} of {count} Pods have an address")
        if progress is not None and now - last_say > 10:
            progress(f"{namespace}: {len(ips)}/{count} Pods running")
            last_say = now
        time.sleep(0.5)


def duplicates(ips: dict[str, str]) -> dict[str, list[str]]:
    """Address -> the Pods sharing it (only addresses held by more than one)."""
    by_ip: dict[str, list[str]] = {}
    for name, ip in ips.items():
        by_ip.setdefault(ip, []).append(name)
    return {ip: sorted(names) for ip, names in by_ip.items() if len(names) > 1}


def outside(ips: dict[str, str], cidr: str) -> dict[str, str]:
    """The Pods whose address is not in ``cidr``."""
    net = ipaddress.ip_network(cidr)
    return {n: ip for n, ip in ips.items() if ipaddress.ip_address(ip) not in net}
