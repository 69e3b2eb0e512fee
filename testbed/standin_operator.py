"""A stand-in for the gpustack operator, for tests and the demo only (never the product).

It creates, per ModelDeployment, the member Pods of every replica with the labels,
annotations and ``main`` container of SPEC section 2 (on the kwok node), one ordinary
Service and one headless Service per replica, and a router Pod when the deployment names
a router.  When a member Pod first becomes Ready it starts that Pod's engine emulator
(inside the bed's namespace, on the Pod's address) and sets the eligibility label on the
serving members, once.  It never deletes a Pod and never re-labels one: removing and
restoring the label is the product's business.  When a Pod disappears (the product
deleted it), its emulator is stopped, as a kubelet would stop the container.  A Pod
deleted with a grace period stays while its emulator runs the kubelet's termination
(preStop, SIGTERM, SIGKILL) and is removed when that process exits, as a kubelet removes
it (testbed/standin_termination.py).  With ``workloads``, each replica has its Kueue Workload
and Kueue's part is played too (testbed/standin_workloads.py): Kueue's finalizer holds a
deleted member until its group's Workload is deleted, and a deleted Workload stops its group.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from retirement.names import (
    ANNOTATION_PROM_PATH,
    ANNOTATION_PROM_PORT,
    ANNOTATION_PROM_SCHEME,
    APP_NAME,
    ENGINE_CONTAINER,
    GROUP,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_MEMBER_INDEX,
    LABEL_NAME,
    LABEL_ORDINAL,
    LABEL_ROLE_KIND,
    LABEL_ROUTER,
    PLURAL,
    VERSION,
)
from retirement.shape import MemberPod, read_shape, select_members
from testbed import jsonhttp
from testbed.controlplane import NODE_NAME
from testbed.standin_termination import EmulatedKubelet, PodTermination
from testbed.standin_workloads import PodGroupWorkloads

log = logging.getLogger(__name__)

SERVE_PORT = 8000
ROUTER_PORT = 30000
_metrics_ports = itertools.count(20000)


def member_name(md: str, role: str, ordinal: int, member: int, size: int) -> str:
    """The Pod name of one member."""
    return f"{md}-{role}-{ordinal}" if size == 1 else f"{md}-{role}-{ordinal}-{member}"


def router_pod_name(md: str) -> str:
    """The Pod name of a deployment's router."""
    return f"{md}-router"


