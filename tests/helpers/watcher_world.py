"""The world of one offline watcher test: a FakeKube, a FakeTemporal and the reconciler
over them (``make_world``), with the deployments, replicas and requests the tests build.
Shared by the ``tests/offline/test_watcher_*.py`` files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kube.objects import Pod
from retirement.models import (
    IntentKind,
    MemberTarget,
    RetirementRequest,
    Target,
    workflow_id_for,
)
from retirement.names import LABEL_ELIGIBLE
from retirement.phases import Outcome, Phase
from tests.helpers import model_deployment
from tests.helpers.fake_kube import FakeKube, member_pod
from tests.helpers.fake_temporal import FakeTemporal, TemporalCall
from watcher.fleet import decode_deployment
from watcher.metrics import WatcherMetrics
from watcher.reconcile import Reconciler, WatcherSettings

NS = "default"
MD = "llm"
MD_UID = "md-uid-1"
WID = workflow_id_for(namespace=NS, deployment=MD)


@dataclass
class World:
    """A FakeKube, a FakeTemporal, and the reconciler over them."""

    kube: FakeKube
    temporal: FakeTemporal
    metrics: WatcherMetrics
    rec: Reconciler

    async def pass_(self, times: int = 1) -> None:
        for _ in range(times):
            await self.rec.reconcile_all()

    def metric(self, name: str, **labels: str) -> float:
        value = self.metrics.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def starts(self) -> list[RetirementRequest]:
        return [c.arg for c in self.temporal.called("start_workflow")]

    def signals(self, workflow_id: str = WID) -> list[TemporalCall]:
        return [c for c in self.temporal.called("signal") if c.workflow_id == workflow_id]

    def updates(self) -> list[TemporalCall]:
        return self.temporal.called("execute_update")

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.kube.events.values() if reason is None or e["reason"] == reason]

    def annotations(self, name: str = MD, namespace: str = NS) -> dict[str, str]:
        meta = self.kube.deployments[(namespace, name)]["metadata"]
        return dict(meta.get("annotations") or {})

    def eligible(self, pod: str, namespace: str = NS) -> str | None:
        return self.kube.pod_labels(pod, namespace=namespace).get(LABEL_ELIGIBLE)


class Clock:
    """The reconciler's clock (for the refusal back-off), moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_world(
    *,
    settings: WatcherSettings | None = None,
    namespaces: list[str] | None = None,
    clock: Clock | None = None,
) -> World:
    kube, temporal, metrics = FakeKube(), FakeTemporal(), WatcherMetrics()
    rec = Reconciler(
        kube=kube,
        temporal=temporal.client(),
        settings=settings or WatcherSettings(),
        metrics=metrics,
        namespaces=namespaces,
        clock=clock or Clock(),
    )
    return World(kube, temporal, metrics, rec)


def add_md(
    w: World,
    name: str = MD,
    *,
    namespace: str = NS,
    status: dict[str, Any] | None = None,
    **kw: Any,
) -> dict[str, Any]:
    body = model_deployment(name, namespace=namespace, uid=f"{name}-uid", **kw)
    if name == MD and namespace == NS:
        body["metadata"]["uid"] = MD_UID
    if status is not None:
        body["status"] = status
    return w.kube.add_deployment(body)


def add_replicas(
    w: World,
    ordinals: range | list[int],
    *,
    deployment: str = MD,
    namespace: str = NS,
    role_name: str = "server",
    **kw: Any,
) -> list[str]:
    """One single-member replica per ordinal, Pod ``<deployment>-<role>-<ordinal>``."""
    names = []
    for o in ordinals:
        name = f"{deployment}-{role_name}-{o}"
        w.kube.add_pod(
            member_pod(
                name,
                deployment=deployment,
                namespace=namespace,
                role=role_name,
                ordinal=o,
                uid=f"uid-{deployment}-{role_name}-{o}",
                **kw,
            )
        )
        names.append(name)
    return names


def request(
    ordinal: int,
    *,
    role_name: str = "server",
    intent: IntentKind = IntentKind.COUNT_TRIM,
    members: list[str] | None = None,
    deployment: str = MD,
) -> RetirementRequest:
    return RetirementRequest(
        namespace=NS,
        deployment=deployment,
        role=role_name,
        ordinal=ordinal,
        intent=intent,
        members=members or [],
    )


def target_of(req: RetirementRequest, pods: dict[str, str]) -> Target:
    """A bound target of ``req`` over ``pods`` (name -> uid)."""
    return Target(
        namespace=req.namespace,
        deployment=req.deployment,
        role=req.role,
        ordinal=req.ordinal,
        intent=req.intent,
        engine="vLLM",
        shape="Single",
        members=[
            MemberTarget(pod=name, uid=uid, container_id="containerd://main-1", ip="198.18.1.9")
            for name, uid in pods.items()
        ],
    )


def held(w: World, ordinal: int = 2, **state: Any) -> None:
    """A retirement of ``ordinal`` held after an abort."""
    state.setdefault("outcome", Outcome.ABORTED)
    state.setdefault("phase", Phase.ABORTED)
    w.temporal.running(request(ordinal), **state)


def cache_without_refresh(w: World) -> None:
    """Fill the reconciler's cache as the informers do, and never refresh the running set
    (a watcher just started or failed over, before its first visibility query)."""
    entries = [d for d in map(decode_deployment, w.kube.deployments.values()) if d]
    w.rec.fleet.replace_deployments(entries)
    w.rec.fleet.replace_pods(Pod.from_raw(p) for p in w.kube.pods.values())
