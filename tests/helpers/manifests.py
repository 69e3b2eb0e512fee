"""The ModelDeployment manifests tests create: one builder, so every test writes the same
shape (SPEC section 2) and a change of the CRD is made in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from retirement.names import GROUP, KIND, VERSION

__all__ = ["model_deployment", "role"]


def role(
    name: str,
    *,
    replicas: int,
    size: int = 1,
    kind: str = "Server",
    extra_args: Sequence[str] | None = None,
) -> dict[str, Any]:
    """One ``spec.roles`` entry (``extraArgs`` only when given)."""
    out: dict[str, Any] = {"name": name, "kind": kind, "replicas": replicas, "size": size}
    if extra_args is not None:
        out["extraArgs"] = list(extra_args)
    return out


def model_deployment(
    name: str,
    *,
    engine: str = "vLLM",
    version: str = "0.29.0",
    replicas: int = 2,
    size: int = 1,
    router: str | None = None,
    extra_args: Sequence[str] | None = None,
    role_name: str = "server",
    extra_roles: Sequence[Mapping[str, Any]] = (),
    namespace: str | None = None,
    uid: str | None = None,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A ModelDeployment manifest: one Server role ``role_name``, then ``extra_roles``.

    ``router`` is the router kind (None: router-less). ``namespace``, ``uid`` and
    ``annotations`` are set in the metadata only when given (the API server fills in
    namespace and uid on create; fakes of the Kubernetes layer need them up front).
    """
    spec: dict[str, Any] = {
        "engine": {"name": engine, "version": version},
        "roles": [
            role(role_name, replicas=replicas, size=size, extra_args=list(extra_args or [])),
            *(dict(r) for r in extra_roles),
        ],
    }
    if router:
        spec["router"] = {"kind": router}
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if uid is not None:
        metadata["uid"] = uid
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": metadata, "spec": spec}
