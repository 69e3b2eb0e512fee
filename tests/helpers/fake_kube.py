"""``FakeKube``: an in-memory API server behind ``kube.api.KubeApi``, for offline tests of
the activities and the watcher's reconcile.

It keeps raw bodies (camelCase JSON, as the API server does) and answers with the same
typed views as the real client, and it is faithful where the product's safety rests:

- JSON patches (RFC 6902) are applied atomically with the API server's semantics
  (evanphx/json-patch): a ``test`` of a missing key with ``null`` passes, a failed ``test``
  or a ``remove`` of a missing key is ``Invalid`` (HTTP 422) and changes nothing;
- a patch that leaves a label the API server's validation refuses (key or value syntax,
  length) is ``Invalid`` (HTTP 422) and changes nothing;
- deletes carry UID preconditions (``Conflict`` on another UID), reads of a missing
  object are ``NotFound``; a Pod with finalizers is not removed by its delete but marked
  (``deletionTimestamp``: terminating) until they are taken off (``remove_finalizers``),
  and deleting it again is answered, not refused;
- merge patches (RFC 7386) with a ``metadata.resourceVersion`` are optimistic
  (``Conflict`` when stale), every write bumps the resourceVersion;
- a ModelDeployment write keeps only what the CRD's structural schema knows (``prune``:
  fields it does not name are dropped, unless preserved there);
- Events of an existing name are ``Conflict``; Workloads are ``NotFound`` when Kueue is
  "not installed".

Each of these strictnesses has its twin against the real API server
(``tests/bed/test_fake_kube_twin_on_bed.py``: the same calls, the same answers).

EndpointSlices are what a test sets (``set_endpoints``, ``add_endpoint_slice``) or what one
pass of the EndpointSlice controller derives from the Services and Pods
(``sync_endpoint_slices``): between passes they lag, as the real controller's do.

Exec results are scripted per Pod (``script_exec``); any call can be made to fail
(``fail``); every call is recorded (``calls``).
"""

from __future__ import annotations

import copy
import functools
import itertools
import re
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kube.api import ExecResult
from kube.errors import Conflict, Invalid, KubeError, NotFound
from kube.objects import EndpointSlice, Pod, Service, Workload
from retirement.names import (
    APP_NAME,
    ENGINE_CONTAINER,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_MEMBER_INDEX,
    LABEL_NAME,
    LABEL_ORDINAL,
)
from retirement.readings import series_for

__all__ = [
    "Call",
    "FakeKube",
    "apply_json_patch",
    "apply_merge_patch",
    "matches",
    "member_pod",
    "oneshot_stdout",
]

Key = tuple[str, str]
ExecScript = ExecResult | Callable[[list[str]], ExecResult]
_MISSING = object()


def _endpoint(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The endpoint the EndpointSlice controller writes for ``pod``."""
    meta, status = pod["metadata"], pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    terminating = meta.get("deletionTimestamp") is not None
    out: dict[str, Any] = {
        "addresses": [status["podIP"]],
        "conditions": {
            "ready": ready and not terminating,
            "serving": ready,
            "terminating": terminating,
        },
        "targetRef": {
            "kind": "Pod",
            "namespace": meta["namespace"],
            "name": meta["name"],
            "uid": meta.get("uid", ""),
        },
    }
    node = (pod.get("spec") or {}).get("nodeName")
    if node:
        out["nodeName"] = node
    return out


# ---------------------------------------------------------------- the CRD's pruning


@functools.cache
def crd_schema() -> dict[str, Any]:
    """The ModelDeployment CRD's structural schema (``deploy/crd-modeldeployment.yaml``, the
    one the bed installs)."""
    path = Path(__file__).resolve().parents[2] / "deploy" / "crd-modeldeployment.yaml"
    crd = yaml.safe_load(path.read_text())
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def prune(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` as the API server stores it under a structural ``schema``: an object's
    fields the schema does not name are dropped, unless it preserves unknown fields
    (``x-kubernetes-preserve-unknown-fields``); known fields, ``additionalProperties`` and
    array items are pruned by their own schemas."""
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields") is True
        out = {}
        for k, v in value.items():
            if k in props:
                out[k] = prune(v, props[k])
            elif isinstance(extra, dict):
                out[k] = prune(v, extra)
            elif keep or extra is True:
                out[k] = v
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in value]
    return value


