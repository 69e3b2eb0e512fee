"""The Kueue Workload on the real bed: Kueue v0.17.0's own Workload CRD installed in the
kube-apiserver, each replica's Workload composed the way gpustack's operator and Kueue make it
(``testbed.standin_workloads``), the dev server, and the real activities in a worker.

What is proved: a retirement deletes the replica's Workload (by the admitted UID) and Settling
waits until it is gone; a Workload that also owns another Pod is kept; a Workload re-created
under the same name after admission is not the one deleted; and a cluster serving only a newer
Workload version is discovered and used, not read as "no Kueue"."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from activities import Kube
from kube.errors import Conflict
from retirement.budgets import Budgets
from retirement.phases import Outcome, Phase
from testbed.standin_operator import StandInOperator
from testbed.standin_workloads import KUEUE_GROUP, POD_FINALIZER, WORKLOADS, PodGroupWorkloads
from tests.bed.conftest import Ctx, create_md
from tests.bed.support import phase_durations, pods_of, retire_routerless, serving, wait_state
from tests.helpers import eventually, eventually_in_thread, model_deployment
from workflows.retirement import RetirementWorkflow

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

#: What the test bed reads Workloads as: Kueue v0.17.0 stores v1beta2 and every variant here
#: serves it.
READ_AS = "v1beta2"
CRD = "workloads.kueue.x-k8s.io"
#: A finalizer of the test's own: it holds a deleted Workload the way Kueue's does while it
#: releases the quota, for as long as the test wants.
HOLD = "bed.llm-retire/hold"
#: Settling is short where it cannot end (the retired Pods are held by Kueue's finalizer).
UNSETTLED = Budgets(overall_s=90, withdrawal_s=20, drain_s=30, settle_s=4, poll_interval_s=0.5)
SETTLED = Budgets(overall_s=120, withdrawal_s=20, drain_s=30, settle_s=40, poll_interval_s=0.5)


def custom(ctx: Ctx) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(ctx.bed.api_client())


def workloads(ctx: Ctx) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = custom(ctx).list_namespaced_custom_object(
        KUEUE_GROUP, READ_AS, ctx.ns, WORKLOADS
    )["items"]
    return items


def owning(ctx: Ctx, pod_uid: str) -> dict[str, Any] | None:
    """The Workload that names the Pod as an owner."""
    return next(
        (
            w
            for w in workloads(ctx)
            if pod_uid in {o["uid"] for o in w["metadata"].get("ownerReferences") or []}
        ),
        None,
    )


def read(ctx: Ctx, name: str) -> dict[str, Any] | None:
    with contextlib.suppress(client.ApiException):
        w: dict[str, Any] = custom(ctx).get_namespaced_custom_object(
            KUEUE_GROUP, READ_AS, ctx.ns, WORKLOADS, name
        )
        return w
    return None


def patch_workload(ctx: Ctx, w: dict[str, Any], ops: list[dict[str, Any]]) -> None:
    """A JSON patch of that very Workload (its UID tested first)."""
    custom(ctx).patch_namespaced_custom_object(
        KUEUE_GROUP,
        READ_AS,
        ctx.ns,
        WORKLOADS,
        w["metadata"]["name"],
        [{"op": "test", "path": "/metadata/uid", "value": w["metadata"]["uid"]}, *ops],
        _content_type="application/json-patch+json",
    )


def hold(ctx: Ctx, w: dict[str, Any]) -> None:
    patch_workload(ctx, w, [{"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}])


def release(ctx: Ctx, name: str) -> None:
    """Remove this test's finalizer.  Its index is read first and tested in the patch; the
    stand-in Kueue removes its own finalizer from a deleted Workload meanwhile, which moves
    the index and fails the test (422: seen once in CI), so a failed test reads again."""

    def once() -> bool:
        w = read(ctx, name)
        assert w is not None
        i = w["metadata"]["finalizers"].index(HOLD)
        try:
            patch_workload(
                ctx,
                w,
                [
                    {"op": "test", "path": f"/metadata/finalizers/{i}", "value": HOLD},
                    {"op": "remove", "path": f"/metadata/finalizers/{i}"},
                ],
            )
        except client.ApiException as e:
            if e.status != 422:
                raise
            return False
        return True

    eventually(once, what=f"finalizer {HOLD} removed from {name}", timeout=20)


async def deploy(ctx: Ctx, name: str, *, per_role: bool = False) -> StandInOperator:
    """A two-replica router-less deployment whose replicas have their Workloads (one per
    replica, or with ``per_role`` one for both); returns its stand-in operator."""
    api = ctx.bed.api_client()
    create_md(api, ctx.ns, model_deployment(name, replicas=2))
    op = StandInOperator(
        api=api,
        namespace=ctx.ns,
        hub_url=ctx.bed.hub_url,
        workloads=PodGroupWorkloads(api=api, namespace=ctx.ns, per_role=per_role),
    ).start()
    ctx.bed.operators.append(op)  # stopped after the test, like the bed's own
    await asyncio.to_thread(serving, ctx, name, 2)
    want = 1 if per_role else 2
    await eventually_in_thread(
        lambda: len(workloads(ctx)) == want, what=f"{want} Workload(s)", timeout=30
    )
    return op


def terminating_and_held(p: client.V1Pod) -> bool:
    """Deleted, and still there because Kueue's finalizer holds it."""
    return p.metadata.deletion_timestamp is not None and POD_FINALIZER in (
        p.metadata.finalizers or []
    )


