"""The kube-apiserver's audit log, read as the fault campaign's evidence.

The bed's API server writes one JSON object per line (``testbed.controlplane.AUDIT_POLICY``:
every write to a Pod or a ModelDeployment, each pods/exec).  This module turns those lines
into typed records; it trusts nothing the product wrote about itself: who acted is the
request's ``User-Agent`` as the server recorded it, when is the server's own timestamp.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from retirement.names import LABEL_COMPONENT, LABEL_INSTANCE, LABEL_ORDINAL

#: The User-Agent prefix of the product's worker (``kube.client.Kube.from_config``).
WORKER_AGENT = "retire-worker/"


def _when(stamp: str) -> float:
    """An audit timestamp (RFC 3339, microseconds, ``Z``) as epoch seconds."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class PodDelete:
    """One accepted DELETE of a Pod."""

    at: float  #: when the server received the request (epoch seconds)
    namespace: str
    name: str
    uid: str  #: the deleted Pod's UID (from the server's answer)
    deployment: str
    role: str
    ordinal: int | None
    agent: str  #: the request's User-Agent
    precondition_uid: str | None  #: ``DeleteOptions.preconditions.uid``, if sent
    #: The deleted object's status shows a container created or the Pod Ready (False: it
    #: never started, so no engine ever ran in it).
    started: bool = True

    @property
    def by_worker(self) -> bool:
        """Sent by the product's worker."""
        return self.agent.startswith(WORKER_AGENT)

    @property
    def hub_name(self) -> str:
        """The engine emulator's name for this Pod (``testbed.standin_operator``)."""
        return f"{self.name}.{self.uid[:8]}"


@dataclass(frozen=True)
class SpecWrite:
    """A ModelDeployment as stored by one write (``replicas`` None: deleted)."""

    at: float
    namespace: str
    name: str
    replicas: dict[str, int] | None  #: role -> declared replicas


@dataclass(frozen=True)
class Audit:
    """What the audit log says, in server order."""

    deletes: list[PodDelete]
    specs: list[SpecWrite]
    execs: list[tuple[str, str]]  #: each pods/exec request: (namespace, User-Agent)
    refused_deletes: int  #: Pod DELETEs the server refused (precondition, not found, ...)
    unreadable: int  #: lines that were not an audit event

    def only(self, namespace: str) -> Audit:
        """The events of one namespace."""
        return replace(
            self,
            deletes=[d for d in self.deletes if d.namespace == namespace],
            specs=[w for w in self.specs if w.namespace == namespace],
            execs=[e for e in self.execs if e[0] == namespace],
        )

    def declared(self, namespace: str, name: str, at: float) -> dict[str, int] | None:
        """The replicas per role the spec declared at ``at`` (None: no such deployment
        then). The last write stored before ``at`` counts."""
        return self.declared_since(namespace, name, at)[0]

    def declared_since(
        self, namespace: str, name: str, at: float
    ) -> tuple[dict[str, int] | None, float]:
        """``declared`` and since when (the write's time; 0 when there was none)."""
        last: tuple[dict[str, int] | None, float] = (None, 0.0)
        for w in self.specs:
            if w.at > at:
                break
            if (w.namespace, w.name) == (namespace, name):
                last = (w.replicas, w.at)
        return last


def _ordinal(labels: dict[str, str]) -> int | None:
    try:
        return int(labels.get(LABEL_ORDINAL, ""))
    except ValueError:
        return None


def _started(pod: dict[str, Any]) -> bool:
    """Whether a Pod as the server returned it ever started: a container ID (the kubelet
    sets one when it creates the container) or the Ready condition True."""
    status = pod.get("status") or {}
    created = any(
        isinstance(c, dict) and c.get("containerID") for c in status.get("containerStatuses") or []
    )
    ready = any(
        isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return created or ready


def _replicas(obj: dict[str, Any]) -> dict[str, int]:
    roles = (obj.get("spec") or {}).get("roles") or []
    return {str(r.get("name")): int(r.get("replicas") or 0) for r in roles if isinstance(r, dict)}


def read(lines: Iterable[str]) -> Audit:
    """Parse audit lines (``ResponseComplete`` events; others are skipped)."""
    deletes: list[PodDelete] = []
    specs: list[SpecWrite] = []
    execs: list[tuple[str, str]] = []
    refused = unreadable = 0
    for line in lines:
        try:
            ev = json.loads(line)
            ref = ev["objectRef"]
        except (ValueError, KeyError, TypeError):
            unreadable += line.strip() != ""
            continue
        if ev.get("stage") != "ResponseComplete":
            continue
        resource, sub = ref.get("resource"), ref.get("subresource")
        code = int((ev.get("responseStatus") or {}).get("code") or 0)
        at = _when(ev["requestReceivedTimestamp"])
        if resource == "pods" and sub == "exec":
            execs.append((str(ref.get("namespace")), str(ev.get("userAgent") or "")))
        elif resource == "pods" and not sub and ev.get("verb") == "delete":
            obj = ev.get("responseObject") or {}
            if code not in (200, 202) or obj.get("kind") != "Pod":
                refused += 1
                continue
            meta = obj.get("metadata") or {}
            labels = meta.get("labels") or {}
            pre = (ev.get("requestObject") or {}).get("preconditions") or {}
            deletes.append(
                PodDelete(
                    at=at,
                    namespace=str(ref.get("namespace")),
                    name=str(ref.get("name")),
                    uid=str(meta.get("uid")),
                    deployment=labels.get(LABEL_INSTANCE, ""),
                    role=labels.get(LABEL_COMPONENT, ""),
                    ordinal=_ordinal(labels),
                    agent=str(ev.get("userAgent") or ""),
                    precondition_uid=pre.get("uid"),
                    started=_started(obj),
                )
            )
        elif resource == "modeldeployments" and not sub and 200 <= code < 300:
            # A spec write counts from when it was stored (the answer), not received.
            at = _when(ev.get("stageTimestamp") or ev["requestReceivedTimestamp"])
            obj = ev.get("responseObject") or {}
            gone = ev.get("verb") == "delete"
            specs.append(
                SpecWrite(
                    at=at,
                    namespace=str(ref.get("namespace")),
                    name=str(ref.get("name")),
                    replicas=None if gone else _replicas(obj),
                )
            )
    specs.sort(key=lambda w: w.at)
    deletes.sort(key=lambda d: d.at)
    return Audit(deletes, specs, execs, refused, unreadable)


def read_file(path: Path, *, offset: int = 0) -> Audit:
    """Parse the audit log at ``path`` from byte ``offset`` (where a run began)."""
    with path.open("rb") as f:
        f.seek(offset)
        return read(line.decode("utf-8", errors="replace") for line in f)
