"""The worker benchmark's own figures: what a run cost the Temporal server, and its count
of the victims left (a metadata-only list, whose empty answer carries ``items: null``)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from bench.worker_fleet import (
    METADATA_ONLY,
    median_runs,
    server_costs,
    spread_of_runs,
    victims_left,
)
from testbed.bed import Bed

Lat = dict[tuple[str, str, str], tuple[float, float]]


def test_server_costs_are_the_runs_deltas_per_retirement() -> None:
    before: Lat = {
        ("persistence_latency", "history", "UpdateWorkflowExecution"): (100.0, 1.0),
        ("persistence_latency", "frontend", "GetNamespace"): (50.0, 0.5),
        ("service_latency", "history", "RespondWorkflowTaskCompleted"): (10.0, 0.3),
    }
    after: Lat = {
        ("persistence_latency", "history", "UpdateWorkflowExecution"): (160.0, 2.2),
        ("persistence_latency", "frontend", "GetNamespace"): (70.0, 0.7),
        ("persistence_latency", "matching", "CreateTasks"): (20.0, 0.1),  # new in the run
        ("service_latency", "history", "RespondWorkflowTaskCompleted"): (30.0, 4.3),
        ("service_latency", "history", "RecordWorkflowTaskStarted"): (20.0, 2.0),
        ("service_latency", "frontend", "RespondActivityTaskCompleted"): (5.0, 9.0),
    }
    c = server_costs(after, before, n=2)
    assert c["db_calls_per_retirement"] == pytest.approx((60 + 20 + 20) / 2)
    assert c["db_s_per_retirement"] == pytest.approx((1.2 + 0.2 + 0.1) / 2)
    assert c["updates_per_retirement"] == pytest.approx(60 / 2)
    assert c["RespondWorkflowTaskCompleted_ms"] == pytest.approx(1000 * 4.0 / 20)
    assert c["RecordWorkflowTaskStarted_ms"] == pytest.approx(1000 * 2.0 / 20)
    # Only the history service's own handling counts; none in the run: no figure.
    assert math.isnan(c["RespondActivityTaskCompleted_ms"])


@dataclass
class FakeControlPlane:
    bodies: dict[str, dict[str, Any]]
    asked: list[tuple[str, str | None]] = field(default_factory=list)

    def _get(self, path: str, *, accept: str | None = None) -> str:
        self.asked.append((path, accept))
        return json.dumps(self.bodies[path.split("/")[4]])


@dataclass
class FakeBed:
    cp: FakeControlPlane


def test_victims_left_counts_metadata_only_lists_an_empty_one_null() -> None:
    cp = FakeControlPlane(
        {
            "a": {"kind": "PartialObjectMetadataList", "items": [{"metadata": {}}] * 3},
            "b": {"kind": "PartialObjectMetadataList", "items": None},
        }
    )
    assert victims_left(cast(Bed, FakeBed(cp)), ["a", "b"]) == 3
    assert [accept for _, accept in cp.asked] == [METADATA_ONLY, METADATA_ONLY]
    assert all("labelSelector=" in path for path, _ in cp.asked)


def test_runs_of_one_size_are_reported_each_and_drawn_by_their_median() -> None:
    results = [
        {"n": 50, "run": 1, "del_p50": 8.0, "completed": 50, "cpu_s": 8, "exact": True},
        {"n": 200, "run": 1, "del_p50": 43.5, "completed": 200, "cpu_s": 50, "exact": True},
        {"n": 200, "run": 2, "del_p50": 69.5, "completed": 199, "cpu_s": 60, "exact": True},
        {"n": 200, "run": 3, "del_p50": 54.6, "completed": 200, "cpu_s": 55, "exact": True},
    ]
    lines = spread_of_runs(results)
    assert len(lines) == 1  # N = 50 ran once: nothing to summarise
    assert "N=200 over 3 runs" in lines[0] and "median 54.6 s" in lines[0]
    assert "43.5 / 69.5 / 54.6 s" in lines[0] and "200 / 199 / 200 of 200" in lines[0]
    drawn = median_runs(results)
    assert [d["n"] for d in drawn] == [50, 200]
    assert drawn[1]["del_p50"] == 54.6 and drawn[1]["cpu_s"] == 55
    assert drawn[1]["exact"] is True  # flags are kept, not averaged