# ---------------------------------------------------------------- JSON patch (RFC 6902)


class PatchError(Exception):
    """The patch does not apply (the API server answers 422)."""


def _decode(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    """The container of ``path`` and the last token, as evanphx's ``findObject``."""
    if not path.startswith("/"):
        raise PatchError(f"path {path!r} is not a JSON pointer")
    tokens = [_decode(t) for t in path.split("/")[1:]]
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and isinstance(node.get(token), dict | list):
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise PatchError(f"doc is missing path {path!r}")
    return node, tokens[-1]


def _get(container: Any, key: str) -> Any:
    if isinstance(container, dict):
        return container.get(key, _MISSING)
    if key.isdigit() and int(key) < len(container):
        return container[int(key)]
    raise PatchError(f"invalid index {key!r}")


def apply_json_patch(doc: dict[str, Any], ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``doc`` with ``ops`` applied (a new object); raises PatchError, leaving ``doc`` as is."""
    out = copy.deepcopy(doc)
    for op in ops:
        kind, path = op.get("op"), op.get("path")
        if not isinstance(path, str):
            raise PatchError("operation missing path")
        container, key = _parent(out, path)
        if kind == "test":
            current = _get(container, key)
            expected = op.get("value")
            if current is _MISSING or current is None:
                if expected is not None:
                    raise PatchError(f"testing value {path} failed")
            elif current != expected:
                raise PatchError(f"testing value {path} failed")
        elif kind in ("add", "replace"):
            if "value" not in op:
                raise PatchError(f"{kind} without a value")
            if isinstance(container, dict):
                if kind == "replace" and key not in container:
                    raise PatchError(f"replace: doc is missing key {path}")
                container[key] = copy.deepcopy(op["value"])
            elif key == "-" and kind == "add":
                container.append(copy.deepcopy(op["value"]))
            elif key.isdigit() and int(key) <= len(container):
                if kind == "add":
                    container.insert(int(key), copy.deepcopy(op["value"]))
                else:
                    container[int(key)] = copy.deepcopy(op["value"])
            else:
                raise PatchError(f"invalid index {key!r}")
        elif kind == "remove":
            if isinstance(container, dict):
                if key not in container:
                    raise PatchError(f"Unable to remove nonexistent key: {key}")
                del container[key]
            elif key.isdigit() and int(key) < len(container):
                del container[int(key)]
            else:
                raise PatchError(f"invalid index {key!r}")
        else:
            raise PatchError(f"unexpected kind: {kind}")
    return out


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge, ``null`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


# ---------------------------------------------------------------- label selectors


_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_errors(labels: Mapping[str, Any]) -> list[str]:
    """What the API server's validation says of these labels (apimachinery's
    ``ValidateLabels``: a key is an optional DNS-subdomain prefix of at most 253
    characters and ``/``, then a name of 1-63; a value is a string of at most 63, empty
    or alphanumeric at both ends with ``-_.`` inside); empty when they are valid."""
    out = []
    for key, value in labels.items():
        prefix, _, name = key.rpartition("/")
        if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
            out.append(f"metadata.labels: Invalid value: {key!r}: prefix part")
        if not name or len(name) > 63 or not _LABEL_NAME.match(name):
            out.append(f"metadata.labels: Invalid value: {key!r}: name part")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_NAME.match(value):
            out.append(f"metadata.labels: Invalid value: {value!r}")
    return out


def matches(labels: Mapping[str, str], selector: str) -> bool:
    """Whether ``labels`` satisfy an equality-based label selector
    (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, comma-separated)."""
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


# ---------------------------------------------------------------- builders


def member_pod(
    name: str,
    *,
    deployment: str,
    role: str = "server",
    ordinal: int = 0,
    member: int | None = None,
    namespace: str = "default",
    uid: str | None = None,
    ip: str = "198.18.1.10",
    eligible: bool = True,
    ready: str | None = "True",
    container_id: str | None = "containerd://main-1",
    restart_count: int = 0,
    role_kind: str | None = None,
    metrics_port: str | None = "8000",
    serve_port: int | None = 8000,
    args: Sequence[str] = (),
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The raw body of one member Pod as the gpustack operator labels it (SPEC section 2)."""
    all_labels = {
        LABEL_NAME: APP_NAME,
        LABEL_INSTANCE: deployment,
        LABEL_COMPONENT: role,
        LABEL_ORDINAL: str(ordinal),
    }
    if member is not None:
        all_labels[LABEL_MEMBER_INDEX] = str(member)
    if role_kind is not None:
        all_labels["modeldeployment.gpustack.ai/role-kind"] = role_kind
    if eligible:
        all_labels[LABEL_ELIGIBLE] = "true"
    all_labels.update(labels or {})
    annotations = {} if metrics_port is None else {"prometheus.io/port": metrics_port}
    container: dict[str, Any] = {"name": ENGINE_CONTAINER, "args": list(args)}
    if serve_port is not None:
        container["ports"] = [{"name": "http", "containerPort": serve_port}]
    status: dict[str, Any] = {"podIP": ip}
    if ready is not None:
        status["conditions"] = [{"type": "Ready", "status": ready}]
    if container_id is not None:
        status["containerStatuses"] = [
            {"name": ENGINE_CONTAINER, "containerID": container_id, "restartCount": restart_count}
        ]
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": all_labels,
        "annotations": annotations,
    }
    if uid is not None:
        metadata["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [container]},
        "status": status,
    }


