"""The local Kubernetes control plane: etcd, kube-apiserver, kube-controller-manager, kwok.

Real binaries (built by ``testbed/build.sh``), real RBAC, real EndpointSlices, a kwok node
that runs ``pods/exec`` commands inside the bed's network namespace.  ``ControlPlane``
starts them in order, waits for each to be ready, and stops them all (and the namespace)
on ``stop()`` or at interpreter exit.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from testbed import netns
from testbed.ipam import READY_LINE
from testbed.paths import (
    REPO_ROOT,
    etcd_bin,
    k8s_bin,
    kueue_workload_crd,
    kwok_bin,
    kwok_stage_dir,
    missing_binaries,
)
from testbed.pki import Pki, make_pki
from testbed.procs import Child, free_port, port_open, reap_strays, wait_until

ADMIN_TOKEN = "bed-admin-token"
NODE_NAME = "kwok-node-0"
KWOK_NODE_PORT = 10250
CRD_PATH = REPO_ROOT / "deploy" / "crd-modeldeployment.yaml"
#: The CRDs every bed serves, by name: the product's, and Kueue's real Workload (the bed runs
#: no Kueue controller; ``testbed.standin_workloads`` plays its part for the tests).
CRDS = ("modeldeployments.worker.gpustack.ai", "workloads.kueue.x-k8s.io")
# What the API server records for the fault campaign's oracle (``chaos.audit``): every write
# to a Pod or a ModelDeployment (a delete's and a ModelDeployment write's answer carries the
# whole object: the deleted Pod's UID and labels, the spec as stored), and each pods/exec.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: RequestResponse
    verbs: ["delete", "deletecollection"]
    resources: [{group: "", resources: ["pods"]}]
  - level: Request
    verbs: ["patch", "update"]
    resources: [{group: "", resources: ["pods"]}]
  - level: Metadata
    verbs: ["create"]
    resources: [{group: "", resources: ["pods"]}]
  - level: Metadata
    resources: [{group: "", resources: ["pods/exec"]}]
  - level: RequestResponse
    verbs: ["create", "update", "patch", "delete"]
    resources: [{group: "worker.gpustack.ai", resources: ["modeldeployments"]}]
  - level: None
"""
STAGES = [
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/fast/pod-complete.yaml",
]
OWN_STAGES = [REPO_ROOT / "testbed" / "kwok" / n for n in ("pod-ready.yaml", "pod-delete.yaml")]


