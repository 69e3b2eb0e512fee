"""Disqualify and restore: remove and put back the eligibility label, bound to the
admitted UIDs and to the label value last read (``kube.members.set_eligibility``), so a
Pod of the same name with another UID is never touched and a concurrent change of the
label is read again, never overwritten blindly."""

from __future__ import annotations

from temporalio.exceptions import CancelledError

from activities.polling import cancel_seen
from activities.probes import identity_probe, probes_supported
from kube.api import KubeApi
from kube.members import LabelChange, MemberGone, read_member, set_eligibility
from kube.objects import pod_ready
from retirement.models import MemberTarget, Observation, RestoreResult, Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict

#: How often disqualify reads again a member whose label changed under it, per run.
LABEL_ATTEMPTS = 3


def _lost(m: MemberTarget, change: LabelChange) -> str:
    return f"member {m.pod} " + ("was replaced" if change is LabelChange.REPLACED else "is gone")


def _take_label_off(api: KubeApi, target: Target, m: MemberTarget) -> Observation | str:
    """The member's reading once its label is gone, or the Observation that ends the run."""
    for _ in range(LABEL_ATTEMPTS):
        pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        if isinstance(pod, MemberGone):
            return Observation(verdict=Verdict.FAILED, reason=f"member {m.pod} is gone or replaced")
        current = pod.labels.get(LABEL_ELIGIBLE)
        if current is None:
            return "label already absent"
        if cancel_seen():
            raise CancelledError("cancelled before removing the label")
        change = set_eligibility(
            api, namespace=target.namespace, name=m.pod, uid=m.uid, current=current, eligible=False
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


def restore_once(api: KubeApi, target: Target, result: RestoreResult) -> RestoreResult:
    """One pass of the restore rule over the members still to decide."""
    done = set(result.restored) | set(result.failed)
    group = len(target.members) > 1
    restored, held, failed = list(result.restored), dict(result.held), dict(result.failed)
    for m in target.members:
        if m.pod in done or not (m.eligible_at_admission or m.measured):
            continue
        pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        if isinstance(pod, MemberGone):
            failed[m.pod] = "gone or replaced: not the admitted UID"
            held.pop(m.pod, None)
            continue
        ready = pod_ready(pod)
        if ready == "False":
            failed[m.pod] = "PodReady is False"
            held.pop(m.pod, None)
            continue
        if ready != "True":
            held[m.pod] = f"PodReady is {ready}"
            continue
        if group:
            if not probes_supported(target):
                held[m.pod] = (
                    f"identity probe unsupported for {target.engine} "
                    f"{target.engine_version or '(no version)'}"
                )
                continue
            probe = identity_probe(target, m)
            if probe:
                held[m.pod] = probe
                continue
        change = set_eligibility(
            api,
            namespace=target.namespace,
            name=m.pod,
            uid=m.uid,
            current=pod.labels.get(LABEL_ELIGIBLE),
            eligible=True,
        )
        if change is LabelChange.CHANGED:
            held[m.pod] = "the label changed while restoring: read again on the next pass"
            continue
        if change is not LabelChange.APPLIED:
            failed[m.pod] = "replaced while restoring"
            held.pop(m.pod, None)
            continue
        restored.append(m.pod)
        held.pop(m.pod, None)
    return RestoreResult(restored=restored, held=held, failed=failed)
