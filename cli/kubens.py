"""Which Kubernetes namespace a ``retire`` command means, as kubectl decides it:
``-n/--namespace``, else the current kubeconfig context's namespace, else ``default``;
a reference is ``DEPLOYMENT`` in that namespace or ``NAMESPACE/DEPLOYMENT``."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

#: A Kubernetes namespace name (a DNS label).
K8S_NS = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
#: A ModelDeployment's name (a DNS subdomain).
DEPLOYMENT = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


class RefError(ValueError):
    """A namespace or reference that names nothing."""


def _kubeconfig_contexts() -> tuple[Any, Any]:
    from kubernetes import config

    # Read KUBECONFIG now (the library's default is read once, at its import); a
    # colon-separated list is merged as kubectl merges it.
    path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    contexts, current = config.list_kube_config_contexts(config_file=path)
    return contexts, current


def context_namespace(read: Callable[[], tuple[Any, Any]] = _kubeconfig_contexts) -> str:
    """The current context's namespace (``default`` without one, or without a readable
    kubeconfig: the CLI talks to Temporal, never to the cluster)."""
    try:
        _contexts, current = read()
        ns = (current or {}).get("context", {}).get("namespace")
    except Exception:  # no file, bad YAML, no current context
        return "default"
    return ns if isinstance(ns, str) and K8S_NS.fullmatch(ns) else "default"


def namespace_flag(value: str | None) -> str | None:
    """``-n``'s value checked (None when not given)."""
    if value is not None and not K8S_NS.fullmatch(value):
        raise RefError(f"-n {value!r} is not a Kubernetes namespace name")
    return value


def resolve_ref(ref: str, namespace: str | None, current: Callable[[], str]) -> tuple[str, str]:
    """``NAMESPACE/DEPLOYMENT`` or ``DEPLOYMENT`` (in ``namespace``, else ``current()``)
    → (namespace, deployment).  A reference whose namespace contradicts ``-n`` is refused."""
    ns, slash, md = ref.partition("/")
    if not slash:
        ns, md = namespace or current(), ref
    elif namespace is not None and namespace != ns:
        raise RefError(f"{ref!r} is in namespace {ns!r}, but -n says {namespace!r}")
    if not K8S_NS.fullmatch(ns) or not DEPLOYMENT.fullmatch(md):
        raise RefError(f"{ref!r} is not DEPLOYMENT or NAMESPACE/DEPLOYMENT (lower-case DNS names)")
    return ns, md
