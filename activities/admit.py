"""Admission: read the ModelDeployment and the replica's Pods live and bind the target
(SPEC section 3), or refuse with a reason a person can act on.  A refusal touches nothing."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from activities.kube import Kube, raise_api_error
from activities.oneshot import valid_path, valid_port, valid_scheme
from retirement.models import Admission, AdmitInput, IntentKind, MemberTarget, Target
from retirement.names import (
    ANNOTATION_PROM_PATH,
    ANNOTATION_PROM_PORT,
    ANNOTATION_PROM_SCHEME,
    APP_NAME,
    ENGINE_CONTAINER,
    GROUP,
    KUEUE_WORKLOAD_API,
    LABEL_COMPONENT,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    LABEL_NAME,
    LABEL_ORDINAL,
    LABEL_ROLE_KIND,
    PLURAL,
    VERSION,
)
from retirement.readings import SERIES
from retirement.shape import MemberPod, member_index, read_shape, select_members


class Refusal(Exception):
    """Admission is refused, with the reason."""


def admit(kube: Kube, inp: AdmitInput) -> Admission:
    """Bind the target of ``inp.request`` or say why it cannot be admitted."""
    try:
        return Admission(target=_bind(kube, inp))
    except Refusal as r:
        return Admission(refusal=str(r))


def _bind(kube: Kube, inp: AdmitInput) -> Target:
    req = inp.request
    try:
        md: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            GROUP, VERSION, req.namespace, PLURAL, req.deployment)
    except ApiException as e:
        if e.status == 404:
            raise Refusal(f"ModelDeployment {req.namespace}/{req.deployment} not found") from e
        raise_api_error(e, "read ModelDeployment")
    spec = md.get("spec") or {}
    engine = (spec.get("engine") or {}).get("name", "")
    if engine not in SERIES:
        raise Refusal(f"engine {engine!r} is not vLLM or SGLang")
    pods = _replica_pods(kube, req.namespace, req.deployment, req.role, req.ordinal)
    if not pods:
        raise Refusal(f"no Pods of role {req.role} ordinal {req.ordinal}")
    for p in pods:
        if not p.metadata.uid:
            raise Refusal(f"Pod {p.metadata.name} has no UID: an empty binding would match "
                          "every Pod")
        if p.metadata.deletion_timestamp is not None:
            raise Refusal(f"Pod {p.metadata.name} is already terminating")
    role = next((r for r in spec.get("roles") or [] if r.get("name") == req.role), None)
    kind = _role_kind(role, pods)
    if role is not None:
        size = int(role.get("size", 1))
        if req.intent is IntentKind.DEPARTED_ROLE:
            raise Refusal(f"role {req.role} is still in the spec: not a departed role")
        extra_args = [str(a) for a in role.get("extraArgs") or []]
        cmd = role.get("command")
    else:
        # A departed role: its spec is gone, so its shape is read from what the Pods run.
        size = len(pods)
        extra_args = _main_args(pods[0])
        cmd = None
    shape = read_shape(engine=engine, role_kind=kind, size=size, extra_args=extra_args,
                       command=cmd)
    members = [MemberPod(name=p.metadata.name, uid=p.metadata.uid,
                         labels=dict(p.metadata.labels or {})) for p in pods]
    if req.intent is IntentKind.SURPLUS_SHED:
        named = set(req.members)
        targets = [p for p in pods if p.metadata.name in named]
        if not named or len(targets) != len(named):
            raise Refusal(f"surplus members {sorted(named)} are not all Pods of the replica")
        measured = {p.metadata.name for p in targets
                    if (p.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true"}
        if not shape.supported:
            raise Refusal(f"shape {shape.shape}: {shape.reason}")
    else:
        sel = select_members(shape=shape, size=size, members=members)
        if not sel.ok:
            raise Refusal(sel.refusal)
        targets = pods
        measured = set(sel.measured)
    bound = [_member(p, measured=p.metadata.name in measured) for p in targets]
    workload_name, workload_uid = _workload(kube, req.namespace, {p.metadata.uid for p in pods})
    router = (spec.get("router") or {}).get("kind")
    return Target(
        namespace=req.namespace, deployment=req.deployment, role=req.role,
        ordinal=req.ordinal, intent=req.intent, engine=engine,
        engine_version=str((spec.get("engine") or {}).get("version", "")),
        shape=shape.shape.value, router=router, members=bound,
        workload_name=workload_name, workload_uid=workload_uid,
        observed_generation=int((md.get("status") or {}).get("observedGeneration")
                                or md["metadata"].get("generation") or 0),
        deployment_uid=md["metadata"].get("uid", ""),
    )


def _replica_pods(kube: Kube, ns: str, md: str, role: str, ordinal: int) -> list[client.V1Pod]:
    selector = (f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={md},{LABEL_COMPONENT}={role},"
                f"{LABEL_ORDINAL}={ordinal}")
    try:
        pods: list[client.V1Pod] = kube.core.list_namespaced_pod(
            ns, label_selector=selector).items
    except ApiException as e:
        raise_api_error(e, "list Pods")
    return sorted(pods, key=lambda p: (member_index(_as_member(p)) or 0, p.metadata.name))


def _as_member(p: client.V1Pod) -> MemberPod:
    return MemberPod(name=p.metadata.name, uid=p.metadata.uid or "",
                     labels=dict(p.metadata.labels or {}))


def _role_kind(role: dict[str, Any] | None, pods: list[client.V1Pod]) -> str:
    if role is not None:
        declared = str(role.get("kind") or "Server")
        labelled = {(p.metadata.labels or {}).get(LABEL_ROLE_KIND) for p in pods} - {None}
        if labelled and labelled != {declared}:
            raise Refusal(f"role kind {declared} and the Pods' {LABEL_ROLE_KIND} "
                          f"{sorted(x for x in labelled if x)} disagree")
        return declared
    kinds = {(p.metadata.labels or {}).get(LABEL_ROLE_KIND) or "Server" for p in pods}
    if len(kinds) != 1:
        raise Refusal(f"members disagree on {LABEL_ROLE_KIND}: {sorted(kinds)}")
    return kinds.pop()


def _main(p: client.V1Pod) -> client.V1Container | None:
    return next((c for c in p.spec.containers or [] if c.name == ENGINE_CONTAINER), None)


def _main_args(p: client.V1Pod) -> list[str]:
    c = _main(p)
    return [str(a) for a in (c.args or [])] if c is not None else []


def _member(p: client.V1Pod, *, measured: bool) -> MemberTarget:
    name = p.metadata.name
    if _main(p) is None:
        raise Refusal(f"Pod {name} has no {ENGINE_CONTAINER!r} container")
    status = next((s for s in (p.status.container_statuses or [])
                   if s.name == ENGINE_CONTAINER), None)
    container_id = status.container_id if status is not None else None
    if not container_id:
        raise Refusal(f"container {ENGINE_CONTAINER} of {name} has no container ID (not "
                      "started)")
    if not p.status.pod_ip:
        raise Refusal(f"Pod {name} has no address")
    ann = p.metadata.annotations or {}
    port = scheme = path = None
    if measured:
        try:
            port = valid_port(ann.get(ANNOTATION_PROM_PORT))
            scheme = valid_scheme(ann.get(ANNOTATION_PROM_SCHEME))
            path = valid_path(ann.get(ANNOTATION_PROM_PATH))
        except ValueError as e:
            raise Refusal(f"member {name}: {e}; its metrics cannot be read") from e
    main = _main(p)
    serve_port = None
    if main is not None and main.ports:
        named = next((x for x in main.ports if x.name == "http"), main.ports[0])
        serve_port = int(named.container_port)
    labels = dict(p.metadata.labels or {})
    return MemberTarget(
        pod=name, uid=p.metadata.uid, container_id=container_id,
        restart_count=int(status.restart_count or 0) if status is not None else 0,
        ip=p.status.pod_ip, member_index=member_index(_as_member(p)), measured=measured,
        eligible_at_admission=labels.get(LABEL_ELIGIBLE) == "true", serve_port=serve_port,
        metrics_port=port, metrics_scheme=scheme or "http", metrics_path=path or "/metrics",
        labels=labels,
    )


def _workload(kube: Kube, ns: str, uids: set[str]) -> tuple[str | None, str | None]:
    group, version, plural = KUEUE_WORKLOAD_API
    try:
        items = kube.custom.list_namespaced_custom_object(group, version, ns, plural)["items"]
    except ApiException as e:
        if e.status == 404:  # Kueue is not installed
            return None, None
        raise_api_error(e, "list Workloads")
    for w in items:
        owners = {o.get("uid") for o in w["metadata"].get("ownerReferences") or []}
        if owners & uids:
            return w["metadata"]["name"], w["metadata"]["uid"]
    return None, None
