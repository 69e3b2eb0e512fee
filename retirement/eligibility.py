"""The one rule for putting the eligibility label (back) on a member.

Two writers add the label: the restore of an aborted retirement (``activities.restore``)
and the watcher's repair of orphans (``watcher.reconcile``).  Both ask this function, so a
member the restore holds is never labelled by the watcher a second later:

- PodReady must be True;
- a member of a multi-member group (``in_group``) must also pass the identity probe with
  its version guard (``activities.probes``), which only the restore can run (the watcher
  never execs): the watcher therefore never labels a group member, it leaves it to the
  restore (and the operator that created it).

Taking the label off is not this rule: any writer removes it from a member that should
not serve.
"""

from __future__ import annotations

from collections.abc import Callable


def in_group(*, size: int | None, member_index: object | None) -> bool:
    """Whether a member belongs to a multi-member group: its replica's declared size is
    above one, or it carries the member-index label (set only on members of a group: a
    lone follower left of a departed role is still one).  The one definition, used by the
    restore and the watcher alike."""
    return (size or 1) > 1 or member_index is not None


#: What a caller that cannot probe is told for a group member.
UNPROBED = "a member of a group is labelled only after the identity probe (the restore's)"


def label_refusal(*, ready: str, group: bool, probe: Callable[[], str] | None) -> str:
    """Why a member may not be labelled eligible now ("" when it may).

    ``ready`` is the Pod's PodReady status ("True", "False" or "Unknown"); ``group``
    whether it belongs to a multi-member replica; ``probe`` runs the identity probe and
    answers why it failed ("" when it passed), None when the caller cannot probe.  The
    probe runs only when everything else allows the label."""
    if ready != "True":
        return f"PodReady is {ready}"
    if group:
        return UNPROBED if probe is None else probe()
    return ""
