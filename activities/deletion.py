"""Delete and settle: each admitted Pod with a UID precondition (a 409 means replaced: the
replacement is never touched), the Workload only if it owns no other Pod; then observe
the Pods gone and the capacity released.

The delete is guarded: immediately before its first delete it confirms everything once
more (``activities.guard``) and refuses, touching nothing, when it cannot.  Once a delete
may have been sent (a retried attempt, or a second activity the workflow ran after the
first could not start in time) and a member is already gone or terminating, the deletion
has begun: the remaining deletes finish (SPEC section 4), without the guard.  Every
delete call is fenced to the attempt that owns it (``activities.fencing``).
"""

from __future__ import annotations

import httpx

from activities import guard, refresh
from activities.fairslots import WorkerSlots
from activities.fencing import fence
from activities.polling import poll_until
from kube.api import KubeApi
from kube.errors import Conflict, KubeError, NotFound
from kube.members import Deletion, MemberGone, delete_member, read_member
from kube.objects import Workload
from retirement.models import DeleteResult, Observation, PhaseInput, Target
from retirement.phases import Verdict


def delete(
    api: KubeApi,
    inp: PhaseInput,
    *,
    retried: bool = False,
    transport: httpx.BaseTransport | None = None,
    slots: WorkerSlots | None = None,
) -> DeleteResult:
    """Delete the admitted Pods (idempotent: a Pod already gone is recorded as such), after
    the last guard, unless the deletion has begun (``retried``: this is not the activity's
    first attempt).

    After the point of no return every admitted Pod's delete is attempted, whatever an
    earlier one answered: a Kubernetes error on one member (a 400/422 the server refuses,
    a 403, a 503) is collected and the rest go on.  Then, if any failed, the activity fails
    with every failure named (retryable when any of them is: the retry is idempotent) and
    the Workload is left for that retry: a member Pod of it may still be there.

    Evidence older than the freshness bound, on this worker's clock or on the workflow's
    (``read_again``), is taken again first (``activities.refresh``, in the worker's
    ``slots``): the guard then confirms on that; a drain that does not read idle again
    refuses, touching nothing.  (The activity does so in every run; only the workflow's
    choice to send stale evidence here rather than to another drain is patched.)"""
    target = inp.target
    result = DeleteResult()
    if not ((retried or inp.delete_may_have_begun) and _begun(api, target)):
        stale = guard.stale(inp) or (
            "the workflow found the drain's last idle read too old" if inp.read_again else ""
        )
        if stale:
            obs = refresh.refreshed(api, inp, stale=stale, slots=slots)
            if obs.verdict is not Verdict.VERIFIED:
                return DeleteResult(refused=obs)
            inp = inp.model_copy(update={"evidence_at": obs.evidence_at, "read_again": False})
        refused = guard.refusal(api, inp, transport=transport)
        if refused is not None:
            return DeleteResult(refused=refused)
    failures: list[tuple[str, KubeError]] = []
    for m in target.members:
        fence(f"deleting {m.pod}")
        try:
            done = delete_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        except KubeError as e:
            failures.append((m.pod, e))
            continue
        if done is Deletion.DELETED:
            result.deleted.append(m.pod)
        elif done is Deletion.GONE:
            result.already_gone.append(m.pod)
        else:
            result.replaced.append(m.pod)
    if failures:
        raise _collected(failures, result, total=len(target.members))
    result.workload = _delete_workload(api, target)
    return result


def _begun(api: KubeApi, target: Target) -> bool:
    """Whether a member is already gone, replaced or terminating: after a delete may have
    been sent, that is the deletion begun."""
    for m in target.members:
        pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        if isinstance(pod, MemberGone) or pod.terminating:
            return True
    return False


def _collected(
    failures: list[tuple[str, KubeError]], done: DeleteResult, *, total: int
) -> KubeError:
    """One error naming every failed delete, of the kind of the first retryable one (else
    of the first): a retry is asked for whenever one may help."""
    first = next((e for _, e in failures if e.retryable), failures[0][1])
    what = f"delete {len(failures)} of {total} admitted Pods"
    named = "; ".join(f"{pod}: {e}" for pod, e in failures)
    went = done.deleted + done.already_gone
    also = f" (deleted or gone: {', '.join(went)})" if went else ""
    if done.replaced:
        also += f" (replaced, not touched: {', '.join(done.replaced)})"
    return type(first)(what, status=first.status, reason=first.reason, detail=named + also)


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
    fence(f"deleting Workload {w.name}")
    try:
        api.delete_workload(namespace=target.namespace, name=w.name, uid=target.workload_uid or "")
    except (NotFound, Conflict):
        return "gone"
    return "deleted"


def settle(api: KubeApi, inp: PhaseInput, *, slots: WorkerSlots | None = None) -> Observation:
    """Poll until no admitted Pod exists and the Workload no longer holds the capacity
    (``slots``: the worker's, for its poll slots; None: the process's default)."""
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

    return poll_until(
        deadline=inp.deadline,
        interval=inp.poll_interval_s,
        once=once,
        tenant=inp.target.namespace,
        slots=None if slots is None else slots.polls,
    )