@dataclass
class StandInOperator:
    """Reconciles ModelDeployments of one namespace into Pods, Services and emulators."""

    api: client.ApiClient
    namespace: str
    hub_url: str  # the emulator hub's control API, inside the bed's namespace
    request_seconds: float = 1.0
    #: The emulated SGLang's decode-step time (None: the emulator's default).
    step_seconds: float | None = None
    interval: float = 0.5
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _emulated: dict[str, str] = field(default_factory=dict)  # pod UID -> hub name
    _labelled: set[str] = field(default_factory=set)  # pod UIDs labelled once
    _lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)
    #: Each replica's Kueue Workload, as gpustack and Kueue make it (None: no Workloads).
    workloads: PodGroupWorkloads | None = None
    #: A preStop sleep and grace period on the member Pods (None: grace 0, no hook). The
    #: kubelet's part in a graceful deletion: testbed/standin_termination.py.
    termination: PodTermination | None = None
    _kubelet: EmulatedKubelet = field(default_factory=EmulatedKubelet)

    @property
    def core(self) -> client.CoreV1Api:
        """The core API."""
        return client.CoreV1Api(self.api)

    # ------------------------------------------------------------------ loop

    def start(self) -> StandInOperator:
        """Reconcile in a background thread until ``stop()``."""
        self._thread = threading.Thread(target=self._loop, name="standin-operator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop (Pods and emulators are left as they are)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile_once()
            except Exception as e:
                msg = f"{type(e).__name__}: {e}"
                if not self.errors or self.errors[-1] != msg:
                    self.errors.append(msg)
                    log.warning("stand-in operator: %s", msg)
            self._stop.wait(self.interval)

    # ------------------------------------------------------------------ reconcile

    def reconcile_once(self) -> None:
        """One level-based pass over every ModelDeployment and Pod of the namespace."""
        with self._lock:
            mds = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL
            )["items"]
            pods = self.core.list_namespaced_pod(
                self.namespace, label_selector=f"{LABEL_NAME}={APP_NAME}"
            ).items
            existing = {p.metadata.name for p in pods}
            for md in mds:
                self._ensure_objects(md, existing)
            self._sync_engines(pods, {m["metadata"]["name"]: m for m in mds})
            if self.workloads is not None:
                self.workloads.reconcile(pods)

    def _ensure_objects(self, md: dict[str, Any], existing: set[str]) -> None:
        name = md["metadata"]["name"]
        spec = md["spec"]
        engine = spec["engine"]["name"]
        self._ensure_service(
            name, {LABEL_INSTANCE: name, LABEL_ELIGIBLE: "true"}, headless=False, owner=md
        )
        for role in spec.get("roles", []):
            size = int(role.get("size", 1))
            for ordinal in range(int(role["replicas"])):
                self._ensure_service(
                    f"{name}-{role['name']}-{ordinal}",
                    {
                        LABEL_INSTANCE: name,
                        LABEL_COMPONENT: role["name"],
                        LABEL_ORDINAL: str(ordinal),
                    },
                    headless=True,
                    owner=md,
                )
                for member in range(size):
                    pod = member_name(name, role["name"], ordinal, member, size)
                    if pod not in existing:
                        self._create_member(md, role, ordinal, member, size, engine)
        router = spec.get("router") or {}
        if router.get("kind") and router_pod_name(name) not in existing:
            self._create_router(md, router["kind"])

    def _owner(self, md: dict[str, Any]) -> list[client.V1OwnerReference]:
        return [
            client.V1OwnerReference(
                api_version=f"{GROUP}/{VERSION}",
                kind="ModelDeployment",
                name=md["metadata"]["name"],
                uid=md["metadata"]["uid"],
            )
        ]

    def _ensure_service(
        self, name: str, selector: dict[str, str], *, headless: bool, owner: dict[str, Any]
    ) -> None:
        svc = client.V1Service(
            metadata=client.V1ObjectMeta(
                name=name,
                owner_references=self._owner(owner),
                labels={LABEL_INSTANCE: owner["metadata"]["name"]},
            ),
            spec=client.V1ServiceSpec(
                selector=selector,
                cluster_ip="None" if headless else None,
                publish_not_ready_addresses=True if headless else None,
                ports=[client.V1ServicePort(name="http", port=SERVE_PORT, target_port=SERVE_PORT)],
            ),
        )
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_service(self.namespace, svc)

    def _create_member(
        self,
        md: dict[str, Any],
        role: dict[str, Any],
        ordinal: int,
        member: int,
        size: int,
        engine: str,
    ) -> None:
        name = md["metadata"]["name"]
        labels = {
            LABEL_NAME: APP_NAME,
            LABEL_INSTANCE: name,
            LABEL_COMPONENT: role["name"],
            LABEL_ROLE_KIND: role.get("kind", "Server"),
            LABEL_ORDINAL: str(ordinal),
        }
        if size > 1:
            labels[LABEL_MEMBER_INDEX] = str(member)
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=member_name(name, role["name"], ordinal, member, size),
                labels=labels,
                annotations={
                    ANNOTATION_PROM_PORT: str(next(_metrics_ports)),
                    ANNOTATION_PROM_SCHEME: "http",
                    ANNOTATION_PROM_PATH: "/metrics",
                },
                owner_references=self._owner(md),
            ),
            spec=client.V1PodSpec(
                node_name=NODE_NAME,
                containers=[
                    client.V1Container(
                        name=ENGINE_CONTAINER,
                        image=f"emulated/{engine.lower()}:latest",
                        args=list(role.get("extraArgs") or []),
                        ports=[client.V1ContainerPort(name="http", container_port=SERVE_PORT)],
                    )
                ],
                termination_grace_period_seconds=0,
            ),
        )
        if self.workloads is not None:
            self.workloads.join(pod, md, role, ordinal)
        if self.termination is not None:
            self.termination.apply(pod)
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_pod(self.namespace, pod)

    def _create_router(self, md: dict[str, Any], kind: str) -> None:
        name = md["metadata"]["name"]
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=router_pod_name(name),
                labels={LABEL_INSTANCE: name, LABEL_ROUTER: kind},
                owner_references=self._owner(md),
            ),
            spec=client.V1PodSpec(
                node_name=NODE_NAME,
                containers=[
                    client.V1Container(
                        name="router",
                        image=f"emulated/{kind}:latest",
                        ports=[client.V1ContainerPort(name="http", container_port=ROUTER_PORT)],
                    )
                ],
                termination_grace_period_seconds=0,
            ),
        )
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_pod(self.namespace, pod)

    # ------------------------------------------------------------------ engines

    def _hub(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        return jsonhttp.call(self.hub_url + path, method, body)

    def _sync_engines(self, pods: list[client.V1Pod], mds: dict[str, dict[str, Any]]) -> None:
        live: set[str] = set()
        for pod in pods:
            uid = pod.metadata.uid
            live.add(uid)
            if pod.metadata.deletion_timestamp is not None:
                if uid in self._emulated:  # deleted with a grace period: end it as a kubelet
                    self._kubelet.observe(self.core, self._hub, pod, self._emulated[uid])
                continue
            if uid not in self._emulated and pod.status.pod_ip and _ready(pod):
                md = mds.get(pod.metadata.labels.get(LABEL_INSTANCE, ""))
                if md is None:
                    continue
                hub_name = f"{pod.metadata.name}.{uid[:8]}"
                self._hub(
                    "POST",
                    "/pods",
                    {
                        "name": hub_name,
                        "engine": md["spec"]["engine"]["name"],
                        "serve_host": pod.status.pod_ip,
                        "serve_port": SERVE_PORT,
                        "metrics_port": int(pod.metadata.annotations[ANNOTATION_PROM_PORT]),
                        "request_seconds": self.request_seconds,
                        # The engine reads its settings from the Pod's rendered command line
                        # (testbed/emulator/engine_args.py).
                        "args": _command_line(pod),
                        **(
                            {} if self.step_seconds is None else {"step_seconds": self.step_seconds}
                        ),
                    },
                )
                self._emulated[uid] = hub_name
            if uid in self._emulated and uid not in self._labelled:
                md = mds.get(pod.metadata.labels.get(LABEL_INSTANCE, ""))
                serving = None if md is None else self._serving(pod, pods, md)
                if serving:
                    self.core.patch_namespaced_pod(
                        pod.metadata.name,
                        self.namespace,
                        {"metadata": {"labels": {LABEL_ELIGIBLE: "true"}}},
                    )
                if serving is not None:  # decided (undecidable now: try again next pass)
                    self._labelled.add(uid)
        for uid in [u for u in self._emulated if u not in live]:
            with contextlib.suppress(Exception):
                self._hub("DELETE", f"/pods/{self._emulated[uid]}")
            del self._emulated[uid]
            self._labelled.discard(uid)

    def _serving(
        self, pod: client.V1Pod, pods: list[client.V1Pod], md: dict[str, Any]
    ) -> bool | None:
        labels = pod.metadata.labels
        role = next(
            (r for r in md["spec"].get("roles", []) if r["name"] == labels.get(LABEL_COMPONENT)),
            None,
        )
        if role is None:
            return False
        size = int(role.get("size", 1))
        shape = read_shape(
            engine=md["spec"]["engine"]["name"],
            role_kind=role.get("kind", ""),
            size=size,
            extra_args=role.get("extraArgs") or [],
            command=role.get("command"),
        )
        group = [
            MemberPod(name=p.metadata.name, uid=p.metadata.uid, labels=p.metadata.labels)
            for p in pods
            if p.metadata.labels.get(LABEL_INSTANCE) == labels.get(LABEL_INSTANCE)
            and p.metadata.labels.get(LABEL_COMPONENT) == labels.get(LABEL_COMPONENT)
            and p.metadata.labels.get(LABEL_ORDINAL) == labels.get(LABEL_ORDINAL)
            and p.metadata.deletion_timestamp is None
        ]
        if not all(_ready(p) for p in pods if p.metadata.name in {g.name for g in group}):
            return None
        sel = select_members(shape=shape, size=size, members=group)
        return sel.ok and pod.metadata.name in sel.measured

    def hub_pod(self, pod_uid: str) -> str | None:
        """The emulator name of a Pod (by UID), if it has one."""
        with self._lock:
            return self._emulated.get(pod_uid)


def _command_line(pod: client.V1Pod) -> list[str]:
    """The engine container's rendered command line: its ``command``, then its ``args``."""
    for container in pod.spec.containers or []:
        if container.name == ENGINE_CONTAINER:
            return [*(container.command or []), *(container.args or [])]
    return []


def _ready(pod: client.V1Pod) -> bool:
    for cond in pod.status.conditions or []:
        if cond.type == "Ready":
            return bool(cond.status == "True")
    return False
