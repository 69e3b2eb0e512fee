"""The whole local test bed: the control plane, the engine emulators, the stand-in operator
and the real SGLang model gateway, each inside the bed's network namespace where needed."""

from __future__ import annotations

import contextlib
import os
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client, config

from retirement.names import LABEL_ELIGIBLE, LABEL_INSTANCE
from testbed import jsonhttp, netns
from testbed.controlplane import ControlPlane
from testbed.paths import venv_bin
from testbed.procs import Child, wait_until
from testbed.standin_operator import ROUTER_PORT, SERVE_PORT, StandInOperator, router_pod_name

HUB_PORT = 7070


@dataclass
class Bed:
    """A running bed; ``start()`` it, ``stop()`` it (both idempotent)."""

    state_dir: Path
    cp: ControlPlane = field(init=False)
    hub: Child | None = None
    operators: list[StandInOperator] = field(default_factory=list)
    routers: dict[str, Child] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.cp = ControlPlane(state_dir=self.state_dir)

    @property
    def net(self) -> netns.BedNet:
        """The bed's network."""
        return self.cp.net

    @property
    def hub_url(self) -> str:
        """The emulator hub's control API (inside the namespace)."""
        return f"http://{self.net.ns_ip}:{HUB_PORT}"

    def start(self) -> Bed:
        """Start the control plane and the emulator hub."""
        self.cp.start()
        self.hub = Child(
            name="emulator-hub",
            argv=self.net.in_ns(
                [
                    sys.executable,
                    "-m",
                    "testbed.emulator",
                    "--control-host",
                    self.net.ns_ip,
                    "--control-port",
                    str(HUB_PORT),
                    "--address-dev",
                    "lo",
                ]
            ),
            log_path=self.state_dir / "logs" / "emulator-hub.log",
            env=_no_proxy_env(),
        )
        wait_until(
            "emulator hub",
            lambda: self.hub_call("GET", "/health") is not None,
            timeout=30,
            child=self.hub,
        )
        return self

    def stop(self) -> None:
        """Stop routers, operators, the hub and the control plane."""
        for op in self.operators:
            op.stop()
        self.operators.clear()
        for child in self.routers.values():
            child.stop(timeout=5)
        self.routers.clear()
        if self.hub is not None:
            self.hub.stop(timeout=5)
            self.hub = None
        self.cp.stop()

    # ------------------------------------------------------------------ clients

    def api_client(self) -> client.ApiClient:
        """A Kubernetes client for the admin."""
        cfg = client.Configuration()
        config.load_kube_config(config_file=str(self.cp.kubeconfig), client_configuration=cfg)
        cfg.proxy = None
        return client.ApiClient(cfg)

    def hub_call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """Call the emulator hub's control API."""
        return jsonhttp.call(self.hub_url + path, method, body)

    def create_namespace(self, name: str) -> None:
        """Create a namespace (and wait for its default ServiceAccount)."""
        core = client.CoreV1Api(self.api_client())
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

        def has_sa() -> bool:
            core.read_namespaced_service_account("default", name)
            return True

        wait_until(f"namespace {name} default ServiceAccount", has_sa, timeout=30)

    def watcher(
        self,
        *,
        address: str,
        task_queue: str,
        watch_namespace: str,
        log_path: Path,
        resync_s: float = 1.0,
        extra: tuple[str, ...] = (),
        name: str = "watcher",
    ) -> Child:
        """Run the product's watcher (``python -m watcher``) against this bed's cluster."""
        return Child(
            name=name,
            argv=[
                sys.executable,
                "-m",
                "watcher",
                "--kubeconfig",
                str(self.cp.kubeconfig),
                "--address",
                address,
                "--task-queue",
                task_queue,
                "--watch-namespace",
                watch_namespace,
                "--resync",
                f"{resync_s:g}",
                *extra,
            ],
            log_path=log_path,
        )

    def operator(self, namespace: str, *, request_seconds: float = 1.0) -> StandInOperator:
        """Start a stand-in operator for ``namespace``."""
        op = StandInOperator(
            api=self.api_client(),
            namespace=namespace,
            hub_url=self.hub_url,
            request_seconds=request_seconds,
        ).start()
        self.operators.append(op)
        return op

    # ------------------------------------------------------------------ routers

    def start_sglang_router(self, namespace: str, deployment: str, *, timeout: float = 60) -> str:
        """Run the real SGLang model gateway for ``deployment`` on its router Pod's address,
        with Kubernetes service discovery selecting eligible members.  Returns its URL."""
        core = client.CoreV1Api(self.api_client())
        name = router_pod_name(deployment)

        def pod_ip() -> str | None:
            pod = core.read_namespaced_pod(name, namespace)
            return str(pod.status.pod_ip) if pod.status and pod.status.pod_ip else None

        wait_until(f"router pod {name} address", lambda: pod_ip() is not None, timeout=timeout)
        ip = pod_ip()
        assert ip is not None
        netns.add_pod_address(self.net, ip)
        env = _no_proxy_env()
        env["KUBECONFIG"] = str(self.cp.kubeconfig)
        child = Child(
            name=f"sglang-router-{deployment}",
            argv=self.net.in_ns(
                [
                    str(venv_bin("sglang-router")),
                    "launch",
                    "--host",
                    ip,
                    "--port",
                    str(ROUTER_PORT),
                    "--service-discovery",
                    "--selector",
                    f"{LABEL_INSTANCE}={deployment}",
                    f"{LABEL_ELIGIBLE}=true",
                    "--service-discovery-port",
                    str(SERVE_PORT),
                    "--service-discovery-namespace",
                    namespace,
                    "--policy",
                    "round_robin",
                    # Its Prometheus exporter binds to its own Pod address (routers share the
                    # namespace's loopback).
                    "--prometheus-host",
                    ip,
                    "--prometheus-port",
                    "29000",
                    "--health-check-interval-secs",
                    "1",
                    "--worker-startup-check-interval",
                    "1",
                    "--log-level",
                    "info",
                ]
            ),
            log_path=self.state_dir / "logs" / f"sglang-router-{deployment}.log",
            env=env,
        )
        self.routers[deployment] = child
        url = f"http://{ip}:{ROUTER_PORT}"

        def healthy() -> bool:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(url + "/workers", timeout=2) as resp:
                return int(resp.status) == 200

        wait_until("sglang router", healthy, timeout=timeout, child=child)
        return url


def _no_proxy_env() -> dict[str, str]:
    env = dict(os.environ)
    for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "all_proxy"):
        env.pop(key, None)
    env["NO_PROXY"] = "*"
    return env


def wait_for(what: str, check: Any, *, timeout: float = 30, interval: float = 0.2) -> Any:
    """Poll ``check()`` until it returns a truthy value, and return it."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            last = check()
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"{what}: not true after {timeout} s (last: {last!r})")
