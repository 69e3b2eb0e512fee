"""The picture of recorded N = 200 worker-benchmark runs, code version by code version
(``docs/img/fleet_n200_by_code.png``): each run's idle → delete p50 beside the goal,
and how many of the 200 retirements completed with the Temporal server's CPU.

The figures are those the worker benchmark printed (``python -m bench worker --fleets
200 --busy 20 --exact --runs K``), as recorded in docs/benchmarks.md; a new run is added
here by hand.  Run: ``python -m bench.runs_picture``.
"""

from __future__ import annotations

from pathlib import Path

from bench.common import two_panels
from testbed.paths import REPO_ROOT

#: (code, idle→del p50 s of each run, completed of 200 in each, Temporal CPU s of each
#: run, None where it was not kept).
RUNS: list[tuple[str, list[float], list[int], list[float | None]]] = [
    (
        "seventh session\n(fc6980d:\n64 wait slots)",
        [48.7, 41.5, 46.2, 45.9, 58.5],
        [200, 200, 200, 200, 200],
        [None, None, None, None, None],
    ),
    ("+ local steps\n(26c9336)", [48.8, 47.4, 50.9], [188, 188, 196], [23.7, 21.7, 22.1]),
    (
        "+ 256 wait slots\n(cb82310)",
        [48.4, 40.7, 47.8, 39.0, 51.3],
        [200, 200, 200, 200, 200],
        [22.9, 19.6, 24.3, 23.5, 20.4],
    ),
    (
        "local steps\nreverted, 256\nslots (528c360)",
        [52.7, 54.5, 57.1],
        [200, 200, 200],
        [35.8, 34.7, 32.5],
    ),
    (
        "shipped before\n(24e7175,\n2026-12-06)",
        [58.2, 45.9],
        [200, 200],
        [33.0, 26.8],
    ),
    (
        "one-shot's own\nGET, no\nhttp.client",
        [26.1, 23.5, 25.0, 27.0, 25.4],
        [200, 200, 200, 200, 200],
        [20.5, 20.6, 20.2, 23.1, 19.7],
    ),
]
GOAL_S = 45.0
PICTURE = REPO_ROOT / "docs" / "img" / "fleet_n200_by_code.png"


def draw(path: Path = PICTURE) -> None:
    """Draw ``RUNS`` to ``path``."""
    with two_panels(path, figsize=(16, 4.8)) as (left, right):
        for i, (_, idle, _, _) in enumerate(RUNS):
            left.scatter([i] * len(idle), idle, color="tab:blue", zorder=3)
            left.hlines(sorted(idle)[len(idle) // 2], i - 0.25, i + 0.25, color="tab:blue")
        left.axhline(GOAL_S, color="tab:red", linestyle="--", label=f"goal {GOAL_S:.0f} s")
        left.set_xticks(range(len(RUNS)), [code for code, *_ in RUNS], fontsize=7)
        left.set_ylabel("idle → delete p50 (s), one dot per run, bar: median")
        left.set_title("N = 200: idle → delete")
        left.set_ylim(0, 62)
        left.legend(loc="upper right")
        cpu_axis = right.twinx()
        for i, (_, _, done, cpu) in enumerate(RUNS):
            right.scatter([i - 0.1] * len(done), done, color="tab:green", marker="s", zorder=3)
            kept = [c for c in cpu if c is not None]
            cpu_axis.scatter([i + 0.1] * len(kept), kept, color="tab:orange", zorder=3)
        right.set_xticks(range(len(RUNS)), [code for code, *_ in RUNS], fontsize=7)
        right.set_ylim(180, 201)
        right.set_ylabel("completed of 200 (green squares)")
        cpu_axis.set_ylim(15, 40)
        cpu_axis.set_ylabel("Temporal server CPU s (orange; before: ~34 in one run)")
        right.set_title("N = 200: completed, and the Temporal server's CPU")


if __name__ == "__main__":
    draw()