async def test_the_replicas_workload_is_deleted_and_settling_waits_until_it_is_gone(
    ctx: Ctx,
) -> None:
    name = "kq-full"
    await deploy(ctx, name)
    victim = pods_of(ctx, name, 1)[0]
    keep = pods_of(ctx, name, 0)[0]
    wl, kept = owning(ctx, victim.metadata.uid), owning(ctx, keep.metadata.uid)
    assert (
        wl is not None and kept is not None and wl["metadata"]["name"] != kept["metadata"]["name"]
    )
    hold(ctx, wl)
    handle = await retire_routerless(ctx, name, budgets=SETTLED, quiet_s=0.5)
    await wait_state(handle, Phase.SETTLING)
    # Deleting the Workload is what released Kueue's finalizer on the replica's Pod: it goes,
    # while the Workload itself is still held.
    await eventually_in_thread(
        lambda: not pods_of(ctx, name, 1), what="victim gone", timeout=20, ignore=(Exception,)
    )
    held = read(ctx, wl["metadata"]["name"])
    assert held is not None and held["metadata"]["uid"] == wl["metadata"]["uid"]
    assert held["metadata"].get("deletionTimestamp")
    await asyncio.sleep(2.0)
    st = await handle.query(RetirementWorkflow.state)
    assert st.phase is Phase.SETTLING, st.reasons  # the Pod is gone: held by the Workload
    released = time.time()
    await asyncio.to_thread(release, ctx, wl["metadata"]["name"])
    st = await handle.result()
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert st.target is not None
    assert (st.target.workload_name, st.target.workload_uid) == (
        wl["metadata"]["name"],
        wl["metadata"]["uid"],
    )
    assert st.deleted is not None and st.deleted.workload == "deleted"
    assert st.deleted.deleted == [victim.metadata.name]
    assert read(ctx, wl["metadata"]["name"]) is None
    completed = next(t for p, t in st.phase_timeline if p is Phase.COMPLETED)
    assert completed.timestamp() >= released  # Settling ended only once the Workload was gone
    # The other replica and its Workload are untouched.
    assert [p.metadata.uid for p in pods_of(ctx, name, 0)] == [keep.metadata.uid]
    still = read(ctx, kept["metadata"]["name"])
    assert still is not None and still["metadata"]["uid"] == kept["metadata"]["uid"]
    assert not still["metadata"].get("deletionTimestamp")
    print(f"\nWorkload retirement phases: {phase_durations(st)}")


async def test_a_workload_that_owns_another_pod_is_kept(ctx: Ctx) -> None:
    """One Workload for both replicas (an earlier operator's per-role group): retiring one
    replica deletes its Pod and keeps the Workload (deleting it would stop the other replica,
    Kueue stops the whole group of a deleted Workload).  Kueue keeps holding the deleted member
    of the serving group while that Workload lives, so Settling cannot confirm and says so."""
    name = "kq-shared"
    await deploy(ctx, name, per_role=True)
    victim = pods_of(ctx, name, 1)[0]
    keep = pods_of(ctx, name, 0)[0]
    (wl,) = workloads(ctx)
    owners = {o["uid"] for o in wl["metadata"]["ownerReferences"]}
    assert owners == {victim.metadata.uid, keep.metadata.uid}
    handle = await retire_routerless(ctx, name, budgets=UNSETTLED, quiet_s=0.5)
    st = await handle.result()
    assert st.target is not None and st.target.workload_uid == wl["metadata"]["uid"]
    assert st.deleted is not None and st.deleted.deleted == [victim.metadata.name]
    assert st.deleted.workload == "kept (owns other Pods)"
    assert st.outcome is Outcome.COMPLETED_UNSETTLED, st.reasons
    assert st.last_readings == {victim.metadata.name: "still present"}, st.last_readings
    now = read(ctx, wl["metadata"]["name"])
    assert now is not None and now["metadata"]["uid"] == wl["metadata"]["uid"]
    assert not now["metadata"].get("deletionTimestamp")
    (held,) = pods_of(ctx, name, 1)
    assert held.metadata.uid == victim.metadata.uid and terminating_and_held(held)
    (kept,) = pods_of(ctx, name, 0)
    assert kept.metadata.uid == keep.metadata.uid and kept.metadata.deletion_timestamp is None


