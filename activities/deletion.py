"""Delete and settle: each admitted Pod with a UID precondition (a 409 means replaced: the
replacement is never touched), the Workload only if it owns no other Pod; then observe
the Pods gone and the capacity released."""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from activities.kube import Kube, raise_api_error
from activities.polling import poll_until
from retirement.models import DeleteResult, Observation, PhaseInput, Target
from retirement.names import KUEUE_WORKLOAD_API
from retirement.phases import Verdict


def delete(kube: Kube, target: Target) -> DeleteResult:
    """Delete the admitted Pods (idempotent: a Pod already gone is recorded as such)."""
    result = DeleteResult()
    for m in target.members:
        opts = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=m.uid))
        try:
            kube.core.delete_namespaced_pod(m.pod, target.namespace, body=opts)
            result.deleted.append(m.pod)
        except ApiException as e:
            if e.status == 404:
                result.already_gone.append(m.pod)
            elif e.status == 409:
                result.replaced.append(m.pod)
            else:
                raise_api_error(e, f"delete Pod {m.pod}")
    result.workload = _delete_workload(kube, target)
    return result


def _workload(kube: Kube, target: Target) -> dict[str, Any] | None:
    if not target.workload_name:
        return None
    group, version, plural = KUEUE_WORKLOAD_API
    try:
        w: dict[str, Any] = kube.custom.get_namespaced_custom_object(
            group, version, target.namespace, plural, target.workload_name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise_api_error(e, "read Workload")
    return w if w["metadata"].get("uid") == target.workload_uid else None


def _owns_other_pods(w: dict[str, Any], target: Target) -> bool:
    ours = set(target.uids)
    return any(o.get("kind") == "Pod" and o.get("uid") not in ours
               for o in w["metadata"].get("ownerReferences") or [])


def _delete_workload(kube: Kube, target: Target) -> str:
    w = _workload(kube, target)
    if w is None:
        return "none" if not target.workload_name else "gone"
    if _owns_other_pods(w, target):
        return "kept (owns other Pods)"
    group, version, plural = KUEUE_WORKLOAD_API
    try:
        kube.custom.delete_namespaced_custom_object(
            group, version, target.namespace, plural, target.workload_name,
            body=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=target.workload_uid)))
    except ApiException as e:
        if e.status in (404, 409):
            return "gone"
        raise_api_error(e, "delete Workload")
    return "deleted"


def settle(kube: Kube, inp: PhaseInput) -> Observation:
    """Poll until no admitted Pod exists and the Workload no longer holds the capacity."""
    target = inp.target

    def once() -> Observation:
        present = []
        for m in target.members:
            try:
                pod = kube.core.read_namespaced_pod(m.pod, target.namespace)
            except ApiException as e:
                if e.status == 404:
                    continue
                return Observation(verdict=Verdict.UNKNOWN, reason=f"read failed: {e.status}")
            if pod.metadata.uid == m.uid:
                present.append(m.pod)
        w = _workload(kube, target)
        readings = {p: "still present" for p in present}
        if w is not None and not _owns_other_pods(w, target):
            readings["workload"] = "still holds the capacity"
        if present or "workload" in readings:
            return Observation(verdict=Verdict.UNKNOWN, readings=readings,
                               reason=f"waiting for {', '.join(readings)}")
        return Observation(verdict=Verdict.VERIFIED, reason="Pods gone, capacity released")

    return poll_until(deadline=inp.deadline, interval=inp.poll_interval_s, once=once)
