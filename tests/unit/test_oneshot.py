"""The in-container one-shot, run for real (python3 -c) against an emulator on loopback:
every bad body reads UNKNOWN, a good one reads the exact sums."""

from __future__ import annotations

import subprocess
import sys

import pytest

from activities.oneshot import command, valid_path, valid_port, valid_scheme
from retirement.readings import SERIES, parse_oneshot_output
from testbed.emulator import EngineEmulator


def run(port: int, engine: str = "vLLM", timeout: float = 8) -> str:
    argv = command(port=port, scheme="http", path="/metrics", names=SERIES[engine].all)
    argv[0] = sys.executable  # this interpreter carries prometheus_client, as engines do
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=True).stdout


def test_idle_engine_reads_complete_and_sums_over_dp_ranks(vllm: EngineEmulator) -> None:
    vllm.set_stale_gauges(2, 1)  # reported on rank 0; rank 1 reads 0
    s = parse_oneshot_output(engine="vLLM", stdout=run(vllm.metrics_port))
    assert s.complete and s.in_flight == 3


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("huge", "1 MiB"),
        ("malformed", "malformed"),
        ("nan", "invalid"),
        ("negative", "invalid"),
        ("missing", "invalid value 'missing'"),
        ("slow", "GET failed"),
        ("error", "GET failed"),
        ("nonnumeric", "malformed"),
    ],
)
def test_bad_bodies_read_unknown(vllm: EngineEmulator, mode: str, why: str) -> None:
    vllm.set_metrics_mode(mode)
    s = parse_oneshot_output(engine="vLLM", stdout=run(vllm.metrics_port))
    assert not s.complete and not s.idle
    assert why in s.reason, s.reason


def test_nothing_listening_reads_unknown() -> None:
    from testbed.procs import free_port

    s = parse_oneshot_output(engine="vLLM", stdout=run(free_port()))
    assert not s.complete and "GET failed" in s.reason


@pytest.mark.parametrize("bad", ["80a", "", "0", "65536", "-1", "8080 ", "1e3", "999999"])
def test_port_annotation_must_be_a_port_number(bad: str) -> None:
    with pytest.raises(ValueError):
        valid_port(bad)


def test_scheme_and_path_allow_lists() -> None:
    assert valid_port("9100") == 9100 and valid_scheme(None) == "http"
    assert valid_path(None) == "/metrics"
    for bad in ["ftp", "http;rm"]:
        with pytest.raises(ValueError):
            valid_scheme(bad)
    for bad in ["metrics", "/m?x=1", "/m etrics", "/$(id)"]:
        with pytest.raises(ValueError):
            valid_path(bad)
