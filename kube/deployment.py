"""A typed view of a gpustack ``ModelDeployment`` (SPEC section 2).

The CRD keeps unknown fields and a user can write almost anything into a role, so the
raw object is parsed once, here, and a malformed one is rejected with a reason a person
can act on (``MalformedDeployment``), instead of a ``TypeError`` deep inside admission or
the watcher.  Parsing is strict about what the project relies on: a role's ``replicas``
must be a non-negative integer (a missing or null count is never read as zero, which
would retire every replica), its name must be one the retirement request accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kube.objects import EnvVar, ObjectRef
from retirement.models import K8S_NAME
from retirement.names import GROUP, KIND, VERSION

__all__ = ["Engine", "MalformedDeployment", "ModelDeployment", "Role", "parse_deployment"]

_NAME = re.compile(K8S_NAME)
ROLE_NAME_MAX = 63


class MalformedDeployment(ValueError):
    """The object cannot be read as a ModelDeployment; ``reason`` says why."""

    def __init__(self, reason: str, *, namespace: str = "", name: str = "", uid: str = "") -> None:
        self.reason, self.namespace, self.name, self.uid = reason, namespace, name, uid
        where = f"ModelDeployment {namespace}/{name}" if name else "ModelDeployment"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True)
class Engine:
    """``spec.engine``."""

    name: str
    version: str = ""


@dataclass(frozen=True)
class Role:
    """One entry of ``spec.roles``."""

    name: str
    replicas: int
    kind: str = "Server"
    size: int = 1
    extra_args: tuple[str, ...] = ()
    command: tuple[str, ...] | None = None  # set: the role replaced its command line
    #: ``env``: what the engine's environment declares (the operator renders it into every
    #: member's ``main`` container); a value given through ``valueFrom`` is not a literal.
    env: tuple[EnvVar, ...] = ()


@dataclass(frozen=True)
class ModelDeployment:
    """What this project reads of a ModelDeployment."""

    namespace: str
    name: str
    uid: str
    engine: Engine
    roles: tuple[Role, ...]
    router: str | None = None  # the router kind; None: router-less
    annotations: Mapping[str, str] = field(default_factory=dict)
    generation: int = 0
    observed_generation: int | None = None
    resource_version: str = ""
    last_consumed_retry_token: str | None = None  # status.retirement's
    #: ``status.retryTokens``: the last token consumed per ``role:ordinal``, kept across
    #: retirements (a re-applied old annotation is a replay for the next one too).
    retry_tokens: Mapping[str, str] = field(default_factory=dict)

    def consumed_token(self, role: str, ordinal: int) -> str | None:
        """The last retry token consumed for ``role:ordinal`` by any retirement."""
        return self.retry_tokens.get(f"{role}:{ordinal}")

    def role(self, name: str) -> Role | None:
        """The declared role ``name``, or None (a departed role)."""
        return next((r for r in self.roles if r.name == name), None)

    @property
    def ref(self) -> ObjectRef:
        """This deployment as an Event's ``involvedObject``."""
        return ObjectRef(
            api_version=f"{GROUP}/{VERSION}",
            kind=KIND,
            namespace=self.namespace,
            name=self.name,
            uid=self.uid,
        )


class _Reader:
    """Field access that turns every type error into a MalformedDeployment."""

    def __init__(self, namespace: str, name: str, uid: str) -> None:
        self.namespace, self.name, self.uid = namespace, name, uid

    def fail(self, reason: str) -> MalformedDeployment:
        return MalformedDeployment(reason, namespace=self.namespace, name=self.name, uid=self.uid)

    def obj(self, raw: Any, where: str, *, required: bool = False) -> Mapping[str, Any]:
        if raw is None and not required:
            return {}
        if not isinstance(raw, Mapping):
            raise self.fail(f"{where} must be an object, not {_kind(raw)}")
        return raw

    def text(self, raw: Any, where: str, *, default: str | None = None) -> str:
        if raw is None and default is not None:
            return default
        if not isinstance(raw, str):
            raise self.fail(f"{where} must be a string, not {_kind(raw)}")
        return raw

    def integer(self, raw: Any, where: str, *, minimum: int, default: int | None = None) -> int:
        if raw is None and default is not None:
            return default
        if not isinstance(raw, int) or isinstance(raw, bool):
            raise self.fail(f"{where} must be an integer, not {_kind(raw)}")
        if raw < minimum:
            raise self.fail(f"{where} must be at least {minimum}, not {raw}")
        return raw

    def env(self, raw: Any, where: str) -> tuple[EnvVar, ...]:
        """A Kubernetes ``env`` list: objects with a string ``name``; a ``value`` that is not
        a string, or a ``valueFrom``, is kept as an entry with no literal value (it matters
        only if the engine reads that variable, and then the shape says so)."""
        if raw is None:
            return ()
        if not isinstance(raw, list):
            raise self.fail(f"{where} must be a list of objects, not {_kind(raw)}")
        out: list[EnvVar] = []
        for i, item in enumerate(raw):
            entry = self.obj(item, f"{where}[{i}]", required=True)
            name = self.text(entry.get("name"), f"{where}[{i}].name")
            value = entry.get("value")
            literal = entry.get("valueFrom") is None and isinstance(value, str | None)
            out.append(EnvVar(name, (value or "") if literal else None))
        return tuple(out)

    def strings(self, raw: Any, where: str) -> tuple[str, ...]:
        if not isinstance(raw, list):
            raise self.fail(f"{where} must be a list of strings, not {_kind(raw)}")
        for i, item in enumerate(raw):
            if not isinstance(item, str):
                raise self.fail(f"{where}[{i}] must be a string, not {_kind(item)}")
        return tuple(raw)


