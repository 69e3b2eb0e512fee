"""Disqualify: remove the eligibility label, bound to the admitted UIDs, to the label
value last read and to the Pod's resourceVersion as read (``kube.members.set_eligibility``),
so a Pod of the same name with another UID is never touched and a concurrent change of the
label is read again, never overwritten blindly.  The restore puts it back
(``activities.restore``).

The resourceVersion fences a removal that lands late: one sent by an attempt the
workflow no longer waits for and delivered after the restore wrote the label back finds
the Pod written since its read and changes nothing: an abort leaves the replica
labelled."""

from __future__ import annotations

from activities.fencing import fence
from kube.api import KubeApi
from kube.members import LabelChange, MemberGone, read_member, set_eligibility
from retirement.models import MemberTarget, Observation, Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict

#: How often disqualify reads again a member whose label changed under it, per run.
LABEL_ATTEMPTS = 3


def _lost(m: MemberTarget, change: LabelChange) -> str:
    return f"member {m.pod} " + ("was replaced" if change is LabelChange.REPLACED else "is gone")


def _take_label_off(api: KubeApi, target: Target, m: MemberTarget) -> Observation | str:
    """The member's reading once its label is gone, or the Observation that ends the run.

    A patch whose ``test`` failed (the label changed, or was removed by someone else,
    between the read and the write) is followed by another read, also after the last
    allowed patch: a label that someone else removed reads as done ("label already
    absent"), never as a replaced member."""
    for attempt in range(LABEL_ATTEMPTS + 1):
        pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        if isinstance(pod, MemberGone):
            return Observation(verdict=Verdict.FAILED, reason=f"member {m.pod} is gone or replaced")
        current = pod.labels.get(LABEL_ELIGIBLE)
        if current is None:
            return "label already absent"
        if attempt == LABEL_ATTEMPTS:
            break
        fence(f"removing the label of {m.pod}")
        change = set_eligibility(
            api,
            namespace=target.namespace,
            name=m.pod,
            uid=m.uid,
            current=current,
            eligible=False,
            resource_version=pod.resource_version,
        )
        if change is LabelChange.APPLIED:
            return "label removed"
        if change is not LabelChange.CHANGED:
            return Observation(verdict=Verdict.FAILED, reason=_lost(m, change))
    return Observation(
        verdict=Verdict.UNKNOWN, reason=f"the label of member {m.pod} keeps changing concurrently"
    )


def disqualify(api: KubeApi, target: Target) -> Observation:
    """Remove the label from every admitted member; VERIFIED when it is gone from all."""
    readings: dict[str, str] = {}
    for m in target.members:
        done = _take_label_off(api, target, m)
        if isinstance(done, Observation):
            return done.model_copy(update={"readings": readings})
        readings[m.pod] = done
    return Observation(
        verdict=Verdict.VERIFIED,
        reason="eligibility label gone from all members",
        readings=readings,
        polls=1,
    )