@dataclass
class ControlPlane:
    """A running local control plane."""

    state_dir: Path
    net: netns.BedNet = field(default_factory=netns.BedNet)
    api_port: int = 0
    etcd_port: int = 0
    children: list[Child] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def server(self) -> str:
        """The API server's address."""
        return f"https://{self.net.host_ip}:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        """A kubeconfig for the admin (``system:masters``)."""
        return self.state_dir / "kubeconfig"

    @property
    def pki(self) -> Pki:
        """The bed's key material."""
        return Pki(self.state_dir / "pki")

    def start(self) -> ControlPlane:
        """Start everything; raise with the failing component's log on error."""
        missing = missing_binaries()
        if missing:
            raise FileNotFoundError(
                "control-plane binaries are not built; run `make bins` (testbed/build.sh): "
                + ", ".join(map(str, missing))
            )
        t0 = time.monotonic()
        reap_strays()  # what a killed earlier run left running
        shutil.rmtree(self.state_dir, ignore_errors=True)  # every bed starts empty
        self.state_dir.mkdir(parents=True, exist_ok=True)
        netns.create(self.net)
        self._step("netns", t0)
        make_pki(self.state_dir / "pki", ips=[self.net.host_ip, "127.0.0.1"])
        self._step("pki", t0)
        etcd_port, etcd_peer = free_port(), free_port()
        self.etcd_port = etcd_port
        self._start_etcd(etcd_port, etcd_peer)
        self._step("etcd", t0)
        self.api_port = free_port(self.net.host_ip)
        self._start_apiserver(etcd_port)
        self._step("kube-apiserver", t0)
        self._write_kubeconfig()
        self._start_controller_manager()
        self._apply_file(CRD_PATH)
        with ThreadPoolExecutor(1) as pool:
            # The API server takes ~1.5 s over Kueue's 0.7 MB schema: meanwhile kwok starts.
            kueue = pool.submit(self._apply_file, kueue_workload_crd())
            self._create_node()
            self._start_ipam()
            self._start_kwok()
            self._step("kwok", t0)
            kueue.result()
        for crd in CRDS:
            self._wait_crd(crd)
        self._step("ready", t0)
        return self

    def stop(self) -> None:
        """Stop every component, newest first, and delete the network namespace."""
        for child in reversed(self.children):
            child.stop(timeout=10)
        self.children.clear()
        netns.destroy(self.net)

    # ------------------------------------------------------------ components

    def _step(self, name: str, t0: float) -> None:
        self.timings[name] = round(time.monotonic() - t0, 2)

    def _start_etcd(self, port: int, peer: int) -> None:
        data = self.state_dir / "etcd"
        child = Child(
            name="etcd",
            argv=[
                str(etcd_bin()),
                "--data-dir",
                str(data),
                "--listen-client-urls",
                f"http://127.0.0.1:{port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--unsafe-no-fsync",
                "--log-level",
                "warn",
            ],
            log_path=self.state_dir / "logs" / "etcd.log",
        )
        self.children.append(child)

        def healthy() -> bool:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                return bool(json.load(r).get("health") == "true")

        wait_until("etcd /health", healthy, timeout=60, child=child)

    @property
    def audit_log(self) -> Path:
        """The API server's audit log (JSON lines; see ``AUDIT_POLICY``)."""
        return self.state_dir / "logs" / "audit.log"

    def _audit_policy(self) -> Path:
        path = self.state_dir / "audit-policy.yaml"
        path.write_text(AUDIT_POLICY)
        return path

    def kill_apiserver(self) -> None:
        """kill -9 the kube-apiserver (a fault: the fault campaign starts it again with
        :meth:`restart_apiserver`)."""
        api = next(c for c in self.children if c.name == "kube-apiserver")
        api.kill()
        self.children.remove(api)

    def restart_apiserver(self) -> None:
        """Start the kube-apiserver again on its address and etcd, once it is ready (its
        audit log goes on in the same file)."""
        if any(c.name == "kube-apiserver" for c in self.children):
            raise RuntimeError("the kube-apiserver is running")
        self._start_apiserver(self.etcd_port)

    def _start_apiserver(self, etcd_port: int) -> None:
        pki = self.pki
        tokens = self.state_dir / "tokens.csv"
        tokens.write_text(f'{ADMIN_TOKEN},bed-admin,bed-admin-uid,"system:masters"\n')
        child = Child(
            name="kube-apiserver",
            argv=[
                str(k8s_bin("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                f"--cert-dir={self.state_dir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.server_cert}",
                f"--tls-private-key-file={pki.server_key}",
                f"--secure-port={self.api_port}",
                f"--bind-address={self.net.host_ip}",
                f"--advertise-address={self.net.host_ip}",
                "--endpoint-reconciler-type=none",
                f"--service-cluster-ip-range={self.net.service_cidr}",
                "--allow-privileged=true",
                "--authorization-mode=RBAC",
                f"--token-auth-file={tokens}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
                f"--audit-policy-file={self._audit_policy()}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=blocking",
                "--audit-log-maxbackup=0",
                "--v=0",
            ],
            log_path=self.state_dir / "logs" / "kube-apiserver.log",
        )
        self.children.append(child)
        wait_until(
            "kube-apiserver /readyz",
            lambda: self._get("/readyz") == "ok",
            timeout=120,
            child=child,
            interval=0.5,
        )

    def _start_controller_manager(self) -> None:
        child = Child(
            name="kube-controller-manager",
            argv=[
                str(k8s_bin("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                "--controllers=endpointslice,garbagecollector,namespace,serviceaccount",
                "--leader-elect=false",
                "--secure-port=0",
                "--concurrent-service-endpoint-syncs=5",
                "--endpointslice-updates-batch-period=0s",
                "--v=0",
            ],
            log_path=self.state_dir / "logs" / "kube-controller-manager.log",
        )
        self.children.append(child)

    def _start_ipam(self) -> None:
        """The Pod address allocator (kwok's own pool duplicates addresses: testbed/ipam.py)."""
        child = Child(
            name="ipam",
            argv=[
                sys.executable,
                "-m",
                "testbed.ipam",
                "--kubeconfig",
                str(self.kubeconfig),
                "--cidr",
                self.net.pod_cidr,
                "--node",
                NODE_NAME,
            ],
            log_path=self.state_dir / "logs" / "ipam.log",
            env=self._kwok_env(),
            cwd=REPO_ROOT,  # the bed is not installed: ``python -m`` finds it here
        )
        self.children.append(child)
        wait_until("ipam ready", lambda: READY_LINE in child.log_tail(), timeout=30, child=child)

    def _start_kwok(self) -> None:
        stage_dir = kwok_stage_dir()
        configs: list[str] = []
        for rel in STAGES:
            configs += ["--config", str(stage_dir / rel)]
        for own in OWN_STAGES:
            configs += ["--config", str(own)]
        exec_cfg = self.state_dir / "kwok-exec.yaml"
        exec_cfg.write_text(
            yaml.safe_dump_all([*hostile_execs(self.state_dir), self._exec_config()])
        )
        configs += ["--config", str(exec_cfg)]
        child = Child(
            name="kwok",
            argv=self.net.in_ns(
                [
                    str(kwok_bin()),
                    f"--kubeconfig={self.kubeconfig}",
                    "--manage-all-nodes=false",
                    "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                    # Unused: the bed's pod-ready stage takes no address from kwok's pool.
                    f"--cidr={self.net.pod_cidr}",
                    f"--node-ip={self.net.ns_ip}",
                    f"--node-name={NODE_NAME}",
                    f"--node-port={KWOK_NODE_PORT}",
                    f"--server-address={self.net.ns_ip}:{KWOK_NODE_PORT}",
                    *configs,
                ]
            ),
            log_path=self.state_dir / "logs" / "kwok.log",
            env=self._kwok_env(),
        )
        self.children.append(child)
        wait_until("kwok node Ready", self._node_ready, timeout=60, child=child)
        wait_until(
            "kwok kubelet port", lambda: self._ns_port_open(KWOK_NODE_PORT), timeout=30, child=child
        )

    def _kwok_env(self) -> dict[str, str]:
        env = dict(os.environ)
        # Exec'd commands find the bed's python3 (it carries prometheus_client, as the
        # engines' own images do) first on PATH; no proxy is ever used.
        env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
        for key in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            env.pop(key, None)
        return env

    def _exec_config(self) -> dict[str, Any]:
        """Every Pod's exec runs locally, inside the bed's namespace (after the hostile
        ones, which kwok matches first: ``hostile_execs``)."""
        return {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterExec",
            "metadata": {"name": "bed-exec"},
            "spec": {
                "execs": [
                    {
                        "local": {
                            "workDir": str(self.state_dir),
                            "envs": [{"name": "NO_PROXY", "value": "*"}],
                        }
                    }
                ]
            },
        }

    # ------------------------------------------------------------ helpers

    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.pki.ca_cert))

    def _get(self, path: str, *, accept: str | None = None) -> str:
        """GET ``path`` as the admin; the body as text (``accept``: the Accept header, for
        example a metadata-only list)."""
        return self._raw("GET", path, None, accept=accept).decode()

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A JSON request as the admin; the decoded answer."""
        return json.loads(self._raw(method, path, body) or b"null")

    def _raw(
        self, method: str, path: str, body: dict[str, Any] | None, *, accept: str | None = None
    ) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"}
        if accept:
            headers["Accept"] = accept
        req = urllib.request.Request(self.server + path, data=data, method=method, headers=headers)
        opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=self._ssl())
        )
        try:
            with opener.open(req, timeout=10) as resp:
                payload: bytes = resp.read()
                return payload
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{method} {path}: HTTP {e.code}: {e.read()[:2000]!r}") from e

    def _write_kubeconfig(self) -> None:
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "bed",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [{"name": "bed-admin", "user": {"token": ADMIN_TOKEN}}],
            "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": "bed-admin"}}],
            "current-context": "bed",
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg))

    def _apply_file(self, path: Path) -> None:
        # libyaml: Kueue's Workload CRD is 1.4 MB of YAML (0.8 s to parse in pure Python).
        for doc in yaml.load_all(path.read_text(), Loader=yaml.CSafeLoader):
            if doc and doc.get("kind") == "CustomResourceDefinition":
                self._request(
                    "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc
                )

    def _wait_crd(self, name: str) -> None:
        def established() -> bool:
            crd = self._request(
                "GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            )
            conds = {c["type"]: c["status"] for c in crd.get("status", {}).get("conditions", [])}
            return conds.get("Established") == "True"

        wait_until(f"CRD {name} established", established, timeout=30)

    def _create_node(self) -> None:
        self._request(
            "POST",
            "/api/v1/nodes",
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": NODE_NAME,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {"kubernetes.io/hostname": NODE_NAME, "type": "kwok"},
                },
                "spec": {},
            },
        )

    def _node_ready(self) -> bool:
        node = self._request("GET", f"/api/v1/nodes/{NODE_NAME}")
        conds = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        return conds.get("Ready") == "True"

    def _ns_port_open(self, port: int) -> bool:
        return port_open(self.net.ns_ip, port)


#: Pods whose ``python3`` is hostile (``testbed/hostile_python3/sitecustomize.py``): a Pod of
#: one of these names, in any namespace, runs its execs with that behaviour.
HOSTILE_EXECS = {
    "hostile-python3-flood-stdout": "flood-stdout",
    "hostile-python3-flood-stderr": "flood-stderr",
    "hostile-python3-hang": "hang",
}
HOSTILE_PYTHONPATH = Path(__file__).resolve().parent / "hostile_python3"


def hostile_execs(work_dir: Path) -> list[dict[str, Any]]:
    """kwok ClusterExecs for the ``HOSTILE_EXECS`` Pods: their ``python3`` imports the
    hostile ``sitecustomize`` first (``PYTHONPATH``), told what to do by
    ``BED_HOSTILE_PYTHON3``.  kwok takes the first ClusterExec whose selector matches."""
    return [
        {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "ClusterExec",
            "metadata": {"name": name},
            "spec": {
                "selector": {"matchNames": [name]},
                "execs": [
                    {
                        "local": {
                            "workDir": str(work_dir),
                            "envs": [
                                {"name": "NO_PROXY", "value": "*"},
                                {"name": "PYTHONPATH", "value": str(HOSTILE_PYTHONPATH)},
                                {"name": "BED_HOSTILE_PYTHON3", "value": mode},
                            ],
                        }
                    }
                ],
            },
        }
        for name, mode in HOSTILE_EXECS.items()
    ]


def hostile_exec_processes() -> list[int]:
    """The hostile ``python3`` processes running now (read from /proc: their environment
    carries ``BED_HOSTILE_PYTHON3``)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if any(v.startswith(b"BED_HOSTILE_PYTHON3=") for v in env.split(b"\0")):
            found.append(int(pid))
    return found


def kill_hostile_execs(timeout: float = 10.0) -> None:
    """Kill the hostile execs still running, as a kubelet would with their Pods' containers.
    kwok runs an exec as a process of its own host and leaves
    it when the Pod goes: measured, a flooding ``python3`` ran on through the next tests,
    kwok draining its output at about half a core."""
    pids = hostile_exec_processes()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while (left := hostile_exec_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        raise RuntimeError(f"hostile exec processes {left} outlived SIGKILL for {timeout:g} s")
