"""Publish: mirror the workflow on ``status.retirement`` (status subresource) and mark each
phase change with a Kubernetes Event (SPEC section 8)."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from activities.kube import Kube, raise_api_error
from retirement.models import PublishInput
from retirement.names import FIELD_MANAGER, GROUP, KIND, PLURAL, VERSION
from retirement.phases import Outcome, Phase


def _ts(t: datetime | None) -> str | None:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if t is not None else None


def retirement_status(inp: PublishInput) -> dict[str, Any] | None:
    """The ``status.retirement`` object for ``inp`` (None: absent, no operation)."""
    if inp.clear:
        return None
    t = inp.target
    return {
        "roleName": inp.role,
        "replicaOrdinal": inp.ordinal,
        "observedGeneration": t.observed_generation if t else 0,
        "targetMemberUIDs": t.uids if t else [],
        "targetWorkloadUID": (t.workload_uid or "") if t else "",
        "state": inp.phase.value,
        "reason": inp.reason[:1024],
        "startedAt": _ts(inp.started_at),
        "deadline": _ts(inp.deadline),
        "phaseStartedAt": _ts(inp.phase_started_at),
        "lastConsumedRetryToken": inp.last_consumed_retry_token or "",
        "workflowID": inp.workflow_id,
    }


def publish(kube: Kube, inp: PublishInput) -> None:
    """Write the status (a merge patch of the subresource: no lost update of other status
    fields) and emit the phase's Event once (a deterministic name makes retries no-ops)."""
    body = {"status": {"retirement": retirement_status(inp)}}
    try:
        md = kube.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, inp.namespace, PLURAL, inp.deployment, body,
            field_manager=FIELD_MANAGER)
    except ApiException as e:
        if e.status == 404:  # the deployment is gone: nothing to mirror on
            return
        raise_api_error(e, "patch status.retirement")
    _event(kube, inp, uid=md["metadata"].get("uid", ""))


def _event(kube: Kube, inp: PublishInput, *, uid: str) -> None:
    key = f"{inp.workflow_id}|{inp.phase}|{inp.outcome}|{inp.phase_started_at.isoformat()}"
    name = f"{inp.deployment}.retire-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    warning = inp.phase is Phase.ABORTED or inp.outcome in (Outcome.REFUSED,
                                                             Outcome.COMPLETED_UNSETTLED)
    reason = "Retirement" + (inp.outcome.value if inp.outcome is not Outcome.RUNNING
                             else inp.phase.value)
    message = f"role {inp.role} ordinal {inp.ordinal}: {inp.phase}"
    if inp.reason:
        message += f" ({inp.reason[:400]})"
    now = datetime.now(UTC)
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=name, namespace=inp.namespace),
        involved_object=client.V1ObjectReference(
            api_version=f"{GROUP}/{VERSION}", kind=KIND, name=inp.deployment,
            namespace=inp.namespace, uid=uid),
        reason=reason, message=message, type="Warning" if warning else "Normal",
        source=client.V1EventSource(component=FIELD_MANAGER),
        first_timestamp=now, last_timestamp=now, count=1,
    )
    try:
        kube.core.create_namespaced_event(inp.namespace, event)
    except ApiException as e:
        if e.status != 409:  # 409: this phase change was already marked
            raise_api_error(e, "create Event")
