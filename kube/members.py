"""Operations on a retirement's member Pods, each bound to the UID admission recorded.

A Pod of the same name with another UID is a replacement and is never touched: reads
say so (``MemberGone``), the eligibility-label patch first ``test``s the UID, deletes
carry a UID precondition.  The label patch also ``test``s the label's current value
(present with a value, or absent: ``null``), so a concurrent change of the label is
never overwritten blindly; a removal may also ``test`` the resourceVersion it read, so
it lands only on the Pod exactly as read; a failed ``test`` (HTTP 422) is told apart
from a replacement by reading the Pod again.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kube.api import KubeApi
from kube.errors import Conflict, Invalid, NotFound
from kube.objects import Pod
from retirement.names import LABEL_ELIGIBLE

__all__ = [
    "Deletion",
    "LabelChange",
    "MemberGone",
    "delete_member",
    "eligibility_patch",
    "json_pointer_escape",
    "label_path",
    "read_member",
    "set_eligibility",
]

ELIGIBLE_VALUE = "true"


def json_pointer_escape(token: str) -> str:
    """One RFC 6901 reference token: ``~`` becomes ``~0`` first, then ``/`` becomes ``~1``."""
    return token.replace("~", "~0").replace("/", "~1")


def label_path(key: str) -> str:
    """The JSON pointer of label ``key`` of an object."""
    return f"/metadata/labels/{json_pointer_escape(key)}"


@dataclass(frozen=True)
class MemberGone:
    """The admitted member is not there: no Pod of that name, or another UID."""

    name: str
    live_uid: str | None = None  # the replacement's UID; None: no Pod of that name

    @property
    def replaced(self) -> bool:
        """A Pod of the same name with another UID exists."""
        return self.live_uid is not None

    def describe(self) -> str:
        """``<name> is gone`` or ``<name> was replaced (UID …)``."""
        if self.live_uid is None:
            return f"{self.name} is gone"
        return f"{self.name} was replaced (UID {self.live_uid})"


def read_member(api: KubeApi, *, namespace: str, name: str, uid: str) -> Pod | MemberGone:
    """The member Pod if it is still the admitted UID, else why not."""
    try:
        pod = api.read_pod(namespace=namespace, name=name)
    except NotFound:
        return MemberGone(name)
    return pod if pod.uid == uid else MemberGone(name, pod.uid)


class LabelChange(StrEnum):
    """What a bound eligibility-label patch did."""

    APPLIED = "applied"
    CHANGED = "changed"  # the label was not as read: changed concurrently, nothing written
    GONE = "gone"  # no Pod of that name
    REPLACED = "replaced"  # a Pod of that name with another UID: not touched


def eligibility_patch(
    *,
    uid: str,
    current: str | None,
    eligible: bool,
    key: str = LABEL_ELIGIBLE,
    resource_version: str = "",
) -> list[dict[str, Any]]:
    """The JSON patch that sets (``eligible``) or removes the label on the Pod ``uid``,
    only if the label is still ``current`` (None: absent) and, given ``resource_version``,
    only if nothing at all was written to the Pod since it was read."""
    path = label_path(key)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": path, "value": current},
    ]
    if resource_version:
        ops.append({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})
    if eligible:
        ops.append({"op": "add", "path": path, "value": ELIGIBLE_VALUE})
    elif current is not None:
        ops.append({"op": "remove", "path": path})
    return ops


def set_eligibility(
    api: KubeApi,
    *,
    namespace: str,
    name: str,
    uid: str,
    current: str | None,
    eligible: bool,
    resource_version: str = "",
) -> LabelChange:
    """Put the eligibility label on (``eligible``) or take it off the admitted member,
    bound to its UID and to the label value last read (``current``); given
    ``resource_version``, also to the whole Pod as read (any write since reads CHANGED)."""
    try:
        api.patch_pod(
            namespace=namespace,
            name=name,
            ops=eligibility_patch(
                uid=uid, current=current, eligible=eligible, resource_version=resource_version
            ),
        )
    except NotFound:
        return LabelChange.GONE
    except Invalid:
        # A ``test`` failed: either the UID (replaced) or the label (changed meanwhile).
        now = read_member(api, namespace=namespace, name=name, uid=uid)
        if isinstance(now, MemberGone):
            return LabelChange.REPLACED if now.replaced else LabelChange.GONE
        return LabelChange.CHANGED
    return LabelChange.APPLIED


class Deletion(StrEnum):
    """What a UID-bound delete did."""

    DELETED = "deleted"
    GONE = "gone"  # nothing of that name
    REPLACED = "replaced"  # the precondition failed: another UID, not touched


def delete_member(api: KubeApi, *, namespace: str, name: str, uid: str) -> Deletion:
    """Delete the member Pod only if it is still the admitted UID."""
    try:
        api.delete_pod(namespace=namespace, name=name, uid=uid)
    except NotFound:
        return Deletion.GONE
    except Conflict:
        return Deletion.REPLACED
    return Deletion.DELETED
