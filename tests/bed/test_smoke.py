"""The bed is real: kwok Pods, exec through the API server, EndpointSlices, preconditions,
the status subresource, RBAC, the SGLang gateway's discovery, and the Temporal dev server."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import httpx
import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.stream import stream

from retirement.names import (
    ANNOTATION_PROM_PORT,
    GROUP,
    LABEL_ELIGIBLE,
    LABEL_INSTANCE,
    PLURAL,
    VERSION,
)
from testbed.bed import Bed
from testbed.procs import free_port
from testbed.temporal_dev import load_config, start_dev_server, ui_ok
from tests.bed.conftest import create_md
from tests.helpers import eventually, model_deployment

pytestmark = pytest.mark.bed


def ready_pods(core: client.CoreV1Api, ns: str, md: str, n: int) -> list[client.V1Pod]:
    def check() -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(ns, label_selector=f"{LABEL_INSTANCE}={md}").items
        ok = [
            p
            for p in pods
            if p.status.phase == "Running"
            and p.status.pod_ip
            and LABEL_ELIGIBLE in (p.metadata.labels or {})
        ]
        return ok if len(ok) == n else None

    result: list[client.V1Pod] = eventually(
        check, what=f"{n} ready eligible pods", timeout=60, ignore=(Exception,)
    )
    return result


def test_model_deployment_pods_run_ready_and_exec_reads_metrics(
    bed: Bed,
    api: client.ApiClient,
    namespace: str,
) -> None:
    create_md(api, namespace, model_deployment("md1", replicas=1))
    bed.operator(namespace)
    core = client.CoreV1Api(api)
    (pod,) = ready_pods(core, namespace, "md1", 1)
    conds = {c.type: c.status for c in pod.status.conditions}
    assert conds["Ready"] == "True" and pod.status.phase == "Running"
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(bed.net.pod_cidr)
    main = next(s for s in pod.status.container_statuses if s.name == "main")
    assert main.container_id.startswith("kwok://")
    port = pod.metadata.annotations[ANNOTATION_PROM_PORT]
    # A python3 one-shot, exec'd through the API server (websocket) into `main`, reads the
    # emulator's metrics over the namespace's loopback.
    script = (
        "import sys,urllib.request as u;"
        "o=u.build_opener(u.ProxyHandler({}));"
        "print(o.open('http://127.0.0.1:'+sys.argv[1]+'/metrics',timeout=2).read().decode())"
    )
    out = stream(
        core.connect_get_namespaced_pod_exec,
        pod.metadata.name,
        namespace,
        container="main",
        command=["python3", "-c", script, port],
        stderr=True,
        stdin=False,
        stdout=True,
        tty=False,
        _request_timeout=10,
    )
    assert "vllm:num_requests_running" in out and "vllm:prompt_tokens_total" in out


def test_endpointslice_follows_the_eligibility_label(
    bed: Bed,
    api: client.ApiClient,
    namespace: str,
) -> None:
    create_md(api, namespace, model_deployment("md2", replicas=2))
    bed.operator(namespace)
    core = client.CoreV1Api(api)
    disc = client.DiscoveryV1Api(api)
    pods = ready_pods(core, namespace, "md2", 2)
    ips = {p.status.pod_ip for p in pods}

    def listed() -> set[str]:
        slices = disc.list_namespaced_endpoint_slice(
            namespace, label_selector="kubernetes.io/service-name=md2"
        ).items
        return {a for s in slices for e in (s.endpoints or []) for a in e.addresses}

    eventually(
        lambda: listed() == ips, what="slice lists both pods", timeout=30, ignore=(Exception,)
    )
    victim = pods[0]
    core.patch_namespaced_pod(
        victim.metadata.name, namespace, {"metadata": {"labels": {LABEL_ELIGIBLE: None}}}
    )
    eventually(
        lambda: listed() == ips - {victim.status.pod_ip},
        what="slice drops the de-labelled pod",
        timeout=30,
        ignore=(Exception,),
    )
    # The per-replica headless Service keeps selecting it (it does not select on the label).
    headless = disc.list_namespaced_endpoint_slice(
        namespace, label_selector=f"kubernetes.io/service-name={victim.metadata.name}"
    ).items
    assert any(victim.status.pod_ip in e.addresses for s in headless for e in s.endpoints or [])


def test_delete_with_wrong_uid_precondition_is_refused(
    bed: Bed,
    api: client.ApiClient,
    namespace: str,
) -> None:
    create_md(api, namespace, model_deployment("md3", replicas=1))
    bed.operator(namespace)
    core = client.CoreV1Api(api)
    (pod,) = ready_pods(core, namespace, "md3", 1)
    with pytest.raises(ApiException) as err:
        core.delete_namespaced_pod(
            pod.metadata.name,
            namespace,
            body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid")),
        )
    assert err.value.status == 409
    assert core.read_namespaced_pod(pod.metadata.name, namespace).metadata.uid == pod.metadata.uid


def test_status_subresource_write(api: client.ApiClient, namespace: str) -> None:
    create_md(api, namespace, model_deployment("md4", replicas=1))
    co = client.CustomObjectsApi(api)
    co.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "md4",
        {
            "status": {
                "retirement": {"roleName": "server", "replicaOrdinal": 0, "state": "Admitted"}
            }
        },
    )
    got = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "md4")
    assert got["status"]["retirement"]["state"] == "Admitted"
    # A write of the main resource does not touch status (it is a subresource).
    co.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "md4", {"status": {"retirement": None}}
    )
    got = co.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "md4")
    assert got["status"]["retirement"]["state"] == "Admitted"


def test_rbac_is_really_on(bed: Bed, api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api)
    rbac = client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="reader"))
    )
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="pod-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["pods"], verbs=["get", "list"])],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="reader"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="pod-reader"
            ),
            subjects=[
                client.RbacV1Subject(kind="ServiceAccount", name="reader", namespace=namespace)
            ],
        ),
    )
    token = core.create_namespaced_service_account_token(
        "reader",
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=["https://kubernetes.default.svc"], expiration_seconds=600
            )
        ),
    ).status.token
    cfg = client.Configuration()
    cfg.host = bed.cp.server
    cfg.ssl_ca_cert = str(bed.cp.pki.ca_cert)
    cfg.api_key = {"authorization": f"Bearer {token}"}
    sa_core = client.CoreV1Api(client.ApiClient(cfg))
    assert sa_core.list_namespaced_pod(namespace).items == []  # granted
    with pytest.raises(ApiException) as err:
        sa_core.list_namespaced_service(namespace)  # not granted
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        sa_core.list_namespaced_pod("default")  # another namespace
    assert err.value.status == 403
    with pytest.raises(ApiException) as err:
        sa_core.delete_collection_namespaced_pod(namespace)  # a verb not granted
    assert err.value.status == 403


def test_sglang_gateway_discovers_eligible_pods(
    bed: Bed,
    api: client.ApiClient,
    namespace: str,
) -> None:
    create_md(
        api,
        namespace,
        model_deployment("md5", engine="SGLang", replicas=2, router="sglang-gateway"),
    )
    bed.operator(namespace)
    core = client.CoreV1Api(api)
    pods = ready_pods(core, namespace, "md5", 2)
    url = bed.start_sglang_router(namespace, "md5")
    want = {f"http://{p.status.pod_ip}:8000" for p in pods}
    with httpx.Client(trust_env=False, timeout=5) as http:

        def workers() -> set[str]:
            body = http.get(url + "/workers").json()
            return {w["url"] for w in body["workers"]}

        eventually(
            lambda: workers() == want,
            what="gateway selects both members",
            timeout=60,
            ignore=(Exception,),
        )
        r = http.post(
            url + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}
        )
        assert r.status_code == 200, r.text
        assert "meta_info" in r.json()


def test_temporal_dev_server_and_ui(tmp_path: Path) -> None:
    cfg = load_config().with_ports(
        port=free_port(),
        http_port=free_port(),
        ui_port=free_port(),
        metrics_port=free_port(),
        db_filename=tmp_path / "t.sqlite",
    )
    child = start_dev_server(cfg, log_dir=tmp_path)
    try:
        assert ui_ok(cfg)
        with httpx.Client(trust_env=False, timeout=5) as http:
            r = http.get(f"http://{cfg.host}:{cfg.http_port}/api/v1/namespaces/{cfg.namespace}")
            assert r.status_code == 200 and r.json()["namespaceInfo"]["name"] == cfg.namespace
    finally:
        child.stop()
