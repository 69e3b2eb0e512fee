"""Rendering ``deploy/`` with the real kustomize (``render``, built by
``testbed/build_kustomize.sh`` when it is not cached), reading the rendered objects
(``find``, ``container``, ``model_namespaces``), and the names both sides agree on: the
overlays, the product's namespace, the llm-d metrics account and the watcher's Lease.
Shared by ``tests/offline/test_deploy_manifests.py`` and ``tests/bed/test_deploy_on_bed.py``."""

from __future__ import annotations

import copy
import functools
import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from testbed.paths import REPO_ROOT, cache_root

DEPLOY = REPO_ROOT / "deploy"
KUSTOMIZE_VERSION = "v5.8.2"  # testbed/build_kustomize.sh's default
BUILD_SCRIPT = REPO_ROOT / "testbed" / "build_kustomize.sh"
#: Every overlay a user may install.
OVERLAYS = (
    "in-cluster-temporal",
    "in-cluster-temporal-plaintext",
    "temporal-cloud",
    "temporal-cloud-mtls",
    "namespaced",
    "cluster-wide",
)
#: The one overlay that grants what changes or ends a replica in every namespace.
CLUSTER_WIDE = "cluster-wide"
#: What renders: the overlays and the CRD for clusters without the gpustack operator.
RENDERED = (*(f"overlays/{o}" for o in OVERLAYS), "crd")
PRODUCT_NS = "llm-retire"
#: The token llm-d's picker authorises (activities/routers/llmd.py; deploy/base/llmd-metrics.yaml).
LLMD_ACCOUNT = "retire-llmd-metrics"
#: The watcher's leader-election Lease, in ``PRODUCT_NS``.
LEASE = "retire-watcher"

Obj = dict[str, Any]


@functools.cache
def kustomize_bin() -> Path:
    """The kustomize binary, built by ``testbed/build_kustomize.sh`` if it is not cached."""
    path = cache_root() / f"kustomize-{KUSTOMIZE_VERSION}" / "bin" / "kustomize"
    if os.access(path, os.X_OK):
        return path
    env = dict(os.environ, KUSTOMIZE_VERSION=KUSTOMIZE_VERSION)
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, f"{BUILD_SCRIPT} failed:\n{done.stderr[-4000:]}"
    built = Path(done.stdout.strip().splitlines()[-1])
    assert built == path and os.access(built, os.X_OK), (built, path)
    return built


@functools.cache
def _rendered(relative: str) -> tuple[Obj, ...]:
    done = subprocess.run(
        [str(kustomize_bin()), "build", str(DEPLOY / relative)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"kustomize build deploy/{relative}:\n{done.stderr}"
    docs = [d for d in yaml.safe_load_all(done.stdout) if d is not None]
    assert all(isinstance(d, dict) for d in docs), f"deploy/{relative}: a document is no object"
    return tuple(docs)


def render(relative: str) -> list[Obj]:
    """The objects ``kustomize build deploy/<relative>`` prints (a fresh copy each call)."""
    return copy.deepcopy(list(_rendered(relative)))


def find(objs: Iterable[Obj], kind: str, name: str, namespace: str | None = None) -> Obj:
    """The one object of that kind and name (and namespace, when given)."""
    found = [
        o
        for o in objs
        if o["kind"] == kind
        and o["metadata"]["name"] == name
        and (namespace is None or o["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"{kind} {namespace or '*'}/{name}: {len(found)} found"
    return found[0]


def container(objs: Iterable[Obj], component: str) -> tuple[Obj, Obj, Obj]:
    """The Deployment of ``component``, its Pod spec and its one container."""
    dep = find(objs, "Deployment", f"retire-{component}", PRODUCT_NS)
    pod = dep["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == [component]
    return dep, pod, pod["containers"][0]


def model_namespaces(objs: Iterable[Obj], role: str = "retire-worker-destructive") -> set[str]:
    """Where the namespaced-grants component binds ``role`` (the worker's label patch, delete
    and exec; ``retire-watcher-label``: the watcher's label patch)."""
    return {
        b["metadata"]["namespace"]
        for b in objs
        if b["kind"] == "RoleBinding" and b["roleRef"]["name"] == role
    }
