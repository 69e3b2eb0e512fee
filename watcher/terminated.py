"""A retirement that was terminated: what the watcher does about the run it finds.

A terminated run skipped its restore and its last mirror write.  The watcher clears the
ModelDeployment's ``status.retirement`` while it still names that run
(``TerminatedRuns._clear_mirror``) and posts one ``RetirementTerminated`` Warning Event
naming the admitted members the run left without the eligibility label
(``left_unlabelled``, ``terminated_message``): single members get it back from the
watcher's label repair; members of a group need the identity probe, which the watcher
cannot run, so a person must act (``retire_watcher_terminated_total{left_unlabelled}``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kube.api import KubeApi
from kube.deployment import ModelDeployment
from kube.errors import Conflict, Forbidden, NotFound
from kube.objects import Pod
from retirement.eligibility import in_group
from retirement.models import RetirementState, Target
from retirement.names import LABEL_ELIGIBLE, LABEL_MEMBER_INDEX
from watcher.metrics import WatcherMetrics
from watcher.reporting import one_line, watch_event
from watcher.retirements import Retirements, error_name

log = logging.getLogger("retire-watcher")

#: How long the state of a terminated run is waited for (a worker replays its history).
TERMINATED_QUERY_TIMEOUT = timedelta(seconds=5)
#: What became of a terminated run's ``status.retirement`` (``TerminatedRuns._clear_mirror``).
CLEARED, FORBIDDEN = "cleared", "forbidden"


@dataclass
class TerminatedRuns:
    """Reports terminated runs (each once: the reconciler remembers which it read)."""

    kube: KubeApi
    retirements: Retirements
    metrics: WatcherMetrics

    async def report(self, wid: str, run_id: str, md: ModelDeployment, pods: list[Pod]) -> None:
        """The run ``run_id`` was terminated: its restore and its last mirror write were
        skipped.  Clear ``status.retirement`` while it names that run, and post one
        Warning Event naming the admitted members it left without the eligibility label:
        single members get it back from this watcher's label repair; members of a group
        need the identity probe, which the watcher cannot run, so a person must act.
        Raises (and is read again on the next reconcile) when the status could not be
        written; the caller remembers the run as read once this returns."""
        final = await self._terminated_state(wid, run_id)
        target = final.target if final is not None else None
        mirrored, cleared = await self._clear_mirror(wid, run_id, md, target)
        single, group = left_unlabelled(md, pods, target, mirrored)
        left = "group" if group else "single" if single else "none"
        role = final.request.role if final is not None else str(mirrored.get("roleName", "?"))
        ordinal = (
            str(final.request.ordinal)
            if final is not None
            else str(mirrored.get("replicaOrdinal", "?"))
        )
        message = terminated_message(
            wid,
            run_id,
            md=md,
            replica=f"{role}:{ordinal}",
            cleared=cleared,
            single=single,
            group=group,
            source="" if final is not None else "status.retirement" if mirrored else "nothing",
        )
        posted = watch_event(
            self.kube, md.ref, "RetirementTerminated", message, f"{wid}|{run_id}", warning=True
        )
        if posted:  # counted once per run, even when a restarted watcher reads it again
            self.metrics.terminated.labels(left_unlabelled=left).inc()
            log.warning("%s/%s: %s", md.namespace, md.name, message)

    async def _terminated_state(self, wid: str, run_id: str) -> RetirementState | None:
        """The last state of the terminated run (a worker replays its history to answer),
        or None when it cannot be read (no worker answers in time, a history an earlier
        build wrote): ``status.retirement`` is read instead."""
        try:
            return await self.retirements.state(
                wid, run_id=run_id, rpc_timeout=TERMINATED_QUERY_TIMEOUT
            )
        except Exception as e:
            log.warning(
                "%s: the state of terminated run %s cannot be read (%s: %s): "
                "reading status.retirement instead",
                wid,
                run_id,
                error_name(e),
                one_line(e),
            )
            return None

    async def _clear_mirror(
        self, wid: str, run_id: str, md: ModelDeployment, target: Target | None
    ) -> tuple[dict[str, Any], str]:
        """Remove ``status.retirement`` if it still mirrors the terminated run ``run_id``:
        it names ``wid``, the deployment is the one the run admitted (its UID), and no
        newer run of ``wid`` exists (asked after the read, so a newer run's status is
        never taken for this one's).  The status subresource's merge patch carries the
        version read and the admitted UID as preconditions: a write in between is a
        Conflict, and the whole check is made again.  Returns what ``status.retirement``
        said when read, and ``CLEARED``, ``FORBIDDEN`` (RBAC does not let the watcher
        write the status: said in the Event, never retried in a loop) or "" (not this
        run's to clear)."""
        admitted_uid = target.deployment_uid if target is not None else ""
        for _ in range(3):
            try:
                raw = self.kube.get_deployment(namespace=md.namespace, name=md.name)
            except NotFound:
                return {}, ""
            mirrored = _retirement_status(raw)
            meta = raw.get("metadata") or {}
            if mirrored.get("workflowID") != wid:
                return {}, ""  # not this workflow's (or already cleared)
            if admitted_uid and meta.get("uid") != admitted_uid:
                return {}, ""  # re-created since: the status is another run's
            latest = await self.retirements.describe(wid)
            if latest.run_id != run_id:
                return {}, ""  # a newer run: the status may be its own
            precondition: dict[str, Any] = {"resourceVersion": meta.get("resourceVersion")}
            if admitted_uid:
                precondition["uid"] = admitted_uid
            try:
                self.kube.patch_deployment_status(
                    namespace=md.namespace,
                    name=md.name,
                    patch={"metadata": precondition, "status": {"retirement": None}},
                )
            except NotFound:
                return mirrored, ""
            except Forbidden as e:
                log.warning("%s: status.retirement not cleared: %s", wid, e)
                return mirrored, FORBIDDEN
            except Conflict:
                continue  # written in between (or re-created): read and check again
            return mirrored, CLEARED
        raise Conflict(
            f"clear status.retirement of ModelDeployment {md.namespace}/{md.name}",
            status=409,
            reason="Conflict",
        )


def _retirement_status(raw: Any) -> dict[str, Any]:
    """``status.retirement`` of a raw ModelDeployment ({} when absent or not a mapping)."""
    status = raw.get("status") if isinstance(raw, dict) else None
    mirrored = status.get("retirement") if isinstance(status, dict) else None
    return dict(mirrored) if isinstance(mirrored, dict) else {}


def left_unlabelled(
    md: ModelDeployment, pods: list[Pod], target: Target | None, mirrored: dict[str, Any]
) -> tuple[list[Pod], list[Pod]]:
    """The admitted members a terminated run left without the eligibility label, as
    (single members, members of a group).  The admitted members are the run's target's
    (those its restore would have put back), else the UIDs ``status.retirement`` lists;
    a Pod that is gone or terminating is left out."""
    if target is not None:
        restorable = set(target.restorable())
        uids = {m.uid for m in target.members if m.pod in restorable}
        role_name, size = target.role, target.size
    else:
        listed = mirrored.get("targetMemberUIDs")
        uids = (
            {u for u in listed if isinstance(u, str) and u} if isinstance(listed, list) else set()
        )
        role_name, size = str(mirrored.get("roleName", "")), None
    if size is None:
        declared = md.role(role_name)
        size = declared.size if declared is not None else None
    single: list[Pod] = []
    group: list[Pod] = []
    for p in sorted(pods, key=lambda p: p.name):
        if p.uid not in uids or p.terminating or p.labels.get(LABEL_ELIGIBLE) == "true":
            continue
        grouped = in_group(size=size, member_index=p.labels.get(LABEL_MEMBER_INDEX))
        (group if grouped else single).append(p)
    return single, group


def terminated_message(
    wid: str,
    run_id: str,
    *,
    md: ModelDeployment,
    replica: str,
    cleared: str,
    single: list[Pod],
    group: list[Pod],
    source: str,
) -> str:
    """What the ``RetirementTerminated`` Event says: what was skipped, which members are
    without the label, and what happens to them or what a person should do.  ``source``:
    where the admitted members were read when the run's state could not be ("" when it
    could; "nothing" when neither says)."""
    parts = [
        f"{wid} (run {run_id}, replica {replica}) was terminated: its restore was skipped"
        + (
            "; status.retirement cleared"
            if cleared == CLEARED
            else "; status.retirement could not be cleared: the watcher may not patch "
            "modeldeployments/status (RBAC)"
            if cleared == FORBIDDEN
            else ""
        )
    ]
    if source == "nothing":
        parts.append(
            "which members it admitted is not known (its state could not be read and "
            f"status.retirement does not name it): check the replica's Pods for {LABEL_ELIGIBLE}"
        )
    elif not single and not group:
        parts.append(f"no admitted member is left without {LABEL_ELIGIBLE}")
    if single:
        parts.append(
            f"without {LABEL_ELIGIBLE}: {_names(single)}: the watcher puts the label back "
            "on each once it is Ready (unless a retirement names it again)"
        )
    if group:
        parts.append(
            f"group members without {LABEL_ELIGIBLE}: {_names(group)}: the watcher cannot "
            "put it back (a group member needs the identity probe); once each serves, "
            f"label it by hand (kubectl label pod <name> -n {md.namespace} "
            f"{LABEL_ELIGIBLE}=true), unless {replica} is still to be retired (its next "
            "retirement takes them); see docs/runbook.md"
        )
    if source == "status.retirement":
        parts.append("members read from status.retirement (the run's state could not be read)")
    return "; ".join(parts)


def _names(pods: list[Pod], limit: int = 8) -> str:
    names = [p.name for p in pods[:limit]]
    more = len(pods) - limit
    return ", ".join(names) + (f" and {more} more" if more > 0 else "")
