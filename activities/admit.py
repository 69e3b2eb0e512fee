"""Admission: read the ModelDeployment and the replica's Pods live and bind the target
(SPEC section 3), or refuse with a reason a person can act on.  A refusal touches nothing.

Which members are measured (read during the drain) is decided by the member-selection rule
of ``retirement.shape`` for every intent, never by the eligibility label: a whole replica
by ``select_members``, the members of a surplus shed by ``select_surplus`` (each read as
what its own member index makes it).

Never started: a Pod whose ``main`` container has no container ID (the kubelet sets one
when it creates the container, and keeps it across restarts) and that is not
``Ready=True`` (Ready without a container ID is an inconsistency, not proof that nothing
runs).  Nothing ever ran in it, so it never served and has nothing in flight.  Not Ready
now, or no eligibility label now, is not used: neither says what a member did before (a
member that served may have lost both).
Such a member is bound with no container ID: the drain then reads it without an exec,
"never started: nothing to drain", and fails if it has started since
(``activities.sampling.sample_member``).  A whole replica is bound so only when none of its
members ever started; a surplus member is judged on its own (it is retired on its own):
one that never started is bound so and measured (its reading is that proof), one that
started is measured only if the rule says it answers.  Everything else (disqualify,
withdrawal, the drain rule, delete) is the same path.
"""

from __future__ import annotations

from activities.oneshot import valid_path, valid_port, valid_scheme
from kube.api import KubeApi
from kube.deployment import MalformedDeployment, ModelDeployment, Role, parse_deployment
from kube.errors import KubeError, NotFound
from kube.objects import Container, Pod, pod_ready
from retirement.intents import intent_refusal
from retirement.models import (
    Admission,
    AdmitInput,
    IntentKind,
    MemberTarget,
    RetirementRequest,
    Target,
)
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
from retirement.readings import SERIES
from retirement.shape import (
    REPLICA_SIZE_ENV,
    MemberPod,
    ShapeReading,
    Wiring,
    declared_wiring,
    disagreement,
    exact_load,
    member_index,
    read_shape,
    read_wiring,
    rendered_wiring,
    select_members,
    select_surplus,
    shape_of,
)


class Refusal(Exception):
    """Admission is refused, with the reason."""


def admit(api: KubeApi, inp: AdmitInput) -> Admission:
    """Bind the target of ``inp.request`` or say why it cannot be admitted."""
    try:
        return Admission(target=_bind(api, inp))
    except Refusal as r:
        return Admission(refusal=str(r))


def _deployment(api: KubeApi, namespace: str, name: str) -> ModelDeployment:
    try:
        raw = api.get_deployment(namespace=namespace, name=name)
    except NotFound as e:
        raise Refusal(f"ModelDeployment {namespace}/{name} not found") from e
    try:
        return parse_deployment(raw)
    except MalformedDeployment as e:
        raise Refusal(f"ModelDeployment {namespace}/{name} is malformed: {e.reason}") from e


def _bind(api: KubeApi, inp: AdmitInput) -> Target:
    req = inp.request
    md = _deployment(api, req.namespace, req.deployment)
    engine = md.engine.name
    if engine not in SERIES:
        raise Refusal(f"engine {engine!r} is not vLLM or SGLang")
    everything = _deployment_pods(api, req.namespace, req.deployment)
    pods = _replica_pods(everything, req.role, req.ordinal)
    if not pods:
        raise Refusal(f"no Pods of role {req.role} ordinal {req.ordinal}")
    for p in pods:
        if not p.uid:
            raise Refusal(f"Pod {p.name} has no UID: an empty binding would match every Pod")
        if p.terminating:
            raise Refusal(f"Pod {p.name} is already terminating")
    refusal = intent_refusal(md, everything, req)
    if refusal:
        raise Refusal(refusal)
    size, shape = _shape(md, req, pods)
    targets, measured, never = _selection(req, shape, size, pods)
    served = _served_ports(api, req.namespace)
    bound = [
        _member(
            p,
            measured=p.name in measured,
            served=served.get(p.uid),
            never_started=p.name in never,
            exact=exact_load(
                engine=engine, version=md.engine.version, wiring=_running(engine, p)[0]
            ),
        )
        for p in targets
    ]
    workload_name, workload_uid = _workload(api, req.namespace, {p.uid for p in pods})
    return Target(
        namespace=req.namespace,
        deployment=req.deployment,
        role=req.role,
        ordinal=req.ordinal,
        intent=req.intent,
        engine=engine,
        engine_version=md.engine.version,
        shape=shape.shape.value,
        router=md.router,
        members=bound,
        workload_name=workload_name,
        workload_uid=workload_uid,
        observed_generation=md.observed_generation or md.generation or 0,
        deployment_uid=md.uid,
        size=size,
    )


