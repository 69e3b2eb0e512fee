"""Disqualify and restore: remove and put back the eligibility label, bound to the
admitted UIDs (a JSON patch whose first operation tests ``metadata.uid``, so a Pod of the
same name with another UID is never touched)."""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException

from activities.kube import Kube, raise_api_error
from activities.probes import identity_probe, probes_supported
from retirement.models import MemberTarget, Observation, RestoreResult, Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict

_KEY = LABEL_ELIGIBLE.replace("~", "~0").replace("/", "~1")


def _read(kube: Kube, target: Target, m: MemberTarget) -> client.V1Pod | None:
    try:
        pod: client.V1Pod = kube.core.read_namespaced_pod(m.pod, target.namespace)
    except ApiException as e:
        if e.status == 404:
            return None
        raise_api_error(e, f"read Pod {m.pod}")
    return pod if pod.metadata.uid == m.uid else None


def _patch(kube: Kube, target: Target, m: MemberTarget, op: dict[str, str]) -> bool:
    """Apply ``op`` only to the admitted UID; False when the Pod is gone or replaced."""
    body = [{"op": "test", "path": "/metadata/uid", "value": m.uid}, op]
    try:
        kube.core.patch_namespaced_pod(m.pod, target.namespace, body)
    except ApiException as e:
        if e.status in (404, 422):  # gone, or the UID test failed: replaced
            return False
        raise_api_error(e, f"patch Pod {m.pod}")
    return True


def disqualify(kube: Kube, target: Target) -> Observation:
    """Remove the label from every admitted member; VERIFIED when it is gone from all."""
    readings: dict[str, str] = {}
    for m in target.members:
        pod = _read(kube, target, m)
        if pod is None:
            return Observation(verdict=Verdict.FAILED,
                               reason=f"member {m.pod} is gone or replaced", readings=readings)
        if (pod.metadata.labels or {}).get(LABEL_ELIGIBLE) is not None:
            if not _patch(kube, target, m, {"op": "remove", "path": f"/metadata/labels/{_KEY}"}):
                return Observation(verdict=Verdict.FAILED,
                                   reason=f"member {m.pod} was replaced", readings=readings)
            readings[m.pod] = "label removed"
        else:
            readings[m.pod] = "label already absent"
    return Observation(verdict=Verdict.VERIFIED, reason="eligibility label gone from all "
                       "members", readings=readings, polls=1)


def _ready(pod: client.V1Pod) -> str:
    for c in pod.status.conditions or []:
        if c.type == "Ready":
            return str(c.status)
    return "Unknown"


def restore_once(kube: Kube, target: Target, result: RestoreResult) -> RestoreResult:
    """One pass of the restore rule over the members still to decide."""
    done = set(result.restored) | set(result.failed)
    group = len(target.members) > 1
    restored, held, failed = list(result.restored), dict(result.held), dict(result.failed)
    for m in target.members:
        if m.pod in done or not (m.eligible_at_admission or m.measured):
            continue
        pod = _read(kube, target, m)
        if pod is None:
            failed[m.pod] = "gone or replaced: not the admitted UID"
            held.pop(m.pod, None)
            continue
        ready = _ready(pod)
        if ready == "False":
            failed[m.pod] = "PodReady is False"
            held.pop(m.pod, None)
            continue
        if ready != "True":
            held[m.pod] = f"PodReady is {ready}"
            continue
        if group:
            if not probes_supported(target):
                held[m.pod] = (f"identity probe unsupported for {target.engine} "
                               f"{target.engine_version or '(no version)'}")
                continue
            probe = identity_probe(target, m)
            if probe:
                held[m.pod] = probe
                continue
        if not _patch(kube, target, m, {"op": "add", "path": f"/metadata/labels/{_KEY}",
                                        "value": "true"}):
            failed[m.pod] = "replaced while restoring"
            held.pop(m.pod, None)
            continue
        restored.append(m.pod)
        held.pop(m.pod, None)
    return RestoreResult(restored=restored, held=held, failed=failed)