async def test_a_workload_recreated_under_the_same_name_is_not_deleted(ctx: Ctx) -> None:
    """Between admission and the delete, the replica's Workload is replaced: same name, a new
    UID (removed without stopping the group, and composed again by Kueue).  The delete reads
    it as "gone" and leaves it; the API server refuses a delete bound to the admitted UID."""
    name = "kq-recreated"
    op = await deploy(ctx, name)
    victim = pods_of(ctx, name, 1)[0]
    wl = owning(ctx, victim.metadata.uid)
    assert wl is not None
    wl_name, admitted = wl["metadata"]["name"], wl["metadata"]["uid"]
    hub = op.hub_pod(victim.metadata.uid)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"stale_gauges": [1, 0]})  # drain holds
    handle = await retire_routerless(ctx, name, budgets=UNSETTLED, quiet_s=0.5)
    st = await wait_state(handle, Phase.DRAINING)
    assert st.target is not None and st.target.workload_uid == admitted
    patch_workload(ctx, wl, [{"op": "replace", "path": "/metadata/finalizers", "value": []}])
    custom(ctx).delete_namespaced_custom_object(
        KUEUE_GROUP,
        READ_AS,
        ctx.ns,
        WORKLOADS,
        wl_name,
        body=client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=admitted)),
    )

    def recomposed() -> dict[str, Any] | None:
        w = read(ctx, wl_name)
        return w if w is not None and w["metadata"]["uid"] != admitted else None

    new = await eventually_in_thread(recomposed, what="re-composed Workload", timeout=20)
    # The server honours the product's precondition on the real CRD: refused, not deleted.
    kube = Kube.from_config(kubeconfig=str(ctx.bed.cp.kubeconfig))
    with pytest.raises(Conflict):
        await asyncio.to_thread(kube.delete_workload, namespace=ctx.ns, name=wl_name, uid=admitted)
    ctx.bed.hub_call("POST", f"/pods/{hub}/traps", {"clear": True})
    st = await handle.result()
    assert st.deleted is not None and st.deleted.deleted == [victim.metadata.name]
    assert st.deleted.workload == "gone"
    assert st.outcome is Outcome.COMPLETED_UNSETTLED, st.reasons
    now = read(ctx, wl_name)
    assert now is not None and now["metadata"]["uid"] == new["metadata"]["uid"]
    assert not now["metadata"].get("deletionTimestamp")
    (held,) = pods_of(ctx, name, 1)  # held by the Workload that replaced the admitted one
    assert held.metadata.uid == victim.metadata.uid and terminating_and_held(held)


def served_versions(api: client.ApiClient) -> list[str]:
    groups = client.ApisApi(api).get_api_versions().groups or []
    return [v.version for g in groups if g.name == KUEUE_GROUP for v in g.versions]


@contextlib.contextmanager
def v1beta1_not_served(api: client.ApiClient) -> Iterator[None]:
    """Kueue's Workload CRD serving v1beta2 only (what a Kueue that dropped the deprecated
    v1beta1 serves), cluster-wide, put back afterwards."""
    ext = client.ApiextensionsV1Api(api)

    def served(value: bool) -> None:
        ext.patch_custom_resource_definition(
            CRD,
            [
                {"op": "test", "path": "/spec/versions/0/name", "value": "v1beta1"},
                {"op": "replace", "path": "/spec/versions/0/served", "value": value},
            ],
            _content_type="application/json-patch+json",
        )

    served(False)
    try:
        eventually(
            lambda: served_versions(api) == ["v1beta2"], what="v1beta1 withdrawn", timeout=30
        )
        yield
    finally:
        served(True)
        eventually(
            lambda: "v1beta1" in served_versions(api), what="v1beta1 served again", timeout=30
        )


async def test_a_cluster_serving_only_a_newer_workload_version_is_not_no_kueue(
    ctx: Ctx,
) -> None:
    """Last in this module: it changes the CRD for the whole bed while it runs."""
    api = ctx.bed.api_client()
    with v1beta1_not_served(api):
        with pytest.raises(client.ApiException) as e:
            client.CustomObjectsApi(api).list_namespaced_custom_object(
                KUEUE_GROUP, "v1beta1", ctx.ns, WORKLOADS
            )
        assert e.value.status == 404
        kube = Kube.from_config(kubeconfig=str(ctx.bed.cp.kubeconfig))
        assert await asyncio.to_thread(kube.workload_api) == (KUEUE_GROUP, "v1beta2", WORKLOADS)
        name = "kq-newer"
        await deploy(ctx, name)
        victim = pods_of(ctx, name, 1)[0]
        wl = owning(ctx, victim.metadata.uid)
        assert wl is not None
        handle = await retire_routerless(ctx, name, budgets=SETTLED, quiet_s=0.5)
        st = await handle.result()
        assert st.outcome is Outcome.COMPLETED, st.reasons
        assert st.target is not None and st.target.workload_uid == wl["metadata"]["uid"]
        assert st.deleted is not None and st.deleted.workload == "deleted"
        assert read(ctx, wl["metadata"]["name"]) is None
        assert not pods_of(ctx, name, 1)