def _shape(
    md: ModelDeployment, req: RetirementRequest, pods: list[Pod]
) -> tuple[int, ShapeReading]:
    """The replica's size and shape: the role's spec, checked against what the Pods run;
    for a departed role (its spec gone), read from what the Pods run."""
    engine = md.engine.name
    role = md.role(req.role)
    kind = _role_kind(role, pods)
    if role is None:
        size = len(pods)
        return size, _departed_shape(engine, kind, size, pods)
    if req.intent is IntentKind.DEPARTED_ROLE:
        raise Refusal(f"role {req.role} is still in the spec: not a departed role")
    shape = read_shape(
        engine=engine,
        role_kind=kind,
        size=role.size,
        extra_args=list(role.extra_args),
        command=None if role.command is None else list(role.command),
        env=role.env,
    )
    if shape.supported:
        refusal = _declared_against_running(engine, role, pods)
        if refusal:
            raise Refusal(refusal)
    return role.size, shape


def _selection(
    req: RetirementRequest, shape: ShapeReading, size: int, pods: list[Pod]
) -> tuple[list[Pod], set[str], set[str]]:
    """The members retired, those measured, and those that never started (by name)."""
    if req.intent is IntentKind.SURPLUS_SHED:
        named = set(req.members)
        targets = [p for p in pods if p.name in named]
        if not named or len(targets) != len(named):
            raise Refusal(f"surplus members {sorted(named)} are not all Pods of the replica")
        # Each surplus member is retired on its own: one that never started serves nothing
        # and is measured only to read so; the others answer by the member-selection rule.
        never = {p.name for p in targets if not _started(p)}
        sel = select_surplus(
            shape=shape, surplus=[_as_member(p) for p in targets if p.name not in never]
        )
        if not sel.ok:
            raise Refusal(sel.refusal)
        return targets, set(sel.measured) | never, never
    sel = select_members(shape=shape, size=size, members=[_as_member(p) for p in pods])
    if not sel.ok:
        raise Refusal(sel.refusal)
    # A replica none of whose members ever started serves nothing: it is retired, and
    # its drain reads "never started" as long as that stays true (activities.sampling).
    never = {p.name for p in pods} if all(not _started(p) for p in pods) else set()
    return pods, set(sel.measured), never


