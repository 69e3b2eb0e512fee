"""``retire-worker --serve``: all (default), workflows or activities."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from temporalio.client import Client

from worker.build import Serves, build_worker
from worker.config import WorkerConfig


def test_serve_defaults_to_all_and_reads_the_environment() -> None:
    assert WorkerConfig.parse([], environ={}).serves is Serves.ALL
    assert WorkerConfig.parse(["--serve", "workflows"], environ={}).serves is Serves.WORKFLOWS
    env = {"RETIRE_SERVE": "activities"}
    assert WorkerConfig.parse([], environ=env).serves is Serves.ACTIVITIES


def test_an_unknown_serve_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        WorkerConfig.parse(["--serve", "everything"], environ={})
    assert e.value.code == 2
    assert "invalid choice: 'everything'" in capsys.readouterr().err


def test_an_unknown_serve_from_the_environment_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as e:
        WorkerConfig.parse([], environ={"RETIRE_SERVE": "both"})
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "RETIRE_SERVE='both' (--serve): choose from all, workflows, activities" in err
    assert len(err.splitlines()) == 1, err  # one line, no usage block


@pytest.mark.parametrize("serves", [Serves.ALL, Serves.ACTIVITIES])
def test_a_worker_running_activities_needs_a_cluster(serves: Serves) -> None:
    with (
        ThreadPoolExecutor(max_workers=1) as pool,
        pytest.raises(ValueError, match="needs a cluster"),
    ):
        build_worker(
            Client.__new__(Client),  # never used: refused before the Worker is built
            task_queue="q",
            kube=None,
            executor=pool,
            serves=serves,
        )
