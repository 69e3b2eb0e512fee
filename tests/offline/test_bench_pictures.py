"""Each benchmark's picture draws from results shaped as its run returns them (the pictures
otherwise only run at the end of a long ``make bench``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import scale_down, watcher_fleet, worker_fleet

PNG = b"\x89PNG\r\n\x1a\n"


def watcher_results() -> list[dict[str, Any]]:
    return [
        {"m": m, "p50_ms": 10.0, "p99_ms": 15.0, "cpu_per_s": 0.01, "rss_mib": 150.0 + m / 10}
        for m in (10, 100, 500)
    ]


def worker_results() -> list[dict[str, Any]]:
    return [
        {
            "n": n,
            "busy_s": 60.0,
            "idle_p50": n / 10,
            "idle_p99": n / 5,
            "act_p99_ms": 50.0,
            "execs_per_s": 5.0,
            "cpu_s": n / 2,
            "hwm_mib": 200.0,
        }
        for n in (10, 50, 200)
    ]


def scale_down_result() -> dict[str, Any]:
    phases = [("Admitted", 0.0), ("Withdrawing", 1.1), ("Draining", 4.7), ("Deleting", 0.1)]
    return {
        "streams": 20,
        "longest_s": 5.0,
        "routers": {
            k: {"counts": {"product": [135, 0], "direct": [124, 10], "prestop": [129, 0]},
                "phases": phases}
            for k in ("sglang-router", "smg", "vllm-router")
        },
    }  # fmt: skip


@pytest.mark.parametrize(
    "draw",
    [
        lambda p: watcher_fleet.picture(watcher_results(), p),
        lambda p: worker_fleet.picture(worker_results(), p),
        lambda p: scale_down.picture(scale_down_result(), p),
    ],
    ids=["watcher", "worker", "scale-down"],
)
def test_each_benchmark_draws_its_picture(
    draw: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "results" / "picture.png"
    draw(path)
    assert path.read_bytes().startswith(PNG)
    assert f"picture: {path}" in capsys.readouterr().out
