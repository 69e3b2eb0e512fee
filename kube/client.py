"""``Kube``: the real accessor of one cluster, implementing ``kube.api.KubeApi``.

Built from a kubeconfig file or the in-cluster service account, with proxy settings
ignored (nothing may leave for a proxy) and a client-side timeout on every request, so a
stalled API server costs a bounded wait, never a hung activity or watcher pass.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from kubernetes import client, config

from kube.api import ExecResult
from kube.errors import NotFound, Unavailable, translated
from kube.objects import SERVICE_NAME_LABEL, EndpointSlice, Pod, Service, Workload
from kube.podexec import run_exec
from kube.sharing import SharedReads
from retirement.names import FIELD_MANAGER, GROUP, KUEUE_WORKLOAD_API, PLURAL, VERSION

T = TypeVar("T")

#: Default bound of one API request (connect and read), in seconds.
REQUEST_TIMEOUT_S = 10.0
#: How long a discovered API version is trusted before it is read again, in seconds.
DISCOVERY_TTL_S = 60.0
#: Default size of the connection pool to the API server (the client's own default is
#: 5 per CPU: 10 on this kind of machine, for a worker of 64 activity threads).
CONNECTIONS = 64


@dataclass(frozen=True)
class Kube:
    """API access to one cluster (thread-safe: the client pool is shared)."""

    api: client.ApiClient
    #: Client-side bound of every request, in seconds (``_request_timeout``).
    timeout_s: float = REQUEST_TIMEOUT_S
    _core: client.CoreV1Api = field(init=False, repr=False, compare=False)
    _custom: client.CustomObjectsApi = field(init=False, repr=False, compare=False)
    _discovery: client.DiscoveryV1Api = field(init=False, repr=False, compare=False)
    #: Discovered API versions: group -> (version, when read).
    _served: dict[str, tuple[str, float]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    #: The namespace-wide lists, shared by concurrent callers (``kube.sharing``: each
    #: still gets an answer from a request sent after it asked).
    shared: SharedReads = field(default_factory=SharedReads, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {self.timeout_s!r}")
        object.__setattr__(self, "_core", client.CoreV1Api(self.api))
        object.__setattr__(self, "_custom", client.CustomObjectsApi(self.api))
        object.__setattr__(self, "_discovery", client.DiscoveryV1Api(self.api))

    @classmethod
    def from_config(
        cls,
        *,
        kubeconfig: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        connections: int = CONNECTIONS,
        program: str = "llm-retire",
    ) -> Kube:
        """From a kubeconfig file, or in-cluster configuration when none is given.
        ``connections``: kept-alive connections to the API server (size it to the threads
        that share this accessor: a smaller pool opens and discards one per request).
        ``program`` names the process in its User-Agent, which the API server's audit log
        records with every request (``retire-worker/0.1.0``: who deleted this Pod)."""
        cfg = client.Configuration()
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
        cfg.proxy = None
        cfg.connection_pool_maxsize = connections
        api = client.ApiClient(cfg)
        api.user_agent = f"{program}/{package_version()}"
        return cls(api=api, timeout_s=timeout_s)

    # The generated clients, for what the interface does not cover (list+watch streams).
    @property
    def core(self) -> client.CoreV1Api:
        """core/v1."""
        return self._core

    @property
    def custom(self) -> client.CustomObjectsApi:
        """Custom resources."""
        return self._custom

    def _json(
        self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> dict[str, Any]:
        """The body of one request of a generated method, decoded with ``json.loads``.

        Asked with ``_preload_content=False``, the generated client hands back the HTTP
        response unread instead of building its model classes: decoding a Pod or an
        EndpointSlice list through them costs about ten times ``json.loads`` (20 ms against
        2 ms for 150 slices), and the worker's polls list every Service and EndpointSlice
        of a namespace, from many threads of one process.  The views
        (``kube.objects``) read the same camelCase JSON either way.  Bounded as before
        (``_request_timeout``; the body is read under the same read timeout) and
        translated as before: a non-2xx answer is still an ``ApiException`` raised by the
        generated method, a transport failure while reading the body is one of urllib3's.
        A 2xx answer that is not a JSON object (a garbled body, an HTML page from
        something in between) is ``Unavailable``: asking again may get a proper one (the
        models' path let that decoding error escape unclassified)."""
        with translated(what):
            resp = call(*args, _preload_content=False, _request_timeout=self.timeout_s, **kwargs)
            try:
                data = resp.data
            finally:
                resp.release_conn()
        try:
            body = json.loads(data)
        except ValueError as e:
            raise Unavailable(what, reason=f"the answer is not JSON ({type(e).__name__})") from e
        if not isinstance(body, dict):
            raise Unavailable(what, reason="the answer is not a JSON object")
        return body

    def _items(self, what: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        """The ``items`` of one list request (``_json``); entries that are not objects are
        left out (the views read a missing field as not set)."""
        items = self._json(what, call, *args, **kwargs).get("items")
        return [i for i in items if isinstance(i, dict)] if isinstance(items, list) else []

    # ------------------------------------------------------------ ModelDeployments

    def get_deployment(self, *, namespace: str, name: str) -> dict[str, Any]:
        with translated(f"read ModelDeployment {namespace}/{name}"):
            md: dict[str, Any] = self._custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, _request_timeout=self.timeout_s
            )
        return md

    def list_deployments(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        with translated(f"list ModelDeployments in {namespace or 'every namespace'}"):
            if namespace is None:
                listing = self._custom.list_cluster_custom_object(
                    GROUP, VERSION, PLURAL, _request_timeout=self.timeout_s
                )
            else:
                listing = self._custom.list_namespaced_custom_object(
                    GROUP, VERSION, namespace, PLURAL, _request_timeout=self.timeout_s
                )
        return list(listing.get("items") or [])

    def patch_deployment(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        with translated(f"patch ModelDeployment {namespace}/{name}"):
            md: dict[str, Any] = self._custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, name, patch, _request_timeout=self.timeout_s
            )
        return md

    def patch_deployment_status(
        self, *, namespace: str, name: str, patch: dict[str, Any]
    ) -> dict[str, Any]:
        with translated(f"patch status of ModelDeployment {namespace}/{name}"):
            md: dict[str, Any] = self._custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                name,
                patch,
                field_manager=FIELD_MANAGER,
                _request_timeout=self.timeout_s,
            )
        return md

    # ------------------------------------------------------------ Pods

    def list_pods(self, *, namespace: str, selector: str) -> list[Pod]:
        items = self._items(
            f"list Pods in {namespace}",
            self._core.list_namespaced_pod,
            namespace,
            label_selector=selector,
        )
        return [Pod.from_raw(p) for p in items]

    def read_pod(self, *, namespace: str, name: str) -> Pod:
        pod = self._json(
            f"read Pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        return Pod.from_raw(pod)

    def patch_pod(self, *, namespace: str, name: str, ops: list[dict[str, Any]]) -> Pod:
        pod = self._json(
            f"patch Pod {namespace}/{name}", self._core.patch_namespaced_pod, name, namespace, ops
        )
        return Pod.from_raw(pod)

    def delete_pod(self, *, namespace: str, name: str, uid: str) -> None:
        with translated(f"delete Pod {namespace}/{name}"):
            self._core.delete_namespaced_pod(
                name,
                namespace,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _request_timeout=self.timeout_s,
            )

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
        # ``stream()`` swaps ``call_api`` on the client it is given while it connects: on
        # the shared client, concurrent requests of other threads would go out as websocket
        # upgrades (and overlapping handshakes can leave the swap in place).  Each exec gets
        # a client of its own, sharing only the configuration.
        own = client.ApiClient(self.api.configuration)
        own.user_agent = self.api.user_agent
        try:
            return run_exec(
                client.CoreV1Api(own).connect_get_namespaced_pod_exec,
                namespace=namespace,
                name=name,
                container=container,
                argv=argv,
                timeout_s=timeout_s,
                output_cap=output_cap,
                tick=tick,
            )
        finally:
            own.close()

    # ------------------------------------------------------------ Services

    def list_services(self, *, namespace: str) -> list[Service]:
        def fetch() -> list[Service]:
            items = self._items(
                f"list Services in {namespace}", self._core.list_namespaced_service, namespace
            )
            return [Service.from_raw(s) for s in items]

        return list(self.shared.read(("services", namespace), fetch))

    def list_endpoint_slices(self, *, namespace: str, service: str) -> list[EndpointSlice]:
        items = self._items(
            f"list EndpointSlices of Service {namespace}/{service}",
            self._discovery.list_namespaced_endpoint_slice,
            namespace,
            label_selector=f"{SERVICE_NAME_LABEL}={service}",
        )
        return [EndpointSlice.from_raw(s) for s in items]

    def list_namespace_endpoint_slices(self, *, namespace: str) -> list[EndpointSlice]:
        def fetch() -> list[EndpointSlice]:
            items = self._items(
                f"list EndpointSlices in {namespace}",
                self._discovery.list_namespaced_endpoint_slice,
                namespace,
            )
            return [EndpointSlice.from_raw(s) for s in items]

        return list(self.shared.read(("endpointslices", namespace), fetch))

    # ------------------------------------------------------------ Workloads

    def workload_api(self) -> tuple[str, str, str]:
        """(group, version, plural) of Kueue's Workload as this cluster serves it: the
        group's preferred version, discovered (``GET /apis``) and kept for
        ``DISCOVERY_TTL_S``, never assumed: Kueue v0.17 prefers v1beta2 and still serves
        v1beta1, a later one may serve only v1.  The Workload view reads only metadata
        (name, UID, owners), the same in every version.  NotFound when Kueue's group is
        not served (Kueue is not installed)."""
        group, _, plural = KUEUE_WORKLOAD_API
        known = self._served.get(group)
        if known is not None and time.monotonic() - known[1] < DISCOVERY_TTL_S:
            return group, known[0], plural
        with translated("discover the API groups"):
            groups = client.ApisApi(self.api).get_api_versions(_request_timeout=self.timeout_s)
        for g in groups.groups or []:
            if g.name == group:
                preferred = g.preferred_version.version if g.preferred_version else None
                version = preferred or (g.versions[0].version if g.versions else None)
                if version:
                    self._served[group] = (version, time.monotonic())
                    return group, version, plural
        self._served.pop(group, None)
        raise NotFound(
            f"discover {group}", status=404, reason="NotFound", detail="Kueue is not installed"
        )

    def _on_workloads(self, what: str, call: Callable[[str, str, str], T]) -> T:
        """``call(group, version, plural)`` in the version this cluster serves.  A 404 from a
        version that was discovered earlier is not taken for the Workload's absence: the
        version may have stopped being served since (Kueue upgraded under a running
        worker), and a Workload read as gone would be left holding the quota.  The version
        is discovered again, once, and the call repeated if it changed."""
        group, version, plural = self.workload_api()
        try:
            with translated(what):
                return call(group, version, plural)
        except NotFound:
            self._served.pop(group, None)
            if self.workload_api()[1] == version:
                raise
        group, version, plural = self.workload_api()
        with translated(what):
            return call(group, version, plural)

    def get_workload(self, *, namespace: str, name: str) -> Workload:
        def get(group: str, version: str, plural: str) -> Any:
            return self._custom.get_namespaced_custom_object(
                group, version, namespace, plural, name, _request_timeout=self.timeout_s
            )

        return Workload.from_raw(self._on_workloads(f"read Workload {namespace}/{name}", get))

    def list_workloads(self, *, namespace: str) -> list[Workload]:
        def list_(group: str, version: str, plural: str) -> Any:
            return self._custom.list_namespaced_custom_object(
                group, version, namespace, plural, _request_timeout=self.timeout_s
            )

        listing = self._on_workloads(f"list Workloads in {namespace}", list_)
        return [Workload.from_raw(w) for w in listing.get("items") or []]

    def delete_workload(self, *, namespace: str, name: str, uid: str) -> None:
        def delete(group: str, version: str, plural: str) -> None:
            self._custom.delete_namespaced_custom_object(
                group,
                version,
                namespace,
                plural,
                name,
                body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)),
                _request_timeout=self.timeout_s,
            )

        self._on_workloads(f"delete Workload {namespace}/{name}", delete)

    # ------------------------------------------------------------ Events

    def create_event(self, *, namespace: str, event: dict[str, Any]) -> None:
        with translated(f"create Event in {namespace}"):
            self._core.create_namespaced_event(
                namespace, client.CoreV1Event.from_dict(event), _request_timeout=self.timeout_s
            )


def package_version() -> str:
    """The installed package's version (``unknown`` when it runs from a bare tree): the
    User-Agent's and ``retire --version``'s."""
    try:
        return metadata.version("llm-retire")
    except metadata.PackageNotFoundError:
        return "unknown"
