"""Typed, read-only views of the raw API bodies this project reads (Pods, Services,
EndpointSlices, Kueue Workloads).

They are built from the JSON the API server sends (camelCase keys), by the real client
and by the offline fake alike, so callers never touch an Optional-everywhere generated
model or a raw dict.  The API server validated these objects, so a missing field means
"not set"; a view never raises on one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from retirement.names import ENGINE_CONTAINER

ReadyStatus = Literal["True", "False", "Unknown"]


def _map(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _list(raw: Any) -> list[Any]:
    return list(raw) if isinstance(raw, list) else []


def _strings(raw: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _map(raw).items() if v is not None}


def _int(raw: Any, default: int = 0) -> int:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else default


@dataclass(frozen=True)
class ObjectRef:
    """What an Event is about (``involvedObject``)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


@dataclass(frozen=True)
class ContainerPort:
    """One declared container port."""

    container_port: int
    name: str | None = None


class EnvVar(NamedTuple):
    """One ``env`` entry of a container: its name and its literal value, or None when the
    value is not a literal (``valueFrom``: the kubelet resolves it where the Pod runs)."""

    name: str
    value: str | None


def env_vars(raw: Any) -> tuple[EnvVar, ...]:
    """A raw ``env`` list as entries, in order (a later entry of a name wins, as in the
    container).  Tolerant: an entry with no string name is not an entry; a value that is
    not a string, or one given through ``valueFrom``, is not a literal."""
    out: list[EnvVar] = []
    for e in map(_map, _list(raw)):
        name = e.get("name")
        if not isinstance(name, str) or not name:
            continue
        value = e.get("value")
        if e.get("valueFrom") is not None or not isinstance(value, str | None):
            out.append(EnvVar(name, None))
        else:
            out.append(EnvVar(name, value or ""))
    return tuple(out)


@dataclass(frozen=True)
class Container:
    """One container of a Pod's spec: what it runs (``command`` then ``args``; no command:
    the image's entrypoint runs the args), its environment, and which ports it declares."""

    name: str
    args: tuple[str, ...] = ()
    ports: tuple[ContainerPort, ...] = ()
    command: tuple[str, ...] = ()
    env: tuple[EnvVar, ...] = ()


@dataclass(frozen=True)
class ContainerStatus:
    """One container's identity in a Pod's status (empty ID: not started)."""

    name: str
    container_id: str = ""
    restart_count: int = 0


@dataclass(frozen=True)
class Pod:
    """A Pod as this project reads it."""

    name: str
    namespace: str
    uid: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False  # metadata.deletionTimestamp is set
    pod_ip: str | None = None
    containers: tuple[Container, ...] = ()
    container_statuses: tuple[ContainerStatus, ...] = ()
    conditions: Mapping[str, str] = field(default_factory=dict)  # type -> status
    #: ``status.podIPs`` (every address of the Pod, one per family), ``pod_ip`` first.
    pod_ips: tuple[str, ...] = ()
    #: ``metadata.resourceVersion`` as read ("" when absent): a patch may be bound to it.
    #: Not compared: two views of the same Pod are equal whatever wrote in between (the
    #: watcher's change detection compares what the product reads, not the version).
    resource_version: str = field(default="", compare=False)

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Pod:
        """The view of one Pod body."""
        meta, spec, status = (
            _map(raw.get("metadata")),
            _map(raw.get("spec")),
            _map(raw.get("status")),
        )
        containers = tuple(
            Container(
                name=str(c.get("name") or ""),
                args=tuple(str(a) for a in _list(c.get("args"))),
                command=tuple(str(a) for a in _list(c.get("command"))),
                env=env_vars(c.get("env")),
                ports=tuple(
                    ContainerPort(
                        container_port=_int(p.get("containerPort")),
                        name=None if p.get("name") is None else str(p["name"]),
                    )
                    for p in map(_map, _list(c.get("ports")))
                ),
            )
            for c in map(_map, _list(spec.get("containers")))
        )
        statuses = tuple(
            ContainerStatus(
                name=str(s.get("name") or ""),
                container_id=str(s.get("containerID") or ""),
                restart_count=_int(s.get("restartCount")),
            )
            for s in map(_map, _list(status.get("containerStatuses")))
        )
        conditions: dict[str, str] = {}
        for c in map(_map, _list(status.get("conditions"))):
            if c.get("type") is not None and str(c["type"]) not in conditions:
                conditions[str(c["type"])] = str(c.get("status"))
        pod_ip = str(status["podIP"]) if status.get("podIP") else None
        ips = [pod_ip] if pod_ip else []
        for entry in map(_map, _list(status.get("podIPs"))):
            if entry.get("ip") and str(entry["ip"]) not in ips:
                ips.append(str(entry["ip"]))
        return cls(
            name=str(meta.get("name") or ""),
            namespace=str(meta.get("namespace") or ""),
            uid=str(meta.get("uid") or ""),
            labels=_strings(meta.get("labels")),
            annotations=_strings(meta.get("annotations")),
            terminating=meta.get("deletionTimestamp") is not None,
            pod_ip=pod_ip,
            containers=containers,
            container_statuses=statuses,
            conditions=conditions,
            pod_ips=tuple(ips),
            resource_version=str(meta.get("resourceVersion") or ""),
        )

    def container(self, name: str) -> Container | None:
        """The spec of container ``name``, if the Pod has one."""
        return next((c for c in self.containers if c.name == name), None)

    def container_status(self, name: str) -> ContainerStatus | None:
        """The status of container ``name``, if reported."""
        return next((s for s in self.container_statuses if s.name == name), None)

    @property
    def engine_started(self) -> bool:
        """Whether the engine ever ran: ``main`` has a container ID (the kubelet sets it when
        it creates the container and keeps it across restarts), or the Pod claims to be
        Ready (then a missing ID is an inconsistency, not proof that nothing runs)."""
        status = self.container_status(ENGINE_CONTAINER)
        return (status is not None and bool(status.container_id)) or self.conditions.get(
            "Ready"
        ) == "True"


