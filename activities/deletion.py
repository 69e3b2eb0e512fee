"""Delete and settle: each admitted Pod with a UID precondition (a 409 means replaced: the
replacement is never touched), the Workload only if it owns no other Pod; then observe
the Pods gone and the capacity released."""

from __future__ import annotations

from activities.polling import poll_until
from kube.api import KubeApi
from kube.errors import Conflict, KubeError, NotFound
from kube.members import Deletion, MemberGone, delete_member, read_member
from kube.objects import Workload
from retirement.models import DeleteResult, Observation, PhaseInput, Target
from retirement.phases import Verdict


def delete(api: KubeApi, target: Target) -> DeleteResult:
    """Delete the admitted Pods (idempotent: a Pod already gone is recorded as such)."""
    result = DeleteResult()
    for m in target.members:
        done = delete_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        if done is Deletion.DELETED:
            result.deleted.append(m.pod)
        elif done is Deletion.GONE:
            result.already_gone.append(m.pod)
        else:
            result.replaced.append(m.pod)
    result.workload = _delete_workload(api, target)
    return result


def _workload(api: KubeApi, target: Target) -> Workload | None:
    """The admitted Workload, if it still exists with the admitted UID."""
    if not target.workload_name:
        return None
    try:
        w = api.get_workload(namespace=target.namespace, name=target.workload_name)
    except NotFound:
        return None
    return w if w.uid == target.workload_uid else None


def _owns_other_pods(w: Workload, target: Target) -> bool:
    ours = set(target.uids)
    return any(o.kind == "Pod" and o.uid not in ours for o in w.owners)


def _delete_workload(api: KubeApi, target: Target) -> str:
    w = _workload(api, target)
    if w is None:
        return "none" if not target.workload_name else "gone"
    if _owns_other_pods(w, target):
        return "kept (owns other Pods)"
    try:
        api.delete_workload(namespace=target.namespace, name=w.name, uid=target.workload_uid or "")
    except (NotFound, Conflict):
        return "gone"
    return "deleted"


def settle(api: KubeApi, inp: PhaseInput) -> Observation:
    """Poll until no admitted Pod exists and the Workload no longer holds the capacity."""
    target = inp.target

    def once() -> Observation:
        present = []
        for m in target.members:
            try:
                pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
            except KubeError as e:
                return Observation(
                    verdict=Verdict.UNKNOWN, reason=f"read failed: {e.status or type(e).__name__}"
                )
            if not isinstance(pod, MemberGone):
                present.append(m.pod)
        w = _workload(api, target)
        readings = {p: "still present" for p in present}
        if w is not None and not _owns_other_pods(w, target):
            readings["workload"] = "still holds the capacity"
        if present or "workload" in readings:
            return Observation(
                verdict=Verdict.UNKNOWN,
                readings=readings,
                reason=f"waiting for {', '.join(readings)}",
            )
        return Observation(verdict=Verdict.VERIFIED, reason="Pods gone, capacity released")

    return poll_until(deadline=inp.deadline, interval=inp.poll_interval_s, once=once)
