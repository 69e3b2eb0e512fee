"""``deploy/`` on the real API server of the bed.

- Every rendered manifest (each overlay, and the CRD kustomization) is accepted by a
  server-side apply with ``dryRun=All``.
- The Pods the two Deployments would create pass the "restricted" Pod Security admission
  that the product's namespace enforces (and a Pod without their security context does not).
- Each ServiceAccount's own token (TokenRequest) does what its code calls, through the
  product's own ``kube`` layer, and is refused (403) a sample of what it must never do: the
  watcher deleting, exec'ing or writing a status; the worker watching, taking a Lease or
  writing a spec.  The default grants a Pod's label, delete and exec in the model namespaces
  only; the cluster-wide overlay in every namespace.
- llm-d's picker token (ServiceAccount ``retire-llmd-metrics``) may read ``/metrics`` and
  nothing else, as the picker's SubjectAccessReview asks; the worker's own token may not.
- A whole retirement runs with the worker (``python -m worker``) and the watcher
  (``python -m watcher --leader-elect``) each on its own ServiceAccount's token, and neither
  logs a refusal.

The Deployments themselves are not run (kwok fakes Pods; no kubelet runs the image): their
Pods are dry-run created, and the processes run here with the same ServiceAccounts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import ssl
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.dynamic import DynamicClient
from temporalio.testing import WorkflowEnvironment

from kube.client import Kube
from kube.errors import Forbidden, KubeError
from kube.events import post_event
from kube.members import LabelChange, set_eligibility
from kube.objects import ObjectRef
from kube.watching import list_objects, watch_objects
from retirement.models import RetirementState, workflow_id_for
from retirement.names import FIELD_MANAGER as PRODUCT_MANAGER
from retirement.names import (
    GROUP,
    KIND,
    KUEUE_WORKLOAD_API,
    LABEL_ELIGIBLE,
    PLURAL,
    VERSION,
)
from retirement.phases import Outcome
from testbed.bed import Bed
from testbed.procs import Child
from tests.bed.conftest import Ctx, create_md
from tests.bed.support import pods_of, scale, serving
from tests.helpers import eventually, eventually_in_thread, model_deployment
from tests.helpers.deploy_render import (
    CLUSTER_WIDE,
    LEASE,
    LLMD_ACCOUNT,
    OVERLAYS,
    PRODUCT_NS,
    RENDERED,
    container,
    model_namespaces,
    render,
)

pytestmark = pytest.mark.bed

Obj = dict[str, Any]
FIELD_MANAGER = "llm-retire-bed-test"
RBAC_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
}
AUDIENCE = "https://kubernetes.default.svc"  # the bed's --service-account-issuer
BUDGETS = (
    '{"overall_s": 60, "withdrawal_s": 15, "drain_s": 8, "settle_s": 15, "poll_interval_s": 0.5}'
)


# ---------------------------------------------------------------------------- helpers


def apply(dyn: DynamicClient, obj: Obj, *, dry_run: bool) -> Any:
    """Server-side apply of one rendered object (``dryRun=All`` when ``dry_run``)."""
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    extra: dict[str, Any] = {"dry_run": "All"} if dry_run else {}
    return resource.server_side_apply(
        body=obj,
        namespace=obj["metadata"].get("namespace"),
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
        **extra,
    )


def ensure_namespaces(api: client.ApiClient, objs: list[Obj]) -> None:
    """Create (for real) the Namespaces the objects ship and the ones they live in: a dry
    run of a namespaced object needs its namespace to exist."""
    dyn = DynamicClient(api)
    for o in objs:
        if o["kind"] == "Namespace":
            apply(dyn, o, dry_run=False)
    core = client.CoreV1Api(api)
    for ns in sorted({o["metadata"].get("namespace") for o in objs} - {None}):
        with contextlib.suppress(ApiException):  # 409: it exists
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        # A Pod is admitted only once its namespace's default ServiceAccount exists.
        eventually(
            functools.partial(core.read_namespaced_service_account, "default", ns),
            what=f"namespace {ns} default ServiceAccount",
            ignore=(ApiException,),
        )


@contextlib.contextmanager
def installed(
    api: client.ApiClient, overlay: str, *, models: str | None = None
) -> Iterator[list[Obj]]:
    """The overlay's ServiceAccounts and RBAC, applied for real, deleted afterwards (the
    product's Namespace stays).  ``models``: the model namespace the overlay's example
    ("models") stands for, as an installer lists its own."""
    objs = [o for o in render(f"overlays/{overlay}") if o["kind"] in RBAC_KINDS]
    if models is not None:
        for o in objs:
            if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] != PRODUCT_NS:
                o["metadata"]["namespace"] = models
    ensure_namespaces(api, objs)
    dyn = DynamicClient(api)
    done: list[Obj] = []
    try:
        for o in objs:
            if o["kind"] != "Namespace":
                apply(dyn, o, dry_run=False)
                done.append(o)
        yield objs
    finally:
        for o in reversed(done):
            resource = dyn.resources.get(api_version=o["apiVersion"], kind=o["kind"])
            with contextlib.suppress(Exception):
                resource.delete(
                    name=o["metadata"]["name"], namespace=o["metadata"].get("namespace")
                )


def token(api: client.ApiClient, account: str) -> str:
    """A fresh token of the ServiceAccount ``llm-retire/<account>`` (TokenRequest)."""
    req = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[AUDIENCE], expiration_seconds=3600)
    )
    answer = client.CoreV1Api(api).create_namespaced_service_account_token(account, PRODUCT_NS, req)
    return str(answer.status.token)


def kubeconfig(bed: Bed, bearer: str, path: Path) -> Path:
    """A kubeconfig of the bed's API server that authenticates with ``bearer`` only."""
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "bed",
                        "cluster": {
                            "server": bed.cp.server,
                            "certificate-authority": str(bed.cp.pki.ca_cert),
                        },
                    }
                ],
                "users": [{"name": "sa", "user": {"token": bearer}}],
                "contexts": [{"name": "sa", "context": {"cluster": "bed", "user": "sa"}}],
                "current-context": "sa",
            }
        )
    )
    return path


