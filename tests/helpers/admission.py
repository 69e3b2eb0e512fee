"""A replica admitted for retirement on a ``FakeKube``, as the phase activities' offline
tests start from: replica 1 of ModelDeployment ``llm`` in ``default``, admitted by the
product's own ``admit`` activity, its eligibility label then taken off (what disqualify
leaves), and the fake's call log cleared."""

from __future__ import annotations

from typing import Any

from activities import RetirementActivities
from retirement.models import Admission, AdmitInput, RetirementRequest, Target
from retirement.names import LABEL_ELIGIBLE
from tests.helpers.activity_env import attempt_env
from tests.helpers.fake_kube import FakeKube, member_pod
from tests.helpers.manifests import model_deployment

NS = "default"
MD = "llm"


def victim(**kw: Any) -> dict[str, Any]:
    """The single member Pod of replica 1 (``uid-1`` at 198.18.1.11 unless told)."""
    kw.setdefault("uid", "uid-1")
    kw.setdefault("ip", "198.18.1.11")
    return member_pod("llm-1", deployment=MD, ordinal=1, **kw)


def sibling() -> dict[str, Any]:
    """Replica 0's Pod, which stays."""
    return member_pod("llm-0", deployment=MD, ordinal=0, uid="uid-0", ip="198.18.1.10")


def admitted(
    *pods: dict[str, Any],
    engine: str = "vLLM",
    size: int = 1,
    extra_args: list[str] | None = None,
    router: str | None = None,
    kube: FakeKube | None = None,
) -> tuple[FakeKube, Target]:
    """Replica 1 of ``llm`` admitted and disqualified; ``pods`` (default: ``victim()``)."""
    kube = kube or FakeKube()
    version = "0.5.21" if engine == "SGLang" else "0.29.0"
    kube.add_deployment(
        model_deployment(
            MD,
            namespace=NS,
            engine=engine,
            version=version,
            replicas=1,  # replica 1 is a count trim
            size=size,
            extra_args=extra_args,
            router=router,
        )
    )
    for p in pods or (victim(),):
        kube.add_pod(p)
    req = RetirementRequest(namespace=NS, deployment=MD, role="server", ordinal=1)
    admission: Admission = attempt_env().run(
        RetirementActivities(kube).admit, AdmitInput(request=req, workflow_id="wf")
    )
    assert admission.target is not None, admission.refusal
    for m in admission.target.members:
        kube.set_label(m.pod, LABEL_ELIGIBLE, None)
    kube.calls.clear()
    return kube, admission.target