def _deployment_pods(api: KubeApi, ns: str, md: str) -> list[Pod]:
    """Every Pod of the deployment, as the watcher lists them to derive the intents."""
    return api.list_pods(namespace=ns, selector=f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={md}")


def _replica_pods(pods: list[Pod], role: str, ordinal: int) -> list[Pod]:
    """The Pods of one replica: its role and ordinal labels, exactly as a selector reads."""
    mine = [
        p
        for p in pods
        if p.labels.get(LABEL_COMPONENT) == role and p.labels.get(LABEL_ORDINAL) == str(ordinal)
    ]
    return sorted(mine, key=lambda p: (member_index(_as_member(p)) or 0, p.name))


def _as_member(p: Pod) -> MemberPod:
    return MemberPod(name=p.name, uid=p.uid, labels=dict(p.labels))


def _role_kind(role: Role | None, pods: list[Pod]) -> str:
    if role is not None:
        declared = role.kind
        labelled = {p.labels.get(LABEL_ROLE_KIND) for p in pods} - {None}
        if labelled and labelled != {declared}:
            raise Refusal(
                f"role kind {declared} and the Pods' {LABEL_ROLE_KIND} "
                f"{sorted(x for x in labelled if x)} disagree"
            )
        return declared
    kinds = {p.labels.get(LABEL_ROLE_KIND) or "Server" for p in pods}
    if len(kinds) != 1:
        raise Refusal(f"members disagree on {LABEL_ROLE_KIND}: {sorted(kinds)}")
    return kinds.pop()


def _running(engine: str, pod: Pod) -> tuple[Wiring | None, str | None]:
    """What the Pod's ``main`` container runs: its wiring (None when it declares neither a
    command nor args: nothing was rendered to read) and the replica size the operator
    published to it (``GPUSTACK_REPLICA_SIZE``; None when absent or not a literal)."""
    main = pod.container(ENGINE_CONTAINER)
    if main is None:
        return None, None
    size = next((e.value for e in reversed(main.env) if e.name == REPLICA_SIZE_ENV), None)
    if not main.command and not main.args:
        return None, size
    return rendered_wiring(engine=engine, command=main.command, args=main.args, env=main.env), size


def _differences(diff: tuple[tuple[str, str, str], ...], first: str, second: str) -> str:
    return "; ".join(f"{what} {a} ({first}) against {b} ({second})" for what, a, b in diff)


def _declared_against_running(engine: str, role: Role, pods: list[Pod]) -> str:
    """Why the role's declared wiring and what its Pods run disagree ("" when they agree):
    the declared ``extraArgs`` and ``env`` against each member's ``main`` command line and
    environment, and the declared size against the size the Pod was rendered for.  The
    operator renders the declared arguments into every member, so a disagreement is a Pod
    built from another spec than the one declared now: the shape cannot be decided."""
    declared = declared_wiring(
        engine=engine, size=role.size, extra_args=role.extra_args, env=role.env
    )
    for p in pods:
        running, published = _running(engine, p)
        if published is not None and published != str(role.size):
            return (
                f"role {role.name} declares size {role.size} and Pod {p.name} was rendered "
                f"for size {published!r} ({REPLICA_SIZE_ENV}): which shape the replica has "
                "cannot be decided"
            )
        if running is None:
            continue
        if running.problems:
            return (
                f"the command line Pod {p.name} runs cannot be read: {'; '.join(running.problems)}"
            )
        diff = disagreement(declared, running)
        if diff:
            return (
                f"role {role.name} declares one wiring and Pod {p.name} runs another: "
                f"{_differences(diff, 'declared', 'running')}; which shape the replica has "
                "cannot be decided"
            )
    return ""


def _departed_shape(engine: str, kind: str, size: int, pods: list[Pod]) -> ShapeReading:
    """A departed role's shape, read from what its members run: the first member's command
    line and environment (none rendered: no flags), which every other member must match."""
    running = [(p, *_running(engine, p)) for p in pods]
    first = next(((p, w, s) for p, w, s in running if w is not None), None)
    if first is None:
        return shape_of(
            engine=engine, role_kind=kind, size=size, wiring=read_wiring(engine=engine, args=[])
        )
    lead, wiring, lead_size = first
    for p, w, s in running:
        diff = () if w is None else disagreement(wiring, w)
        if s != lead_size and w is not None:
            diff = (*diff, (REPLICA_SIZE_ENV, repr(lead_size), repr(s)))
        if diff:
            raise Refusal(
                f"members {lead.name} and {p.name} of departed role run different wirings: "
                f"{_differences(diff, lead.name, p.name)}; which shape the replica has "
                "cannot be decided"
            )
    return shape_of(engine=engine, role_kind=kind, size=size, wiring=wiring)


def _serve_port(main: Container, served: int | None) -> int | None:
    """The port the member really serves on: what a Service routes to it (its
    EndpointSlice entry), else the declared ``http`` container port, else the first one."""
    if served is not None:
        return served
    if not main.ports:
        return None
    named = next((x for x in main.ports if x.name == "http"), main.ports[0])
    return named.container_port


def _served_ports(api: KubeApi, namespace: str) -> dict[str, int]:
    """Pod UID -> the port an EndpointSlice routes to it (the one named ``http`` first).
    Only a hint for the identity probe: a failed list leaves the declared ports."""
    try:
        slices = api.list_namespace_endpoint_slices(namespace=namespace)
    except KubeError:
        return {}
    found: dict[str, tuple[bool, int]] = {}
    for sl in slices:
        ports = [(p.name == "http", p.port) for p in sl.ports if p.port is not None]
        if not ports:
            continue
        best = max(ports, key=lambda x: x[0])
        for e in sl.endpoints:
            if e.target_uid and (e.target_uid not in found or best[0] > found[e.target_uid][0]):
                found[e.target_uid] = (best[0], best[1])
    return {uid: port for uid, (_, port) in found.items()}


def _started(p: Pod) -> bool:
    """Not started is "never started" in the module's sense (``Pod.engine_started``)."""
    return p.engine_started


def _member(
    p: Pod,
    *,
    measured: bool,
    served: int | None = None,
    never_started: bool = False,
    exact: bool = False,
) -> MemberTarget:
    """One admitted member; ``exact``: its engine counts its requests at ``GET /load``
    (read by every drain read of a measured member that started)."""
    name = p.name
    main = p.container(ENGINE_CONTAINER)
    if main is None:
        raise Refusal(f"Pod {name} has no {ENGINE_CONTAINER!r} container")
    status = p.container_status(ENGINE_CONTAINER)
    container_id = status.container_id if status is not None else ""
    if not container_id and not never_started:
        why = (
            "the Pod is Ready"
            if pod_ready(p) == "True"
            else "another member of the replica has started"
        )
        raise Refusal(
            f"container {ENGINE_CONTAINER} of {name} has no container ID (not started) while {why}"
        )
    if not p.pod_ip and not never_started:
        raise Refusal(f"Pod {name} has no address")
    ann = p.annotations
    port = scheme = path = None
    if measured and not never_started:  # a member that never started is never exec'd into
        try:
            port = valid_port(ann.get(ANNOTATION_PROM_PORT))
            scheme = valid_scheme(ann.get(ANNOTATION_PROM_SCHEME))
            path = valid_path(ann.get(ANNOTATION_PROM_PATH))
        except ValueError as e:
            raise Refusal(f"member {name}: {e}; its metrics cannot be read") from e
    labels = dict(p.labels)
    return MemberTarget(
        pod=name,
        uid=p.uid,
        container_id=container_id,
        restart_count=status.restart_count if status is not None else 0,
        ip=p.pod_ip or "",
        member_index=member_index(_as_member(p)),
        measured=measured,
        eligible_at_admission=labels.get(LABEL_ELIGIBLE) == "true",
        serve_port=_serve_port(main, served),
        metrics_port=port,
        metrics_scheme=scheme or "http",
        metrics_path=path or "/metrics",
        exact_load=exact and measured and not never_started,
        labels=labels,
    )


def _workload(api: KubeApi, ns: str, uids: set[str]) -> tuple[str | None, str | None]:
    try:
        workloads = api.list_workloads(namespace=ns)
    except NotFound:  # Kueue is not installed
        return None, None
    for w in workloads:
        if {o.uid for o in w.owners} & uids:
            return w.name, w.uid
    return None, None