def oneshot_stdout(
    engine: str = "vLLM",
    *,
    in_flight: float = 0.0,
    counters: Sequence[float] = (0.0, 0.0),
    version: str = "",
    exact: int | None = None,
) -> str:
    """What the drain one-shot (``activities.oneshot``) prints for one read of ``engine`` at
    ``version``: the first gauge carries ``in_flight`` (the others 0), then each counter
    (``counters`` padded with 0 to the count ``series_for`` gives), then, with ``exact``,
    the engine's request count (``#load``), then ``#end``."""
    series = series_for(engine, version)
    assert series is not None, engine
    values = list(counters) + [0.0] * (len(series.counters) - len(counters))
    lines = [f"{g}\t{float(in_flight) if i == 0 else 0.0!r}" for i, g in enumerate(series.gauges)]
    lines += [f"{c}\t{float(v)!r}" for c, v in zip(series.counters, values, strict=False)]
    if exact is not None:
        lines.append(f"#load\t{exact}")
    return "\n".join([*lines, "#end"]) + "\n"


# ---------------------------------------------------------------- the fake


@dataclass(frozen=True)
class Call:
    """One recorded call: the method and its keyword arguments."""

    method: str
    args: dict[str, Any]


class FakeKube:
    """An in-memory cluster satisfying ``kube.api.KubeApi`` (thread-safe)."""

    def __init__(self, *, kueue_installed: bool = True) -> None:
        self.kueue_installed = kueue_installed
        self.pods: dict[Key, dict[str, Any]] = {}
        self.deployments: dict[Key, dict[str, Any]] = {}
        self.services: dict[Key, dict[str, Any]] = {}
        self.endpoint_slices: dict[Key, dict[str, Any]] = {}
        self.workloads: dict[Key, dict[str, Any]] = {}
        self.events: dict[Key, dict[str, Any]] = {}
        self.calls: list[Call] = []
        self._exec: dict[Key, deque[ExecScript]] = {}
        self._failures: dict[str, deque[KubeError]] = {}
        self._lock = threading.RLock()
        self._rv = itertools.count(1)
        self._uids = itertools.count(1)
        #: Every change of a Pod or a ModelDeployment, in order, as a watch delivers it:
        #: ``(resourceVersion, resource, event type, the body as of that change)``.  A
        #: watch from a version older than ``compacted_to`` is answered 410 Gone.
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.compacted_to = 0

    # ------------------------------------------------------------ setting up

    def _stamp(self, body: dict[str, Any], kind: str) -> dict[str, Any]:
        body = copy.deepcopy(body)
        meta = body.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"{kind}-uid-{next(self._uids)}")
        meta["resourceVersion"] = str(next(self._rv))
        return body

    @staticmethod
    def _key(body: Mapping[str, Any]) -> Key:
        return body["metadata"]["namespace"], body["metadata"]["name"]

    def _record(self, resource: str, kind: str, body: dict[str, Any]) -> None:
        """One change, in the history watches read (``body`` as stored after it)."""
        snap = copy.deepcopy(body)
        if kind == "DELETED":  # the deletion has a version of its own
            snap["metadata"]["resourceVersion"] = str(next(self._rv))
        self.history.append((int(snap["metadata"]["resourceVersion"]), resource, kind, snap))

    def _replace(
        self, resource: str, store: dict[Key, dict[str, Any]], body: dict[str, Any]
    ) -> None:
        """Store a created (or re-created) object: a replaced one is deleted first."""
        key = self._key(body)
        old = store.get(key)
        if old is not None:
            self._record(resource, "DELETED", old)
            self._bump(body)  # created after the deletion
        store[key] = body
        self._record(resource, "ADDED", body)

    def _remove_pod(self, key: Key) -> None:
        pod = self.pods.pop(key, None)
        if pod is not None:
            self._record("pods", "DELETED", pod)

    @property
    def resource_version(self) -> str:
        """The store's current version (a listing's ``resourceVersion``)."""
        with self._lock:
            return str(self.history[-1][0]) if self.history else str(self.compacted_to)

    def compact(self) -> None:
        """Forget the history so far (etcd's compaction): older watches get 410 Gone."""
        with self._lock:
            if self.history:
                self.compacted_to = self.history[-1][0]
            self.history.clear()

    def add_pod(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (or replace, with a fresh UID unless one is given) a Pod."""
        with self._lock:
            stored = self._stamp(body, "pod")
            self._replace("pods", self.pods, stored)
            return copy.deepcopy(stored)

    def add_deployment(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create (or replace) a ModelDeployment."""
        with self._lock:
            stored = self._stamp(body, "md")
            stored["metadata"].setdefault("generation", 1)
            self._replace("modeldeployments", self.deployments, stored)
            return copy.deepcopy(stored)

    def add_service(
        self,
        name: str,
        *,
        selector: Mapping[str, str],
        namespace: str = "default",
        headless: bool = False,
        ports: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """Create a Service (``clusterIP: None`` when ``headless``)."""
        with self._lock:
            spec: dict[str, Any] = {
                "selector": dict(selector),
                "clusterIP": "None" if headless else "198.18.2.10",
            }
            if ports:
                spec["ports"] = [dict(p) for p in ports]
            self.services[(namespace, name)] = self._stamp(
                {"metadata": {"name": name, "namespace": namespace}, "spec": spec}, "svc"
            )

    def set_endpoints(
        self,
        service: str,
        addresses: Sequence[str],
        *,
        namespace: str = "default",
        target_uids: Sequence[str | None] | None = None,
        ports: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """The one EndpointSlice of ``service`` now lists ``addresses`` (each endpoint with
        a Pod ``targetRef`` of the same position's UID in ``target_uids``, when given)."""
        uids = list(target_uids) if target_uids is not None else [None] * len(addresses)
        self.add_endpoint_slice(
            f"{service}-slice",
            service=service,
            endpoints=[
                {"addresses": [a]} | ({"targetRef": {"kind": "Pod", "uid": u}} if u else {})
                for a, u in zip(addresses, uids, strict=True)
            ],
            namespace=namespace,
            ports=ports,
        )

    def add_endpoint_slice(
        self,
        name: str,
        *,
        service: str | None,
        endpoints: Sequence[Mapping[str, Any]],
        namespace: str = "default",
        ports: Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        """Create (or replace) an EndpointSlice with raw ``endpoints``, owned by ``service``
        (the ``kubernetes.io/service-name`` label; None: no owning Service)."""
        with self._lock:
            meta: dict[str, Any] = {"name": name, "namespace": namespace}
            if service is not None:
                meta["labels"] = {"kubernetes.io/service-name": service}
            body: dict[str, Any] = {
                "metadata": meta,
                "addressType": "IPv4",
                "endpoints": [dict(e) for e in endpoints],
            }
            if ports is not None:
                body["ports"] = [dict(p) for p in ports]
            self.endpoint_slices[(namespace, name)] = self._stamp(body, "slice")

    def sync_endpoint_slices(self, *, namespace: str = "default") -> None:
        """One pass of the EndpointSlice controller over ``namespace``: each Service with a
        selector gets one slice (``<service>-slice``) listing the Pods it selects, as the
        real controller does (``pkg/controller/endpointslice``, ``ShouldPodBeInEndpoints``
        with terminating Pods included, ``podEndpointChanged``'s conditions): a Pod with an
        address and not Succeeded or Failed; ``ready`` when its Ready condition is True
        and it is not terminating, ``serving`` when Ready, ``terminating`` when marked
        for deletion; a ``targetRef`` to the Pod.  Until a test calls this, the slices lag
        behind the Pods (as the controller lags behind a label change).  Twin:
        ``tests/bed/test_fake_kube_twin_on_bed.py``."""
        with self._lock:
            for (ns, name), svc in list(self.services.items()):
                selector = svc["spec"].get("selector")
                if ns != namespace or not selector:
                    continue
                wanted = ",".join(f"{k}={v}" for k, v in selector.items())
                endpoints = [
                    _endpoint(p)
                    for (p_ns, _), p in sorted(self.pods.items())
                    if p_ns == ns
                    and matches(p["metadata"].get("labels") or {}, wanted)
                    and (p.get("status") or {}).get("podIP")
                    and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                ]
                ports = [
                    {
                        "name": sp.get("name", ""),
                        "port": sp.get("targetPort", sp.get("port")),
                        "protocol": sp.get("protocol", "TCP"),
                    }
                    for sp in svc["spec"].get("ports") or []
                ]
                self.add_endpoint_slice(
                    f"{name}-slice", service=name, endpoints=endpoints, namespace=ns, ports=ports
                )

    def add_workload(
        self,
        name: str,
        *,
        owners: Sequence[tuple[str, str]],
        namespace: str = "default",
        uid: str | None = None,
    ) -> dict[str, Any]:
        """Create a Kueue Workload owned by ``(kind, uid)`` pairs."""
        with self._lock:
            meta: dict[str, Any] = {
                "name": name,
                "namespace": namespace,
                "ownerReferences": [
                    {"kind": kind, "name": f"{kind.lower()}-{o_uid}", "uid": o_uid}
                    for kind, o_uid in owners
                ],
            }
            if uid is not None:
                meta["uid"] = uid
            stored = self._stamp({"metadata": meta}, "workload")
            self.workloads[(namespace, name)] = stored
            return copy.deepcopy(stored)

    def script_exec(self, pod: str, *results: ExecScript, namespace: str = "default") -> None:
        """Queue what the next execs into ``pod`` answer (the last one repeats)."""
        with self._lock:
            self._exec.setdefault((namespace, pod), deque()).extend(results)

    def fail(self, method: str, error: KubeError, *, times: int = 1) -> None:
        """Make the next ``times`` calls of ``method`` raise ``error``."""
        with self._lock:
            self._failures.setdefault(method, deque()).extend([error] * times)

    def remove_pod(self, name: str, *, namespace: str = "default") -> None:
        """The Pod disappears (as if its deletion completed)."""
        with self._lock:
            self._remove_pod((namespace, name))

    def edit_pod(
        self, name: str, edit: Callable[[dict[str, Any]], object], *, namespace: str = "default"
    ) -> None:
        """Another writer changes a stored Pod's body in place (``edit``); the
        resourceVersion moves, the UID stays, watches see it."""
        with self._lock:
            pod = self.pods[(namespace, name)]
            edit(pod)
            self._bump(pod)
            self._record("pods", "MODIFIED", pod)

    def remove_deployment(self, name: str, *, namespace: str = "default") -> None:
        """The ModelDeployment disappears (as if its deletion completed)."""
        with self._lock:
            md = self.deployments.pop((namespace, name), None)
            if md is not None:
                self._record("modeldeployments", "DELETED", md)

    def remove_finalizers(self, name: str, *, namespace: str = "default") -> None:
        """Another writer takes a Pod's finalizers off: one marked for deletion goes."""
        with self._lock:
            pod = self.pods[(namespace, name)]
            pod["metadata"].pop("finalizers", None)
            if pod["metadata"].get("deletionTimestamp") is not None:
                self._remove_pod((namespace, name))
            else:
                self._bump(pod)
                self._record("pods", "MODIFIED", pod)

    def set_label(
        self, name: str, key: str, value: str | None, *, namespace: str = "default"
    ) -> None:
        """Another writer sets (``None``: removes) one label of a stored Pod; the
        resourceVersion moves, the UID stays."""
        with self._lock:
            meta = self.pods[(namespace, name)]["metadata"]
            labels = meta.setdefault("labels", {})
            if value is None:
                labels.pop(key, None)
            else:
                labels[key] = value
            self._bump(self.pods[(namespace, name)])
            self._record("pods", "MODIFIED", self.pods[(namespace, name)])

    def pod_labels(self, name: str, *, namespace: str = "default") -> dict[str, str]:
        """The stored labels of a Pod (for assertions)."""
        with self._lock:
            return dict(self.pods[(namespace, name)]["metadata"].get("labels") or {})

    def called(self, method: str) -> list[Call]:
        """The recorded calls of ``method``."""
        with self._lock:
            return [c for c in self.calls if c.method == method]

    # ------------------------------------------------------------ plumbing

    def _enter(self, method: str, **args: Any) -> None:
        self.calls.append(Call(method, copy.deepcopy(args)))
        queue = self._failures.get(method)
        if queue:
            raise queue.popleft()

    @staticmethod
    def _found(store: dict[Key, dict[str, Any]], key: Key, what: str) -> dict[str, Any]:
        if key not in store:
            raise NotFound(f"read {what} {key[0]}/{key[1]}", status=404, reason="Not Found")
        return store[key]

    def _bump(self, body: dict[str, Any]) -> None:
        body["metadata"]["resourceVersion"] = str(next(self._rv))

    # ------------------------------------------------------------ ModelDeployments

    def get_deployment(self, *, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            self._enter("get_deployment", namespace=namespace, name=name)
            return copy.deepcopy(
                self._found(self.deployments, (namespace, name), "ModelDeployment")
            )

    def list_deployments(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            self._enter("list_deployments", namespace=namespace)
            return [
                copy.deepcopy(b)
                for (ns, _), b in sorted(self.deployments.items())
                if namespace is None or ns == namespace
            ]

    def _merge(
        self, method: str, namespace: str, name: str, patch: dict[str, Any], *, status: bool
    ) -> dict[str, Any]:
        with self._lock:
            self._enter(method, namespace=namespace, name=name, patch=patch)
            md = self._found(self.deployments, (namespace, name), "ModelDeployment")
            rv = (patch.get("metadata") or {}).get("resourceVersion")
            uid = (patch.get("metadata") or {}).get("uid")
            if uid is not None and uid != md["metadata"].get("uid") and not status:
                # Measured on the bed: 422, "metadata.uid: field is immutable".  The status
                # subresource takes nothing but status from the patch: a UID there is not
                # checked (the resourceVersion is).
                raise Invalid(
                    f"patch ModelDeployment {namespace}/{name}",
                    status=422,
                    reason="Unprocessable Entity",
                    detail="metadata.uid: field is immutable",
                )
            if rv is not None and rv != md["metadata"]["resourceVersion"]:
                raise Conflict(
                    f"patch ModelDeployment {namespace}/{name}", status=409, reason="Conflict"
                )
            if status:  # the status subresource ignores everything but status
                patch = {"status": patch.get("status")} if "status" in patch else {}
            else:  # the main resource ignores status
                patch = {k: v for k, v in patch.items() if k != "status"}
            merged = apply_merge_patch(md, patch)
            for part in ("spec", "status"):  # what the CRD's schema does not know goes
                if isinstance(merged.get(part), dict):
                    merged[part] = prune(merged[part], crd_schema()["properties"][part])
            merged["metadata"]["resourceVersion"] = md["metadata"]["resourceVersion"]
            if merged.get("spec") != md.get("spec"):
                merged["metadata"]["generation"] = int(md["metadata"].get("generation", 1)) + 1
            self._bump(merged)
            self.deployments[(namespace, name)] = merged
            self._record("modeldeployments", "MODIFIED", merged)
            return copy.deepcopy(merged)

    def patch_deployment(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return self._merge("patch_deployment", namespace, name, patch, status=False)

    def patch_deployment_status(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        return self._merge("patch_deployment_status", namespace, name, patch, status=True)

    # ------------------------------------------------------------ Pods

    def list_pods(self, *, namespace: str, selector: str) -> list[Pod]:
        with self._lock:
            self._enter("list_pods", namespace=namespace, selector=selector)
            return [
                Pod.from_raw(copy.deepcopy(b))
                for (ns, _), b in sorted(self.pods.items())
                if ns == namespace and matches(b["metadata"].get("labels") or {}, selector)
            ]

    def read_pod(self, *, namespace: str, name: str) -> Pod:
        with self._lock:
            self._enter("read_pod", namespace=namespace, name=name)
            return Pod.from_raw(copy.deepcopy(self._found(self.pods, (namespace, name), "Pod")))

    def patch_pod(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> Pod:
        with self._lock:
            self._enter("patch_pod", namespace=namespace, name=name, ops=ops)
            pod = self._found(self.pods, (namespace, name), "Pod")
            try:
                patched = apply_json_patch(pod, ops)
            except PatchError as e:
                raise Invalid(
                    f"patch Pod {namespace}/{name}",
                    status=422,
                    reason="Unprocessable Entity",
                    detail=str(e),
                ) from e
            bad = label_errors(patched["metadata"].get("labels") or {})
            if bad:
                raise Invalid(
                    f"patch Pod {namespace}/{name}",
                    status=422,
                    reason="Unprocessable Entity",
                    detail="; ".join(bad),
                )
            if patched["metadata"].get("uid") != pod["metadata"].get("uid"):
                raise Invalid(
                    f"patch Pod {namespace}/{name}",
                    status=422,
                    reason="Unprocessable Entity",
                    detail="metadata.uid is immutable",
                )
            # The API server stores an empty map as absent (``omitempty``): once the last
            # label is removed there is no ``/metadata/labels`` for a later patch to test
            # or add under.
            for empty in ("labels", "annotations"):
                if patched["metadata"].get(empty) == {}:
                    del patched["metadata"][empty]
            self._bump(patched)
            self.pods[(namespace, name)] = patched
            self._record("pods", "MODIFIED", patched)
            return Pod.from_raw(copy.deepcopy(patched))

    def delete_pod(self, *, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            self._enter("delete_pod", namespace=namespace, name=name, uid=uid)
            pod = self._found(self.pods, (namespace, name), "Pod")
            if pod["metadata"].get("uid") != uid:
                raise Conflict(
                    f"delete Pod {namespace}/{name}",
                    status=409,
                    reason="Conflict",
                    detail="Precondition failed: UID in precondition",
                )
            meta = pod["metadata"]
            if meta.get("finalizers"):
                # The API server keeps an object with finalizers, marked for deletion, until
                # they are removed; a second delete of it (same UID) is answered, not refused.
                if meta.get("deletionTimestamp") is None:
                    meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                    meta["deletionGracePeriodSeconds"] = 0
                    self._bump(pod)
                    self._record("pods", "MODIFIED", pod)
                return
            self._remove_pod((namespace, name))

    def exec_pod(
        self,
        *,
        namespace: str,
        name: str,
        container: str,
        argv: list[str],
        timeout_s: float,
        output_cap: int,
        tick: Callable[[], None] | None = None,
    ) -> ExecResult:
        if tick is not None:  # the real one ticks before its first wait for bytes
            tick()
        with self._lock:
            try:
                self._enter(
                    "exec_pod",
                    namespace=namespace,
                    name=name,
                    container=container,
                    argv=argv,
                    timeout_s=timeout_s,
                    output_cap=output_cap,
                )
            except KubeError as e:
                return ExecResult(error=f"exec failed: {type(e).__name__}")
            if (namespace, name) not in self.pods:
                return ExecResult(error="exec failed: ApiException")
            queue = self._exec.get((namespace, name))
            if not queue:
                return ExecResult(error="exec failed: nothing scripted for this Pod")
            script = queue.popleft() if len(queue) > 1 else queue[0]
        result = script(argv) if callable(script) else script
        if len(result.stdout.encode()) > output_cap:
            return ExecResult(error="exec output over its cap")
        return result

    # ------------------------------------------------------------ Services

    def list_services(self, *, namespace: str) -> list[Service]:
        with self._lock:
            self._enter("list_services", namespace=namespace)
            return [
                Service.from_raw(copy.deepcopy(b))
                for (ns, _), b in sorted(self.services.items())
                if ns == namespace
            ]

    def list_endpoint_slices(self, *, namespace: str, service: str) -> list[EndpointSlice]:
        with self._lock:
            self._enter("list_endpoint_slices", namespace=namespace, service=service)
            return [
                EndpointSlice.from_raw(copy.deepcopy(b))
                for (ns, _), b in sorted(self.endpoint_slices.items())
                if ns == namespace
                and matches(
                    b["metadata"].get("labels") or {}, f"kubernetes.io/service-name={service}"
                )
            ]

    def list_namespace_endpoint_slices(self, *, namespace: str) -> list[EndpointSlice]:
        with self._lock:
            self._enter("list_namespace_endpoint_slices", namespace=namespace)
            return [
                EndpointSlice.from_raw(copy.deepcopy(b))
                for (ns, _), b in sorted(self.endpoint_slices.items())
                if ns == namespace
            ]

    # ------------------------------------------------------------ Workloads

    def _kueue(self, what: str) -> None:
        if not self.kueue_installed:
            raise NotFound(
                what,
                status=404,
                reason="Not Found",
                detail="the server could not find the requested resource",
            )

    def get_workload(self, *, namespace: str, name: str) -> Workload:
        with self._lock:
            self._enter("get_workload", namespace=namespace, name=name)
            self._kueue(f"read Workload {namespace}/{name}")
            return Workload.from_raw(
                copy.deepcopy(self._found(self.workloads, (namespace, name), "Workload"))
            )

    def list_workloads(self, *, namespace: str) -> list[Workload]:
        with self._lock:
            self._enter("list_workloads", namespace=namespace)
            self._kueue(f"list Workloads in {namespace}")
            return [
                Workload.from_raw(copy.deepcopy(b))
                for (ns, _), b in sorted(self.workloads.items())
                if ns == namespace
            ]

    def delete_workload(self, *, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            self._enter("delete_workload", namespace=namespace, name=name, uid=uid)
            self._kueue(f"delete Workload {namespace}/{name}")
            w = self._found(self.workloads, (namespace, name), "Workload")
            if w["metadata"].get("uid") != uid:
                raise Conflict(f"delete Workload {namespace}/{name}", status=409, reason="Conflict")
            del self.workloads[(namespace, name)]

    # ------------------------------------------------------------ Events

    def create_event(self, *, namespace: str, event: dict[str, Any]) -> None:
        with self._lock:
            self._enter("create_event", namespace=namespace, event=event)
            key = (namespace, event["metadata"]["name"])
            if key in self.events:
                raise Conflict(
                    f"create Event {key[0]}/{key[1]}",
                    status=409,
                    reason="Conflict",
                    detail="already exists",
                )
            self.events[key] = self._stamp(event, "event")
