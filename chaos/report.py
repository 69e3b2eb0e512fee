"""The campaign's report: a text summary with each invariant's result (and, for a failure,
its evidence), the data as JSON, and a timeline picture (one lane per deployment)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from chaos.oracle import Verdict

#: Whose deletes the picture marks, per mode.
JUDGED = {"product": "retire-worker/", "plain": "plain-scaledown/", "prestop": "prestop-scaledown/"}


def text(r: dict[str, Any]) -> str:
    """The summary a person reads first."""
    v: Verdict = r["verdict"]
    kinds: dict[str, int] = {}
    for f in r["faults"]:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    ok = sum(a for a, _ in r["requests"].values())
    failed = sum(b for _, b in r["requests"].values())
    lines = [
        f"seed {r['seed']} ({r['mode']}): {len(r['deployments'])} deployments, "
        f"{r['seconds']:g} s of actions, {len(r['actions'])} actions",
        f"retirements: {r['retirements']} runs {dict(sorted(r['outcomes'].items()))}; "
        f"Pod deletes judged (audit log): {r['judged_deletes']}; pods/exec: {r['execs']}",
        f"faults: {dict(sorted(kinds.items()))}",
        f"client requests: {ok} ok, {failed} failed",
    ]
    lines += [f"still running at the end: {d} {o}: {why}" for d, o, why in r["running_at_end"]]
    for inv, n in v.checked.items():
        bad = v.failed(inv)
        lines.append(f"  {'FAIL' if bad else 'pass'}  {inv:<11} {n} checked, {len(bad)} broken")
        lines += [f"        {b.subject}: {b.evidence}" for b in bad[:20]]
    lines += [f"  race (reported, not broken): {b.subject}: {b.evidence}" for b in v.races]
    lines.append("VERDICT: " + ("every invariant holds" if v.ok else "INVARIANTS BROKEN"))
    return "\n".join(lines)


def save(r: dict[str, Any], directory: Path) -> Path:
    """Write ``report.json`` and ``timeline.png`` under ``directory``; returns the JSON."""
    directory.mkdir(parents=True, exist_ok=True)
    data = dict(r)
    v: Verdict = data.pop("verdict")
    data["verdict"] = {
        "ok": v.ok,
        "checked": v.checked,
        "violations": [x.__dict__ for x in v.violations],
        "races": [x.__dict__ for x in v.races],
    }
    path = directory / "report.json"
    path.write_text(json.dumps(data, indent=1, default=str))
    picture(r, directory / "timeline.png")
    return path


PHASE_COLOURS = {
    "Admitted": "#bbbbbb",
    "Disqualified": "#9ecae1",
    "Withdrawing": "#6baed6",
    "Draining": "#fd8d3c",
    "Deleting": "#e6550d",
    "Settling": "#a1d99b",
    "Completed": "#31a354",
    "Aborted": "#fdd0a2",
}


def picture(r: dict[str, Any], path: Path) -> None:
    """One lane per deployment: retirement phases, faults, worker deletes, failed requests."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0 = r["started"]
    names = [d["name"] for d in r["deployments"]]
    lane = {n: i for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(13, 1.2 + 0.45 * len(names)))
    for dep, timeline, outcome in r["timelines"]:
        if dep not in lane or not timeline:
            continue
        # The last phase lasts to the end only for a run still going (or held).
        last = r["ended"] if outcome in ("Running", "Aborted") else timeline[-1][1] + 0.5
        ends = [*timeline[1:], ("", last)]
        for (phase, start), (_next, end) in zip(timeline, ends, strict=True):
            ax.broken_barh(
                [(start - t0, max(end - start, 0.2))],
                (lane[dep] - 0.3, 0.6),
                color=PHASE_COLOURS.get(phase.split(".")[-1], "#dddddd"),
            )
    for f in r["faults"]:
        rows = names if f["target"] == "*" else [f["target"]]
        for n in rows:
            if n in lane:
                ax.broken_barh(
                    [(f["start"] - t0, max(f["end"] - f["start"], 0.3))],
                    (lane[n] + 0.32, 0.12),
                    color="#d62728",
                    alpha=0.5,
                )
    for at, _ns, name, agent in r["deletes"]:
        dep = name.rsplit("-", 2)[0]
        if dep in lane and agent.startswith(JUDGED[r["mode"]]):
            ax.plot(at - t0, lane[dep], marker="x", color="black", markersize=7)
    for f in r["failures"]:
        if f["deployment"] in lane:
            ax.plot(f["end"] - t0, lane[f["deployment"]] - 0.4, marker="|", color="red")
    ax.axvline(r["faults_over"] - t0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("seconds since the campaign started (dashed: faults over)")
    ax.set_title(
        f"fault campaign, seed {r['seed']}: phases (bars), faults (red), deletes (x), "
        "failed requests (red |)"
    )
    handles = [Patch(color=c) for c in PHASE_COLOURS.values()]
    ax.legend(
        handles,
        list(PHASE_COLOURS),
        ncol=8,
        fontsize=7,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.25 if len(names) > 6 else -0.35),
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
