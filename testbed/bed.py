"""The whole local test bed: the control plane, the engine emulators, the stand-in operator
and the real routers (SGLang model gateway, smg, vllm-router), each inside the bed's network
namespace where needed."""

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
from testbed.paths import REPO_ROOT, venv_bin
from testbed.procs import Child, wait_until
from testbed.standin_operator import ROUTER_PORT, SERVE_PORT, StandInOperator, router_pod_name
from testbed.standin_termination import PodTermination

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
            cwd=REPO_ROOT,  # the bed is not installed: ``python -m`` finds it here
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

    def operator(
        self,
        namespace: str,
        *,
        request_seconds: float = 1.0,
        step_seconds: float | None = None,
        termination: PodTermination | None = None,
    ) -> StandInOperator:
        """Start a stand-in operator for ``namespace`` (``step_seconds``: the emulated
        SGLang's decode-step time; ``termination``: the preStop sleep and grace period its
        Pods carry, their graceful deletion run by the emulated kubelet)."""
        op = StandInOperator(
            api=self.api_client(),
            namespace=namespace,
            hub_url=self.hub_url,
            request_seconds=request_seconds,
            step_seconds=step_seconds,
            termination=termination,
        ).start()
        self.operators.append(op)
        return op

    # ------------------------------------------------------------------ routers

    def start_router(
        self,
        namespace: str,
        deployment: str,
        *,
        program: str = "sglang-router",
        pod: str | None = None,
        timeout: float = 60,
    ) -> str:
        """Run the real router ``program`` (one of ``ROUTERS``) for ``deployment`` on the
        address of its router Pod (``pod``, default the stand-in operator's), with
        Kubernetes service discovery selecting the eligible members.  Returns its URL.
        ``bed.routers`` keeps it under the Pod's name."""
        if program not in ROUTERS:
            raise ValueError(f"no real router {program!r} here (have {sorted(ROUTERS)})")
        core = client.CoreV1Api(self.api_client())
        name = pod or router_pod_name(deployment)

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
            name=f"{program}-{deployment}",
            argv=self.net.in_ns(
                router_argv(program, ip=ip, namespace=namespace, deployment=deployment)
            ),
            log_path=self.state_dir / "logs" / f"{program}-{deployment}.log",
            env=env,
        )
        self.routers[name] = child
        url = f"http://{ip}:{ROUTER_PORT}"
        probe = "/list_workers" if ROUTERS[program] == "vllm-router" else "/workers"

        def healthy() -> bool:
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(url + probe, timeout=2) as resp:
                return int(resp.status) == 200

        wait_until(program, healthy, timeout=timeout, child=child)
        return url

    def start_sglang_router(self, namespace: str, deployment: str, *, timeout: float = 60) -> str:
        """The SGLang model gateway (``sglang-router`` 0.3.2) for ``deployment``."""
        return self.start_router(namespace, deployment, program="sglang-router", timeout=timeout)


#: The real routers the bed runs (their executables, from pyproject's dev dependencies) and
#: the router kind a ModelDeployment declares for each: the CRD knows ``sglang-gateway``
#: for the SGLang model gateway whichever release runs it (0.3.x or its successor smg).
ROUTERS = {
    "sglang-router": "sglang-gateway",  # 0.3.2
    "smg": "sglang-gateway",  # 1.13.0, the gateway's successor
    "vllm-router": "vllm-router",  # 0.1.17
    # The release gpustack pins: its discovery keeps a de-labelled Pod (vllm-project/router
    # #279), so only the product's active removal takes the member out.  Installed beside
    # the venv's 0.1.17 by `make venv` (``OLD_VLLM_ROUTER``).
    "vllm-router-0.1.15": "vllm-router",
}

#: Where `make venv` installs vllm-router 0.1.15 (``--target``, no dependencies: it shares
#: 0.1.17's, which the venv has).
OLD_VLLM_ROUTER = Path(sys.executable).parent.parent / "vllm-router-0.1.15"


def router_argv(program: str, *, ip: str, namespace: str, deployment: str) -> list[str]:
    """The command line of the real router ``program``: service discovery of the deployment's
    eligible members on the bed, bound to the router Pod's address (routers share the
    namespace's loopback, so every listener, the Prometheus exporter too, binds that
    address), health checks every second, nothing fetched from a model hub."""
    discovery = [
        "--service-discovery",
        "--selector",
        f"{LABEL_INSTANCE}={deployment}",
        f"{LABEL_ELIGIBLE}=true",
        "--service-discovery-port",
        str(SERVE_PORT),
        "--service-discovery-namespace",
        namespace,
    ]
    common = [
        "--host",
        ip,
        "--port",
        str(ROUTER_PORT),
        *discovery,
        "--policy",
        "round_robin",
        "--prometheus-host",
        ip,
        "--prometheus-port",
        "29000",
        "--health-check-interval-secs",
        "1",
        "--worker-startup-check-interval",
        "1",
    ]
    if program == "vllm-router-0.1.15":
        if not (OLD_VLLM_ROUTER / "vllm_router").is_dir():
            raise FileNotFoundError(f"vllm-router 0.1.15 is not in {OLD_VLLM_ROUTER}: make venv")
        run = f"import sys; sys.path.insert(0, {str(OLD_VLLM_ROUTER)!r}); "
        run += "from vllm_router.launch_router import main; main()"
        return [sys.executable, "-c", run, *common, "--log-level", "info"]
    exe = str(venv_bin(program))
    if program == "sglang-router":
        return [exe, "launch", *common, "--log-level", "info"]
    if program == "smg":
        # Run as the smg package, not the `smg` executable: sglang-router 0.3.2 installs an
        # executable of that name too (its own CLI), and whichever wheel pip installed last
        # owns it (a fresh venv got sglang-router's). smg loads a tokenizer per model unless
        # told not to; nothing may leave the bed.
        return [
            sys.executable,
            "-m",
            "smg",
            "launch",
            *common,
            "--disable-tokenizer-autoload",
            "--log-level",
            "info",
        ]
    return [exe, *common, "--log-level", "info"]


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
