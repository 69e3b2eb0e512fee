"""Where the test bed finds its binaries and keeps its state.

Binaries are built by ``testbed/build.sh`` into a cache outside the repository, keyed by
version; the versions below are the single source of truth the launcher and the build
script agree on (the script reads them from the environment with the same defaults).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

K8S_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
#: Kueue's Go module, fetched (not built) for its Workload CRD: the real schema, as served.
KUEUE_VERSION = "v0.17.0"

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """The cache of built binaries (``RETIRE_CACHE`` or ``~/.cache/llm-retire``)."""
    env = os.environ.get("RETIRE_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "llm-retire"


def k8s_bin(name: str) -> Path:
    """Path of a Kubernetes binary (``kube-apiserver``, ``kube-controller-manager``)."""
    return cache_root() / f"k8s-{K8S_VERSION}" / "bin" / name


def etcd_bin() -> Path:
    """Path of the etcd server binary."""
    return cache_root() / f"etcd-{ETCD_VERSION}" / "bin" / "etcd"


def kwok_bin() -> Path:
    """Path of the kwok binary."""
    return cache_root() / f"kwok-{KWOK_VERSION}" / "bin" / "kwok"


def kwok_stage_dir() -> Path:
    """The stage files shipped in kwok's module (v0.8.0 has no default stages)."""
    return cache_root() / f"kwok-{KWOK_VERSION}" / "stage"


def gomod_cache() -> Path:
    """The Go module cache ``build.sh`` downloads into (``GOMODCACHE``, else the cache's
    ``gomod``), so the bed reads a module's files where the build put them."""
    env = os.environ.get("GOMODCACHE")
    return Path(env) if env else cache_root() / "gomod"


def kueue_workload_crd() -> Path:
    """Kueue's Workload CRD as its module ships it (serves v1beta1 and v1beta2, stores
    v1beta2; no conversion webhook: the bed runs no Kueue controller)."""
    return (
        gomod_cache()
        / "sigs.k8s.io"
        / f"kueue@{KUEUE_VERSION}"
        / "config/components/crd/bases/kueue.x-k8s.io_workloads.yaml"
    )


def venv_bin(name: str) -> Path:
    """A console script installed beside this interpreter (``temporal``, ``sglang-router``)."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return here
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed; run `make venv`")
    return Path(found)


def missing_binaries() -> list[Path]:
    """The cached binaries (and fetched files) that are not there yet (empty when the bed
    can start)."""
    wanted = [
        k8s_bin("kube-apiserver"),
        k8s_bin("kube-controller-manager"),
        etcd_bin(),
        kwok_bin(),
    ]
    missing = [p for p in wanted if not os.access(p, os.X_OK)]
    return missing + [p for p in [kueue_workload_crd()] if not p.is_file()]
