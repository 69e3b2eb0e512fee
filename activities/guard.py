"""The last guard before the point of no return (SPEC section 4), run by the delete
activity itself immediately before its first delete, so nothing it confirms can be older
than the delete (the workflow's own decision may be minutes old under load).

It confirms once more, reading only:
- the drain's evidence is fresh: its last idle read is younger than the bound the
  workflow passes (``retirement.progress.freshness_bound``), on this worker's clock;
- the ModelDeployment still wants the replica gone: it exists with the admitted UID and
  the retirement is still one of the intents derived from the live spec and Pods (the
  rule admission applies, ``retirement.intents.intent_refusal``: a re-declared ordinal is
  never deleted);
- the withdrawal still holds (``activities.recheck.still_withdrawn``): every member is the
  admitted Pod, not terminating, without the eligibility label; no EndpointSlice lists a
  target; every router Pod, terminating ones included, answers fresh and selects none.

The members are read first (the most specific reason).  A definite conflict (the label
put back, a member gone, replaced or terminating, the spec declaring the ordinal again,
the deployment re-created) is FAILED: the retirement aborts.  Anything not confirmed (a
stale reading, a read that failed, a router that still selects a target) is UNKNOWN: the
workflow drains again.  Either way nothing was deleted.
"""

from __future__ import annotations

from datetime import UTC, datetime

import httpx

from activities.fencing import heartbeat
from activities.http_client import http_client
from activities.labels_off import labels_still_off
from activities.recheck import still_withdrawn
from activities.routers import TIMEOUT_S
from kube.api import KubeApi
from kube.deployment import MalformedDeployment, parse_deployment
from kube.errors import KubeError, NotFound
from retirement.intents import intent_refusal
from retirement.models import IntentKind, Observation, PhaseInput, RetirementRequest, Target
from retirement.names import APP_NAME, LABEL_INSTANCE, LABEL_NAME
from retirement.phases import Verdict


def refusal(
    api: KubeApi, inp: PhaseInput, *, transport: httpx.BaseTransport | None = None
) -> Observation | None:
    """Why the delete must not begin now (None: it may)."""
    why = stale(inp)
    if why:
        return Observation(verdict=Verdict.UNKNOWN, reason=why)
    members = labels_still_off(api, inp.target)  # first: the most specific reason
    if members.verdict is not Verdict.VERIFIED:
        return Observation(
            verdict=members.verdict, reason=members.reason, readings=members.readings
        )
    heartbeat()
    try:
        vanished = _intent_gone(api, inp.target)
    except KubeError as e:
        return Observation(verdict=Verdict.UNKNOWN, reason=f"ModelDeployment not read: {e}")
    except MalformedDeployment as e:
        return Observation(verdict=Verdict.UNKNOWN, reason=f"ModelDeployment unreadable: {e}")
    if vanished:
        return Observation(verdict=Verdict.FAILED, reason=vanished)
    heartbeat()
    with http_client(timeout=TIMEOUT_S, transport=transport) as http:
        check = still_withdrawn(api, inp.target, http)
    if check.verdict is Verdict.VERIFIED:
        return None
    return Observation(verdict=check.verdict, reason=check.reason, readings=check.readings)


def stale(inp: PhaseInput) -> str:
    """Why the drain's evidence in ``inp`` cannot be acted on now ("" while fresh), on this
    worker's clock (the delete takes it again: ``activities.refresh``)."""
    if inp.evidence_at is None or inp.fresh_s is None:
        return "no time of the drain's last idle read was given"
    age = (datetime.now(UTC) - inp.evidence_at).total_seconds()
    if age > inp.fresh_s:
        return f"the drain's last idle read is {age:.0f} s old (bound {inp.fresh_s:.0f} s)"
    return ""


def request_of(target: Target) -> RetirementRequest:
    """The request ``target`` was admitted for, as ``intent_refusal`` reads it."""
    surplus = target.intent is IntentKind.SURPLUS_SHED
    return RetirementRequest(
        namespace=target.namespace,
        deployment=target.deployment,
        role=target.role,
        ordinal=target.ordinal,
        intent=target.intent,
        members=[m.pod for m in target.members] if surplus else [],
    )


def _intent_gone(api: KubeApi, target: Target) -> str:
    """Why the deployment no longer wants the replica retired ("" while it does)."""
    ns, name = target.namespace, target.deployment
    try:
        raw = api.get_deployment(namespace=ns, name=name)
    except NotFound:
        return f"the ModelDeployment {ns}/{name} was deleted"
    md = parse_deployment(raw)  # MalformedDeployment: not confirmed (UNKNOWN)
    if target.deployment_uid and md.uid != target.deployment_uid:
        return f"the ModelDeployment {ns}/{name} was re-created (UID {md.uid})"
    pods = api.list_pods(namespace=ns, selector=f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={name}")
    return intent_refusal(md, pods, request_of(target))