def pod_ready(pod: Pod) -> ReadyStatus:
    """The Pod's ``Ready`` condition: "True", "False", or "Unknown" (also when absent)."""
    status = pod.conditions.get("Ready")
    return status if status in ("True", "False") else "Unknown"  # type: ignore[return-value]


@dataclass(frozen=True)
class Service:
    """A Service: its selector, and whether it is headless."""

    name: str
    selector: Mapping[str, str] = field(default_factory=dict)
    cluster_ip: str | None = None

    @property
    def headless(self) -> bool:
        """``clusterIP: None``: per-replica headless Services do not route traffic."""
        return self.cluster_ip == "None"

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Service:
        """The view of one Service body."""
        spec = _map(raw.get("spec"))
        ip = spec.get("clusterIP")
        return cls(
            name=str(_map(raw.get("metadata")).get("name") or ""),
            selector=_strings(spec.get("selector")),
            cluster_ip=None if ip is None else str(ip),
        )


#: The label naming the Service that owns an EndpointSlice.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of an EndpointSlice: its addresses and what it points at."""

    addresses: tuple[str, ...] = ()
    target_kind: str = ""  # targetRef.kind ("Pod" for selector-managed slices)
    target_name: str = ""
    target_uid: str = ""  # targetRef.uid
    ready: bool | None = None  # conditions.ready (None: not reported)


@dataclass(frozen=True)
class EndpointPort:
    """One port of an EndpointSlice."""

    port: int | None = None
    name: str | None = None
    protocol: str = "TCP"


@dataclass(frozen=True)
class EndpointSlice:
    """An EndpointSlice: every address it lists, its endpoints (with their ``targetRef``),
    its ports, and the Service that owns it (``kubernetes.io/service-name``; "" when none)."""

    name: str
    addresses: tuple[str, ...] = ()
    service: str = ""
    endpoints: tuple[Endpoint, ...] = ()
    ports: tuple[EndpointPort, ...] = ()

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> EndpointSlice:
        """The view of one EndpointSlice body."""
        meta = _map(raw.get("metadata"))
        endpoints = []
        for e in map(_map, _list(raw.get("endpoints"))):
            ref = _map(e.get("targetRef"))
            ready = _map(e.get("conditions")).get("ready")
            endpoints.append(
                Endpoint(
                    addresses=tuple(str(a) for a in _list(e.get("addresses"))),
                    target_kind=str(ref.get("kind") or ""),
                    target_name=str(ref.get("name") or ""),
                    target_uid=str(ref.get("uid") or ""),
                    ready=ready if isinstance(ready, bool) else None,
                )
            )
        ports = tuple(
            EndpointPort(
                port=p["port"] if isinstance(p.get("port"), int) else None,
                name=None if p.get("name") is None else str(p["name"]),
                protocol=str(p.get("protocol") or "TCP"),
            )
            for p in map(_map, _list(raw.get("ports")))
        )
        return cls(
            name=str(meta.get("name") or ""),
            addresses=tuple(a for e in endpoints for a in e.addresses),
            service=_strings(meta.get("labels")).get(SERVICE_NAME_LABEL, ""),
            endpoints=tuple(endpoints),
            ports=ports,
        )

    def listing(self, addresses: Collection[str], uids: Collection[str]) -> list[str]:
        """What of a member this slice lists: each of ``addresses`` it lists, and
        ``targetRef <uid>`` for an endpoint whose ``targetRef.uid`` is one of ``uids``
        (whatever address it carries)."""
        found: list[str] = []
        for e in self.endpoints:
            for a in e.addresses:
                if a in addresses and a not in found:
                    found.append(a)
            if e.target_uid and e.target_uid in uids:
                ref = f"targetRef {e.target_uid}"
                if ref not in found:
                    found.append(ref)
        return found


@dataclass(frozen=True)
class OwnerRef:
    """One ``ownerReferences`` entry."""

    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class Workload:
    """A Kueue Workload: its identity and owners."""

    name: str
    uid: str
    owners: tuple[OwnerRef, ...] = ()

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> Workload:
        """The view of one Workload body."""
        meta = _map(raw.get("metadata"))
        return cls(
            name=str(meta.get("name") or ""),
            uid=str(meta.get("uid") or ""),
            owners=tuple(
                OwnerRef(
                    kind=str(o.get("kind") or ""),
                    name=str(o.get("name") or ""),
                    uid=str(o.get("uid") or ""),
                )
                for o in map(_map, _list(meta.get("ownerReferences")))
            ),
        )
