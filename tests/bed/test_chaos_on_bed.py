"""A short fault campaign (issue 19) in the suite: a fixed seed, six deployments (four
real routers, vllm-router 0.1.15 among them, one router-less; a leader-served and an
External-DP group) under streaming load, with every action kind of ``chaos.schedule``
(kills of the worker, the watcher, Temporal, the kube-apiserver and routers, a stalled
API server or router, a paused worker, a second watcher, cancels and retry annotations, a
deployment deleted and re-created, labels put back or taken off by hand, engines busy,
silent, restarted or answering garbage metrics, a Pod deleted by hand); judged by the
oracle from the API server's audit log and the engines' own journals."""

from __future__ import annotations

from collections import Counter

from chaos.campaign import campaign
from chaos.report import save, text
from chaos.schedule import WEIGHTS, draw
from testbed.bed import Bed

#: A seed whose plan (six deployments) scales down 10 times, 4 of them in the groups,
#: carries every action kind in 180 s (a routed deployment, c01 behind vllm-router,
#: deleted and re-created, then scaled up), and stalls the API server for 34.4 s once.
SEED = 140567


async def test_a_short_campaign_keeps_every_invariant(bed: Bed, namespace: str) -> None:
    plan = draw(seed=SEED, seconds=180, deployments=6)
    kinds = Counter(a.kind for a in plan.actions)
    assert set(kinds) == set(WEIGHTS), kinds
    routed = {d.name for d in plan.deployments if d.router}
    assert any(a.kind == "recreate" and a.target in routed for a in plan.actions)
    r = await campaign(
        plan,
        bed=bed,
        namespace=namespace,
        state_dir=bed.state_dir / f"chaos-{namespace}",
        settle_s=150,
        streams=2,
    )
    print("\n" + text(r))
    save(r, bed.state_dir / f"chaos-{namespace}" / "report")
    v = r["verdict"]
    # The campaign did what it is for: retirements deleted Pods while faults ran.
    assert r["worker_deletes"] >= 1 and r["retirements"] >= 2, r["outcomes"]
    assert v.checked["in-flight"] == r["worker_deletes"]
    # The audit log names the product for its engine reads too (its User-Agent).
    assert r["execs"] > 0 and all(a.startswith("retire-worker/") for a in r["exec_agents"]), r[
        "exec_agents"
    ]
    assert v.ok, text(r)