def as_account(
    bed: Bed, api: client.ApiClient, account: str, tmp_path: Path
) -> tuple[Kube, client.ApiClient, Path]:
    """The product's ``Kube``, a plain client and a kubeconfig, on ``account``'s token."""
    path = kubeconfig(bed, token(api, account), tmp_path / f"{account}.kubeconfig")
    kube = Kube.from_config(kubeconfig=str(path), connections=4)
    return kube, kube.api, path


def status(call: Callable[[], object]) -> int:
    """The HTTP status of a call: 200 when it returned, else the error's."""
    try:
        result = call()
    except ApiException as e:
        return int(e.status or 0)
    except KubeError as e:
        return e.status
    close = getattr(result, "release_conn", None)  # a raw (watch) response
    if close is not None:
        close()
    return 200


def refused(call: Callable[[], object], what: str) -> None:
    got = status(call)
    assert got == 403, f"{what}: HTTP {got}, not 403"


def granted(call: Callable[[], object], what: str, *, allow: tuple[int, ...] = (200, 201)) -> None:
    """The call got past authorization (a 404 of a kind that is not installed, or a 400 of
    an exec without an upgrade, is past it: RBAC answers before either)."""
    got = status(call)
    assert got in allow, f"{what}: HTTP {got}, expected one of {allow}"


def past_rbac(call: Callable[[], object], what: str) -> None:
    """The call was authorized, whatever came after (an exec without the websocket upgrade
    of a Pod no node runs answers 400; RBAC answers 403 before any of that)."""
    got = status(call)
    assert got not in (0, 401, 403), f"{what}: HTTP {got}"