def _kind(raw: Any) -> str:
    return "null" if raw is None else type(raw).__name__


def parse_deployment(raw: Any) -> ModelDeployment:
    """The typed view of a raw ModelDeployment; raises MalformedDeployment with the reason."""
    if not isinstance(raw, Mapping):
        raise MalformedDeployment(f"the object must be a mapping, not {_kind(raw)}")
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        raise MalformedDeployment("metadata.name is missing")
    namespace, name = str(meta.get("namespace") or ""), meta["name"]
    uid = str(meta["uid"]) if isinstance(meta.get("uid"), str) else ""
    r = _Reader(namespace, name, uid)
    annotations = r.obj(meta.get("annotations"), "metadata.annotations")
    for key, value in annotations.items():
        r.text(value, f"metadata.annotations[{key!r}]")
    spec = r.obj(raw.get("spec"), "spec", required=True)
    engine_raw = r.obj(spec.get("engine"), "spec.engine")
    engine = Engine(
        name=r.text(engine_raw.get("name"), "spec.engine.name", default=""),
        version=r.text(engine_raw.get("version"), "spec.engine.version", default=""),
    )
    if spec.get("roles") is None:
        raise r.fail("spec.roles is missing")
    if not isinstance(spec["roles"], list):
        raise r.fail(f"spec.roles must be a list, not {_kind(spec['roles'])}")
    roles = tuple(_role(r, item, i) for i, item in enumerate(spec["roles"]))
    seen: set[str] = set()
    for role in roles:
        if role.name in seen:
            raise r.fail(f"role {role.name!r} is declared twice")
        seen.add(role.name)
    status = r.obj(raw.get("status"), "status")
    observed = status.get("observedGeneration")
    retirement = r.obj(status.get("retirement"), "status.retirement")
    token = retirement.get("lastConsumedRetryToken")
    tokens = status.get("retryTokens")
    kept = (
        {str(k): v for k, v in tokens.items() if isinstance(v, str) and v}
        if isinstance(tokens, dict)
        else {}
    )  # a malformed entry is not a token: never read as a replay of anything
    return ModelDeployment(
        namespace=namespace,
        name=name,
        uid=uid,
        engine=engine,
        roles=roles,
        router=_router(r, spec.get("router")),
        annotations=dict(annotations),
        generation=r.integer(meta.get("generation"), "metadata.generation", minimum=0, default=0),
        observed_generation=None
        if observed is None
        else r.integer(observed, "status.observedGeneration", minimum=0),
        resource_version=r.text(
            meta.get("resourceVersion"), "metadata.resourceVersion", default=""
        ),
        last_consumed_retry_token=token if isinstance(token, str) and token else None,
        retry_tokens=kept,
    )


def _role(r: _Reader, raw: Any, i: int) -> Role:
    where = f"spec.roles[{i}]"
    role = r.obj(raw, where, required=True)
    name = r.text(role.get("name"), f"{where}.name")
    if len(name) > ROLE_NAME_MAX or not _NAME.fullmatch(name):
        raise r.fail(
            f"{where}.name {name[:80]!r} is not a valid role name (lower-case "
            f"letters, digits, '-' and '.', at most {ROLE_NAME_MAX} characters)"
        )
    where = f"role {name!r}"
    if role.get("replicas") is None:
        raise r.fail(f"{where}: replicas is missing")
    command = role.get("command")
    return Role(
        name=name,
        replicas=r.integer(role.get("replicas"), f"{where}: replicas", minimum=0),
        kind=r.text(role.get("kind"), f"{where}: kind", default="Server") or "Server",
        size=r.integer(role.get("size"), f"{where}: size", minimum=1, default=1),
        extra_args=()
        if role.get("extraArgs") is None
        else r.strings(role["extraArgs"], f"{where}: extraArgs"),
        command=None if command is None else r.strings(command, f"{where}: command"),
        env=r.env(role.get("env"), f"{where}: env"),
    )


def _router(r: _Reader, raw: Any) -> str | None:
    """``spec.router``: absent, a kind string, or an object naming the kind in ``name``
    (gpustack's spelling: ``vllm-router``, ``sglang-gateway``, ``llm-d-router``) or
    ``kind`` (this project's CRD).  Both given and different is malformed: which router runs
    decides which observer may prove a withdrawal, so it is never guessed.  Which kinds have
    an observer is not decided here (``activities.routers``): an unknown kind parses, and
    its router Pods read UNKNOWN."""
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw or None
    router = r.obj(raw, "spec.router")
    named = {
        key: r.text(router[key], f"spec.router.{key}")
        for key in ("name", "kind")
        if router.get(key) is not None
    }
    if len(set(named.values())) > 1:
        raise r.fail(
            f"spec.router.name {named['name'][:60]!r} and spec.router.kind "
            f"{named['kind'][:60]!r} disagree"
        )
    return next(iter(named.values()), "") or None
