"""Publish: mirror the workflow on ``status.retirement`` (status subresource) and mark each
phase change with a Kubernetes Event (SPEC section 8)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kube.api import KubeApi
from kube.errors import Conflict, NotFound
from kube.events import post_event
from kube.objects import ObjectRef
from retirement.models import PublishInput
from retirement.names import GROUP, KIND, VERSION
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


#: How many times a status write is tried again when the deployment was written between
#: its read and the write (its resourceVersion moved).
WRITE_TRIES = 5


class _Stopped(Exception):
    """The caller said not to go on (``publish``'s ``go_on``)."""


def publish(api: KubeApi, inp: PublishInput, *, go_on: Callable[[], bool] = lambda: True) -> bool:
    """Write the status (a merge patch of the subresource: no lost update of other status
    fields) and emit the phase's Event once (a deterministic name makes retries no-ops).

    Once a deployment was admitted, the status goes only onto that deployment, never onto
    one re-created since under the same name: its UID is read and checked, and the write
    carries the read's resourceVersion, so it lands on the object checked or not at all (a
    409 reads and checks again).  A ``metadata.uid`` in the patch would not do it: the
    status subresource takes nothing but ``status`` from a patch, and the API server
    writes it whatever UID the patch names (measured, the twin test
    ``tests/bed/test_fake_kube_twin_on_bed.py``).

    ``go_on`` is asked before each request (a phase carrying the snapshot stops it so,
    ``activities.alongside``): False from it stops the publish, which then returns False;
    True: published, or nothing to mirror on."""
    body: dict[str, Any] = {"status": {"retirement": retirement_status(inp)}}
    if inp.last_consumed_retry_token:  # kept per role:ordinal, across retirements
        key = f"{inp.role}:{inp.ordinal}"
        body["status"]["retryTokens"] = {key: inp.last_consumed_retry_token}
    admitted_uid = inp.target.deployment_uid if inp.target is not None else ""
    for _ in range(WRITE_TRIES):
        try:
            md = _write(api, inp, body, admitted_uid, go_on)
        except NotFound:  # the deployment is gone: nothing to mirror on
            return True
        except Conflict:  # written in between: read and check again
            continue
        except _Stopped:
            return False
        if md is None:  # re-created under the same name: another deployment's status
            return True
        if not go_on():
            return False
        uid = (md.get("metadata") or {}).get("uid") or ""
        _event(api, inp, uid=str(uid))
        return True
    raise Conflict(
        f"publish status.retirement of ModelDeployment {inp.namespace}/{inp.deployment}: "
        f"written in between {WRITE_TRIES} times",
        status=409,
        reason="Conflict",
    )


def _write(
    api: KubeApi,
    inp: PublishInput,
    body: dict[str, Any],
    admitted_uid: str,
    go_on: Callable[[], bool],
) -> dict[str, Any] | None:
    """One status write, fenced to the deployment ``admitted_uid`` when there is one (None:
    the deployment of that name is another one now); ``_Stopped`` when ``go_on`` says so
    before a request."""
    patch = body
    if admitted_uid:
        if not go_on():
            raise _Stopped
        raw = api.get_deployment(namespace=inp.namespace, name=inp.deployment)
        meta = raw.get("metadata") or {}
        if meta.get("uid") != admitted_uid:
            return None
        patch = {**body, "metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if not go_on():
        raise _Stopped
    return api.patch_deployment_status(namespace=inp.namespace, name=inp.deployment, patch=patch)


def _event(api: KubeApi, inp: PublishInput, *, uid: str) -> None:
    warning = inp.phase is Phase.ABORTED or inp.outcome in (
        Outcome.REFUSED,
        Outcome.COMPLETED_UNSETTLED,
        Outcome.ABANDONED,
    )
    reason = "Retirement" + (
        inp.outcome.value if inp.outcome is not Outcome.RUNNING else inp.phase.value
    )
    message = f"role {inp.role} ordinal {inp.ordinal}: {inp.phase}"
    if inp.reason:
        message += f" ({inp.reason[:400]})"
    post_event(
        api,
        about=ObjectRef(
            api_version=f"{GROUP}/{VERSION}",
            kind=KIND,
            namespace=inp.namespace,
            name=inp.deployment,
            uid=uid,
        ),
        tag="retire",
        key=f"{inp.workflow_id}|{inp.phase}|{inp.outcome}|{inp.phase_started_at.isoformat()}",
        reason=reason,
        message=message,
        warning=warning,
    )