def plain_pod(api: client.ApiClient, namespace: str, name: str) -> Obj:
    """A Pod that nothing runs (no node): enough to read, label, exec-authorize, delete."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "probe"}},
        "spec": {"containers": [{"name": "main", "image": "none"}]},
    }
    created: Obj = (
        DynamicClient(api)
        .resources.get(api_version="v1", kind="Pod")
        .create(body=body, namespace=namespace)
        .to_dict()
    )
    return created


def exec_get(api: client.ApiClient, ns: str, pod: str) -> Callable[[], object]:
    """A GET of pods/exec without the websocket upgrade: RBAC (get, and create since 1.35)
    answers 403 first; past it, the server asks for the upgrade (400)."""
    return lambda: client.CoreV1Api(api).connect_get_namespaced_pod_exec(
        pod, ns, command=["true"], container="main", stdout=True
    )


def exec_post(api: client.ApiClient, ns: str, pod: str) -> Callable[[], object]:
    """The SPDY-style POST of pods/exec (verb create), without the upgrade."""
    return lambda: client.CoreV1Api(api).connect_post_namespaced_pod_exec(
        pod, ns, command=["true"], container="main", stdout=True
    )


def lease_body(name: str) -> client.V1Lease:
    return client.V1Lease(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1LeaseSpec(holder_identity="bed-test", lease_duration_seconds=5),
    )


def delete_lease(api: client.ApiClient, name: str = LEASE) -> None:
    with contextlib.suppress(ApiException):
        client.CoordinationV1Api(api).delete_namespaced_lease(name, PRODUCT_NS)


# ============================================================================ tests


@pytest.mark.parametrize("relative", RENDERED)
def test_every_manifest_is_accepted_by_a_server_side_dry_run(
    bed: Bed, api: client.ApiClient, relative: str
) -> None:
    objs = render(relative)
    ensure_namespaces(api, objs)
    dyn = DynamicClient(api)
    for o in objs:
        try:
            answer = apply(dyn, o, dry_run=True)
        except Exception as e:
            pytest.fail(f"{relative}: {o['kind']} {o['metadata']['name']}: {e}")
        assert answer.metadata.name == o["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pods_pass_the_restricted_pod_security_admission(
    bed: Bed, api: client.ApiClient, overlay: str
) -> None:
    objs = render(f"overlays/{overlay}")
    namespace = next(o for o in objs if o["kind"] == "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    pods = DynamicClient(api).resources.get(api_version="v1", kind="Pod")
    with installed(api, overlay):  # the ServiceAccounts the Pods name must exist
        for component in ("worker", "watcher"):
            dep, pod_spec, _ctr = container(objs, component)
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "generateName": f"{dep['metadata']['name']}-",
                    "labels": dep["spec"]["template"]["metadata"]["labels"],
                },
                "spec": pod_spec,
            }
            pods.create(body=body, namespace=PRODUCT_NS, dry_run="All")
            # The control: without its security context the same Pod is refused, so the
            # namespace really enforces the standard.
            bare_spec: Obj = {
                **pod_spec,
                "securityContext": {},
                "containers": [
                    {k: v for k, v in c.items() if k != "securityContext"}
                    for c in pod_spec["containers"]
                ],
            }
            bare = {**body, "spec": bare_spec}
            with pytest.raises(Exception) as err:
                pods.create(body=bare, namespace=PRODUCT_NS, dry_run="All")
            assert "PodSecurity" in str(err.value), err.value


def test_each_token_does_what_its_code_calls_and_nothing_of_the_other(
    bed: Bed, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ns = namespace
    create_md(api, ns, model_deployment("md", replicas=1))
    victim = plain_pod(api, ns, "victim")
    spare = plain_pod(api, ns, "spare")
    group, version, plural = KUEUE_WORKLOAD_API
    delete_lease(api)
    with installed(api, "in-cluster-temporal", models=ns):
        wk, wapi, _ = as_account(bed, api, "retire-worker", tmp_path)
        tk, tapi, _ = as_account(bed, api, "retire-watcher", tmp_path)
        md_ref = ObjectRef(
            api_version=f"{GROUP}/{VERSION}", kind=KIND, namespace=ns, name="md", uid=""
        )

        # ---- the worker: what its activities call, through the product's kube layer.
        granted(lambda: wk.get_deployment(namespace=ns, name="md"), "worker get md")
        granted(
            lambda: wk.patch_deployment_status(
                namespace=ns, name="md", patch={"status": {"retirement": None}}
            ),
            "worker patch md/status",
        )
        granted(lambda: wk.list_pods(namespace=ns, selector="a=b"), "worker list pods")
        granted(lambda: wk.read_pod(namespace=ns, name="victim"), "worker get pod")
        assert (
            set_eligibility(
                wk,
                namespace=ns,
                name="victim",
                uid=victim["metadata"]["uid"],
                current=None,
                eligible=True,
            )
            is LabelChange.APPLIED
        )
        granted(lambda: wk.list_services(namespace=ns), "worker list services")
        granted(lambda: wk.list_namespace_endpoint_slices(namespace=ns), "worker list slices")
        assert post_event(
            wk, about=md_ref, tag="t", key=uuid.uuid4().hex, reason="Probe", message="worker"
        )
        # The bed serves Kueue's Workload CRD: the list is allowed; a Workload that does not
        # exist is a 404, which is past authorization (RBAC answers 403 first).
        granted(lambda: wk.list_workloads(namespace=ns), "worker list workloads", allow=(200,))
        granted(
            lambda: wk.get_workload(namespace=ns, name="w"), "worker get workload", allow=(404,)
        )
        granted(
            lambda: wk.delete_workload(namespace=ns, name="w", uid="u"),
            "worker delete workload",
            allow=(404,),
        )
        past_rbac(exec_get(wapi, ns, "victim"), "worker exec (get)")
        past_rbac(exec_post(wapi, ns, "victim"), "worker exec (create)")
        granted(
            lambda: wk.delete_pod(namespace=ns, name="victim", uid=victim["metadata"]["uid"]),
            "worker delete pod",
        )
        # ... and a sample of what it must not.
        wcore, wcustom = client.CoreV1Api(wapi), client.CustomObjectsApi(wapi)
        wcoord = client.CoordinationV1Api(wapi)
        refused(
            lambda: wcore.list_namespaced_pod(
                ns, watch=True, timeout_seconds=1, _preload_content=False
            ),
            "worker watch pods",
        )
        refused(
            lambda: wcustom.list_namespaced_custom_object(
                GROUP, VERSION, ns, PLURAL, watch=True, timeout_seconds=1, _preload_content=False
            ),
            "worker watch modeldeployments",
        )
        refused(
            lambda: wcoord.create_namespaced_lease(PRODUCT_NS, lease_body(LEASE)), "worker lease"
        )
        refused(lambda: wcoord.read_namespaced_lease(LEASE, PRODUCT_NS), "worker read lease")
        refused(
            lambda: wk.patch_deployment(
                namespace=ns, name="md", patch={"metadata": {"annotations": {"x": "y"}}}
            ),
            "worker patch md",
        )
        refused(lambda: wk.list_deployments(namespace=ns), "worker list md")
        refused(
            lambda: wcustom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "md"),
            "worker delete md",
        )
        refused(lambda: wcore.list_namespaced_secret(ns), "worker list secrets")
        refused(
            lambda: wcore.create_namespaced_pod(
                ns,
                client.V1Pod.from_dict(
                    {
                        "metadata": {"name": "x"},
                        "spec": {"containers": [{"name": "c", "image": "i"}]},
                    }
                ),
            ),
            "worker create pod",
        )

        # ---- the watcher: list+watch, labels, annotations, Events, its Lease.
        granted(lambda: list_objects(tk, "pods"), "watcher list pods everywhere")
        granted(lambda: list_objects(tk, "modeldeployments"), "watcher list md everywhere")
        _, rv = list_objects(tk, "pods", namespace=ns)
        granted(
            lambda: list(watch_objects(tk, "pods", namespace=ns, resource_version=rv, seconds=1)),
            "watcher watch pods",
        )
        _, rv = list_objects(tk, "modeldeployments")
        granted(
            lambda: list(watch_objects(tk, "modeldeployments", resource_version=rv, seconds=1)),
            "watcher watch md",
        )
        granted(lambda: tk.list_deployments(), "watcher list md")
        granted(lambda: tk.get_deployment(namespace=ns, name="md"), "watcher get md")
        granted(
            lambda: tk.patch_deployment(
                namespace=ns, name="md", patch={"metadata": {"annotations": {"x": None}}}
            ),
            "watcher patch md",
        )
        granted(lambda: tk.list_pods(namespace=ns, selector="a=b"), "watcher list pods")
        granted(lambda: tk.read_pod(namespace=ns, name="spare"), "watcher get pod")
        assert (
            set_eligibility(
                tk,
                namespace=ns,
                name="spare",
                uid=spare["metadata"]["uid"],
                current=None,
                eligible=True,
            )
            is LabelChange.APPLIED
        )
        assert post_event(
            tk, about=md_ref, tag="t", key=uuid.uuid4().hex, reason="Probe", message="watcher"
        )
        tcore, tcustom = client.CoreV1Api(tapi), client.CustomObjectsApi(tapi)
        tcoord = client.CoordinationV1Api(tapi)
        granted(
            lambda: tcoord.create_namespaced_lease(PRODUCT_NS, lease_body(LEASE)),
            "watcher create lease",
        )
        lease = tcoord.read_namespaced_lease(LEASE, PRODUCT_NS)
        granted(
            lambda: tcoord.replace_namespaced_lease(LEASE, PRODUCT_NS, lease),
            "watcher update lease",
        )
        # ... and a sample of what it must not.
        refused(
            lambda: tk.delete_pod(namespace=ns, name="spare", uid=spare["metadata"]["uid"]),
            "watcher delete pod",
        )
        assert tcore.read_namespaced_pod("spare", ns) is not None  # still there
        refused(exec_get(tapi, ns, "spare"), "watcher exec (get)")
        refused(exec_post(tapi, ns, "spare"), "watcher exec (create)")
        result = tk.exec_pod(
            namespace=ns, name="spare", container="main", argv=["true"], timeout_s=5, output_cap=64
        )
        assert result.error and result.stdout == "", result  # the product's websocket exec
        refused(
            lambda: tcustom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "md"),
            "watcher delete md",
        )
        # It clears status.retirement of a terminated retirement (watcher/reconcile.py).
        granted(
            lambda: tk.patch_deployment_status(
                namespace=ns, name="md", patch={"status": {"retirement": None}}
            ),
            "watcher patch md/status",
        )
        refused(
            lambda: tcustom.delete_namespaced_custom_object(group, version, ns, plural, "w"),
            "watcher delete workload",
        )
        refused(lambda: tk.list_services(namespace=ns), "watcher list services")
        refused(lambda: tk.list_namespace_endpoint_slices(namespace=ns), "watcher list slices")
        refused(lambda: tcoord.create_namespaced_lease(ns, lease_body(LEASE)), "lease elsewhere")
        refused(
            lambda: tcoord.read_namespaced_lease("someone-else", PRODUCT_NS),
            "watcher read another lease",
        )
        refused(
            lambda: tcoord.delete_namespaced_lease(LEASE, PRODUCT_NS), "watcher delete its lease"
        )
        refused(lambda: tcore.list_namespaced_secret(ns), "watcher list secrets")
        with pytest.raises(Forbidden):
            tk.delete_pod(namespace=ns, name="spare", uid=spare["metadata"]["uid"])
    delete_lease(api)


def label(api: client.ApiClient, ns: str, pod: str) -> Callable[[], object]:
    """A label patch of a Pod (what ``set_eligibility`` sends, without its UID test)."""
    body = {"metadata": {"labels": {"llm-retire.test/probe": uuid.uuid4().hex[:8]}}}
    return lambda: client.CoreV1Api(api).patch_namespaced_pod(pod, ns, body)


@pytest.mark.parametrize("overlay", ["in-cluster-temporal", "namespaced"])
def test_the_default_grants_label_delete_and_exec_only_in_the_model_namespaces(
    bed: Bed, api: client.ApiClient, namespace: str, tmp_path: Path, overlay: str
) -> None:
    objs = render(f"overlays/{overlay}")
    (models,) = model_namespaces(objs)  # the example names one
    name = f"p-{uuid.uuid4().hex[:6]}"
    with installed(api, overlay):  # creates the model namespace too
        inside = plain_pod(api, models, name)
        outside = plain_pod(api, namespace, name)
        wk, wapi, _ = as_account(bed, api, "retire-worker", tmp_path)
        _tk, tapi, _ = as_account(bed, api, "retire-watcher", tmp_path)
        # Reads stay cluster-wide ...
        granted(lambda: wk.read_pod(namespace=namespace, name=name), "read outside")
        # ... the label, for the worker and the watcher, only inside ...
        granted(label(wapi, models, name), "worker label inside", allow=(200,))
        granted(label(tapi, models, name), "watcher label inside", allow=(200,))
        refused(label(wapi, namespace, name), "worker label outside")
        refused(label(tapi, namespace, name), "watcher label outside")
        # ... delete and exec only inside.
        past_rbac(exec_get(wapi, models, name), "exec inside")
        past_rbac(exec_post(wapi, models, name), "exec (create) inside")
        refused(exec_get(wapi, namespace, name), "exec outside")
        refused(exec_post(wapi, namespace, name), "exec (create) outside")
        refused(
            lambda: wk.delete_pod(namespace=namespace, name=name, uid=outside["metadata"]["uid"]),
            "delete outside",
        )
        granted(
            lambda: wk.delete_pod(namespace=models, name=name, uid=inside["metadata"]["uid"]),
            "delete inside",
        )
        group, version, plural = KUEUE_WORKLOAD_API
        wcustom = client.CustomObjectsApi(wapi)
        refused(
            lambda: wcustom.delete_namespaced_custom_object(group, version, namespace, plural, "w"),
            "delete workload outside",
        )
        granted(
            lambda: wcustom.delete_namespaced_custom_object(group, version, models, plural, "w"),
            "delete workload inside",
            allow=(404,),
        )


def test_the_cluster_wide_overlay_grants_them_everywhere(
    bed: Bed, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    name = f"p-{uuid.uuid4().hex[:6]}"
    with installed(api, CLUSTER_WIDE):
        pod = plain_pod(api, namespace, name)
        wk, wapi, _ = as_account(bed, api, "retire-worker", tmp_path)
        _tk, tapi, _ = as_account(bed, api, "retire-watcher", tmp_path)
        granted(label(wapi, namespace, name), "worker label", allow=(200,))
        granted(label(tapi, namespace, name), "watcher label", allow=(200,))
        past_rbac(exec_get(wapi, namespace, name), "worker exec")
        refused(exec_get(tapi, namespace, name), "watcher exec")
        granted(
            lambda: wk.delete_pod(namespace=namespace, name=name, uid=pod["metadata"]["uid"]),
            "worker delete",
        )


def test_the_picker_token_reads_metrics_and_nothing_else(
    bed: Bed, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    """What llm-d's picker asks the API server before it serves its /metrics (a
    SubjectAccessReview of get on the non-resource URL /metrics) is allowed for the
    dedicated token's ServiceAccount and not for the worker's; with the token itself, the
    API server's own /metrics answers and every call the worker makes is refused."""
    name = f"p-{uuid.uuid4().hex[:6]}"
    with installed(api, "in-cluster-temporal", models=namespace):
        pod = plain_pod(api, namespace, name)
        authz = client.AuthorizationV1Api(api)

        def may_read_metrics(account: str) -> bool:
            review = client.V1SubjectAccessReview(
                spec=client.V1SubjectAccessReviewSpec(
                    user=f"system:serviceaccount:{PRODUCT_NS}:{account}",
                    groups=["system:serviceaccounts", f"system:serviceaccounts:{PRODUCT_NS}"],
                    non_resource_attributes=client.V1NonResourceAttributes(
                        path="/metrics", verb="get"
                    ),
                )
            )
            return bool(authz.create_subject_access_review(review).status.allowed)

        assert may_read_metrics(LLMD_ACCOUNT)
        assert not may_read_metrics("retire-worker")
        assert not may_read_metrics("retire-watcher")
        rk, rapi, _ = as_account(bed, api, LLMD_ACCOUNT, tmp_path)
        ca = ssl.create_default_context(cafile=str(bed.cp.pki.ca_cert))
        with httpx.Client(verify=ca, trust_env=False, timeout=10) as http:
            answer = http.get(
                bed.cp.server + "/metrics",
                headers={"Authorization": f"Bearer {token(api, LLMD_ACCOUNT)}"},
            )
        assert answer.status_code == 200 and "apiserver_request_total" in answer.text
        refused(lambda: rk.read_pod(namespace=namespace, name=name), "reader get pod")
        refused(lambda: rk.list_pods(namespace=namespace, selector="a=b"), "reader list pods")
        refused(label(rapi, namespace, name), "reader label")
        refused(exec_get(rapi, namespace, name), "reader exec")
        refused(
            lambda: rk.delete_pod(namespace=namespace, name=name, uid=pod["metadata"]["uid"]),
            "reader delete",
        )
        refused(lambda: client.CoreV1Api(rapi).list_namespaced_secret(PRODUCT_NS), "secrets")


