"""Whether the disqualification still holds, read fresh: every admitted member is still
the admitted Pod and has no eligibility label (SPEC sections 4 and 6).

Read inside every drain round (``activities.recheck``), immediately before each active
router removal (``activities.withdrawal``: a removal is asked for only while the member
is alive, unlabelled, and holds the address removed, so an address handed to another
Pod is never removed from a router), and by the delete's last guard
(``activities.deletion``).  It only reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kube.api import KubeApi
from kube.errors import KubeError
from kube.members import MemberGone, read_member
from retirement.models import Target
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Verdict


@dataclass(frozen=True)
class Recheck:
    """Whether the withdrawal still holds: VERIFIED, UNKNOWN (not confirmed now) or FAILED
    (undone by someone else), why, and one reading per thing that was not confirmed."""

    verdict: Verdict
    reason: str = ""
    readings: dict[str, str] = field(default_factory=dict)
    #: Every address of the members (as admitted, and the live ``podIPs``): a member that
    #: is still the admitted Pod keeps its addresses while it lives.
    addresses: frozenset[str] = frozenset()


def labels_still_off(api: KubeApi, target: Target) -> Recheck:
    """The eligibility label is still absent on every admitted member, each still the
    admitted UID and not terminating (a member someone else deletes is a definite fault,
    as a replaced one is)."""
    addresses = {m.ip for m in target.members}
    for m in target.members:
        try:
            pod = read_member(api, namespace=target.namespace, name=m.pod, uid=m.uid)
        except KubeError as e:
            return Recheck(Verdict.UNKNOWN, f"read Pod {m.pod} failed: {_http(e)}")
        if isinstance(pod, MemberGone):
            return Recheck(Verdict.FAILED, f"member {pod.describe()}")
        if pod.terminating:
            return Recheck(Verdict.FAILED, f"member {m.pod} is terminating: someone deletes it")
        value = pod.labels.get(LABEL_ELIGIBLE)
        if value is not None:
            return Recheck(
                Verdict.FAILED,
                f"label re-added by someone else: {m.pod} has {LABEL_ELIGIBLE}={value!r}",
                {f"label/{m.pod}": f"re-added ({value!r})"},
            )
        addresses.update(pod.pod_ips)
    return Recheck(
        Verdict.VERIFIED,
        "eligibility label still absent on every member",
        addresses=frozenset(addresses),
    )


def _http(e: KubeError) -> str:
    return f"HTTP {e.status}" if e.status else f"{type(e).__name__} ({e.reason})"