@pytest.mark.asyncio(loop_scope="session")
async def test_a_retirement_runs_with_each_process_on_its_own_token(
    bed: Bed, api: client.ApiClient, dev_env: WorkflowEnvironment, namespace: str, tmp_path: Path
) -> None:
    """The worker and the watcher as processes, each given only its ServiceAccount's token:
    a scale-down 2 -> 1 is retired (disqualify, withdraw, drain through pods/exec, delete,
    settle, status and Events), the watcher leads through its Lease and is ready, and neither
    process was refused anything."""
    ns, name = namespace, "tokens"
    queue = f"retire-{uuid.uuid4().hex[:8]}"
    target = dev_env.client.service_client.config.target_host
    ctx = Ctx(bed=bed, client=dev_env.client, queue=queue, core=client.CoreV1Api(api), ns=ns)
    create_md(api, ns, model_deployment(name, replicas=2))
    bed.operator(ns)
    await asyncio.to_thread(serving, ctx, name, 2)
    victim = pods_of(ctx, name, 1)[0]
    delete_lease(api)
    children: list[Child] = []
    logs = bed.state_dir / "logs"
    with installed(api, "in-cluster-temporal", models=ns):
        _, _, worker_kc = as_account(bed, api, "retire-worker", tmp_path)
        _, _, watcher_kc = as_account(bed, api, "retire-watcher", tmp_path)
        try:
            worker = Child(
                name="worker-sa",
                argv=[
                    sys.executable, "-m", "worker",
                    "--kubeconfig", str(worker_kc),
                    "--address", target,
                    "--task-queue", queue,
                    "--max-concurrent-activities", "16",
                ],
                log_path=logs / f"worker-sa-{ns}.log",
            )  # fmt: skip
            children.append(worker)
            await eventually_in_thread(
                lambda: "worker on" in worker.log_tail(50) or not worker.alive(),
                what="the worker polls",
                timeout=60,
            )
            assert worker.alive(), worker.log_tail(50)
            watcher = Child(
                name="watcher-sa",
                argv=[
                    sys.executable, "-m", "watcher",
                    "--kubeconfig", str(watcher_kc),
                    "--address", target,
                    "--task-queue", queue,
                    "--watch-namespace", ns,
                    "--resync", "1",
                    "--budgets", BUDGETS,
                    "--routerless-policy", "quiet-window",
                    "--quiet-window", "0.5",
                    "--health-address", "127.0.0.1:0",
                    "--leader-elect",
                    "--lease-namespace", PRODUCT_NS,
                    "--lease-name", LEASE,
                    "--lease-seconds", "4",
                    "--identity", "watcher-sa",
                ],
                log_path=logs / f"watcher-sa-{ns}.log",
            )  # fmt: skip
            children.append(watcher)
            coord = client.CoordinationV1Api(api)
            await eventually_in_thread(
                lambda: (
                    coord.read_namespaced_lease(LEASE, PRODUCT_NS).spec.holder_identity
                    == "watcher-sa"
                ),
                what="the watcher leads through its Lease",
                timeout=30,
                ignore=(ApiException,),
            )
            line = await eventually_in_thread(
                lambda: re.search(r"health (http://\S+)", watcher.log_tail(100)),
                what="the watcher's health address",
            )
            health = line.group(1)

            def ready() -> bool:
                """Ready as the acting watcher (a standby is ready too): leading, and a
                healthy pass, which needs its informers' list and watch to succeed."""
                with httpx.Client(trust_env=False, timeout=5) as http:
                    if http.get(health + "/readyz").status_code != 200:
                        return False
                    metrics = http.get(health + "/metrics").text
                leader = re.search(r"^retire_watcher_is_leader (\S+)$", metrics, re.M)
                last = re.search(
                    r"^retire_watcher_last_healthy_pass_timestamp_seconds (\S+)$", metrics, re.M
                )
                if leader is None or last is None:
                    return False
                return float(leader.group(1)) == 1 and float(last.group(1)) > 0

            await eventually_in_thread(ready, what="the watcher is ready", timeout=60)

            scale(ctx, name, 1)
            await eventually_in_thread(
                lambda: not pods_of(ctx, name, 1),
                what="ordinal 1 retired",
                timeout=90,
                ignore=(ApiException,),
            )
            handle = dev_env.client.get_workflow_handle(
                workflow_id_for(namespace=ns, deployment=name), result_type=RetirementState
            )
            st: RetirementState = await asyncio.wait_for(handle.result(), 60)
            assert st.outcome is Outcome.COMPLETED, st.reasons
            assert st.target is not None and st.target.uids == [victim.metadata.uid]
            (left,) = pods_of(ctx, name)
            assert (left.metadata.labels or {}).get(LABEL_ELIGIBLE) == "true"
            # The worker's mirror went through: status.retirement, then the phase Events.
            custom = client.CustomObjectsApi(api)

            def mirrored() -> bool:
                """The worker wrote the status subresource (its field manager owns a status
                entry) and, the retirement having completed, cleared status.retirement
                (absent means no operation, SPEC section 8)."""
                md = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                wrote = any(
                    m.get("manager") == PRODUCT_MANAGER and m.get("subresource") == "status"
                    for m in md["metadata"].get("managedFields") or []
                )
                return wrote and "retirement" not in (md.get("status") or {})

            await eventually_in_thread(
                mirrored, what="status written, then cleared, by the worker", timeout=30
            )
            events = client.CoreV1Api(api).list_namespaced_event(ns).items
            assert any(
                e.involved_object.name == name and (e.reason or "").startswith("Retirement")
                for e in events
            ), [(e.involved_object.name, e.reason) for e in events]
            # Neither process was refused anything on the way.  (Not a log line's own
            # milliseconds: "12:24:05,403" is no refusal; CI once failed on one.)
            for child in children:
                text = child.log_path.read_text(errors="replace")
                assert not re.search(r"(?<!,)\b403\b|Forbidden|forbidden", text), (
                    f"{child.name} was refused:\n{child.log_tail(80)}"
                )
        finally:
            for child in children:
                child.stop(timeout=10)
            delete_lease(api)


def test_the_bed_tokens_authenticate_as_the_service_accounts(
    bed: Bed, api: client.ApiClient, tmp_path: Path
) -> None:
    """The tokens above are the ServiceAccounts' (not the admin's): SelfSubjectReview."""
    with installed(api, "in-cluster-temporal"):
        for account in ("retire-worker", "retire-watcher", LLMD_ACCOUNT):
            _kube, sa_api, _ = as_account(bed, api, account, tmp_path)
            review = client.AuthenticationV1Api(sa_api).create_self_subject_review(
                client.V1SelfSubjectReview(
                    api_version="authentication.k8s.io/v1", kind="SelfSubjectReview"
                )
            )
            assert review.status.user_info.username == (
                f"system:serviceaccount:{PRODUCT_NS}:{account}"
            )
    for account in ("retire-worker", "retire-watcher", LLMD_ACCOUNT):  # and gone afterwards
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(api).read_namespaced_service_account(account, PRODUCT_NS)
        assert err.value.status == 404
