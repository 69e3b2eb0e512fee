"""The drain's exact reading and the engines' lag (issue 18): vLLM's request-level count
at ``GET /load`` where the rendered command line turns it on, SGLang's per-step work
counter where the release has it, and the SGLang settle where it has not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from retirement.drain import SGLANG_GAUGE_SETTLE_S, DrainProgress, observe_round
from retirement.phases import Verdict
from retirement.readings import (
    SERIES,
    SGLANG_STEP_COUNTER,
    Sample,
    parse_oneshot_output,
    series_for,
    steps_counted,
)
from retirement.shape import exact_load, rendered_wiring, vllm_api_servers
from tests.helpers.fake_kube import oneshot_stdout

T0 = datetime(2026, 12, 4, tzinfo=UTC)

# ------------------------------------------------------------------ parsing


def test_an_exact_count_of_zero_with_idle_gauges_reads_idle() -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=oneshot_stdout(exact=0), exact=True)
    assert s.complete and s.idle and s.exact == 0


def test_requests_held_by_the_front_end_are_not_idle_whatever_the_gauges_say() -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=oneshot_stdout(exact=2), exact=True)
    assert s.complete and not s.idle and s.in_flight == 0 and s.exact == 2


@pytest.mark.parametrize(
    "line", ["#load\t-1", "#load\t1.5", "#load\ttrue", "#load\t", "#load\t01", "#load\t1e3"]
)
def test_an_exact_count_that_is_not_a_whole_number_reads_unknown(line: str) -> None:
    body = oneshot_stdout().replace("#end", f"{line}\n#end")
    s = parse_oneshot_output(engine="vLLM", stdout=body, exact=True)
    assert not s.complete and not s.idle, s


def test_an_exact_count_missing_where_expected_reads_unknown() -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=oneshot_stdout(), exact=True)
    assert not s.complete and "exact request count missing" in s.reason


def test_an_exact_count_twice_or_not_asked_for_reads_unknown() -> None:
    twice = oneshot_stdout(exact=0).replace("#end", "#load\t0\n#end")
    assert not parse_oneshot_output(engine="vLLM", stdout=twice, exact=True).complete
    unasked = oneshot_stdout(exact=0)
    assert not parse_oneshot_output(engine="vLLM", stdout=unasked, exact=False).complete


# ------------------------------------------------------------------ SGLang's series


@pytest.mark.parametrize(
    ("version", "counted"),
    [("0.5.21", True), ("0.5.18", True), ("0.5.7", True), ("0.5.6", False), ("", False)],
)
def test_sglang_reads_its_per_step_counter_from_the_release_that_moves_it(
    version: str, counted: bool
) -> None:
    series = series_for("SGLang", version)
    assert series is not None
    assert (SGLANG_STEP_COUNTER in series.counters) is counted
    assert steps_counted("SGLang", version) is counted
    assert series.gauges == SERIES["SGLang"].gauges
    assert steps_counted("vLLM", "") and series_for("vLLM", "0.29.0") == SERIES["vLLM"]


def test_a_missing_per_step_counter_reads_unknown_on_a_release_that_has_it() -> None:
    base = oneshot_stdout("SGLang", version="0.5.6")  # a body without the counter
    s = parse_oneshot_output(engine="SGLang", stdout=base, version="0.5.21")
    assert not s.complete and SGLANG_STEP_COUNTER in s.reason


# ------------------------------------------------------------------ the command line

VLLM = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
ON = "--enable-server-load-tracking"


def loads(args: list[str], *, version: str = "0.29.0", env: dict[str, str] | None = None) -> bool:
    wiring = rendered_wiring(engine="vLLM", command=VLLM, args=args, env=list((env or {}).items()))
    return exact_load(engine="vLLM", version=version, wiring=wiring)


@pytest.mark.parametrize(
    ("args", "env", "version", "exact"),
    [
        (["--enable-server-load-tracking"], None, "0.29.0", True),
        (["--enable-server-load-tracking"], None, "0.8.0", True),
        ([], None, "0.29.0", False),
        (
            ["--enable-server-load-tracking", "--no-enable-server-load-tracking"],
            None,
            "0.29.0",
            False,
        ),
        (["--enable-server-load-tracking"], None, "0.7.3", False),
        (["--enable-server-load-tracking"], None, "", False),
        # The count is per API server process: behind one port, one GET reads one of them.
        (["--enable-server-load-tracking", "--api-server-count", "2"], None, "0.29.0", False),
        (["--enable-server-load-tracking", "-asc", "1"], None, "0.29.0", True),
        (["--enable-server-load-tracking", "--data-parallel-size", "2"], None, "0.29.0", False),
        (
            [
                "--enable-server-load-tracking",
                "--data-parallel-size",
                "2",
                "--data-parallel-rank",
                "1",
            ],
            None,
            "0.29.0",
            True,
        ),
        (["--enable-server-load-tracking"], {"VLLM_DP_SIZE": "2"}, "0.29.0", False),
        (["--enable-server-load-tracking"], {"VLLM_USE_RUST_FRONTEND": "1"}, "0.29.0", False),
        (["--enable-server-load-tracking"], {"VLLM_USE_RUST_FRONTEND": "0"}, "0.29.0", True),
    ],
)
def test_the_exact_count_is_read_only_where_the_rendered_command_line_makes_it_exact(
    args: list[str], env: dict[str, str] | None, version: str, exact: bool
) -> None:
    assert loads(args, version=version, env=env) is exact


def test_the_api_server_count_defaults_as_vllm_serve_defaults_it() -> None:
    def count(args: list[str]) -> int | None:
        return vllm_api_servers(rendered_wiring(engine="vLLM", command=VLLM, args=args))

    assert count([]) == 1
    assert count(["--data-parallel-size", "4"]) == 4
    assert count(["--data-parallel-size", "4", "--data-parallel-external-lb"]) == 1
    assert count(["--data-parallel-size", "4", "--data-parallel-hybrid-lb", "-dpl", "2"]) == 2
    assert count(["--headless"]) == 0
    assert count(["--api-server-count", "3"]) == 3


def test_an_sglang_or_unmanaged_command_line_has_no_exact_count() -> None:
    sglang = rendered_wiring(engine="SGLang", command=[], args=["--enable-server-load-tracking"])
    assert not exact_load(engine="SGLang", version="0.5.21", wiring=sglang)
    shell = rendered_wiring(
        engine="vLLM", command=["sh", "-c", "vllm serve"], args=["--enable-server-load-tracking"]
    )
    assert not exact_load(engine="vLLM", version="0.29.0", wiring=shell)
    assert not exact_load(engine="vLLM", version="0.29.0", wiring=None)


# ------------------------------------------------------------------ the rule


def idle(counters: tuple[float, ...] = (5.0, 7.0), exact: int | None = None) -> Sample:
    return Sample(complete=True, in_flight=0, counters=counters, exact=exact)


def rounds(
    reads: list[Sample], *, settle_s: float = 0.0, spacing_s: float = 1.0
) -> list[tuple[Verdict, str]]:
    progress, out = DrainProgress(), []
    for i, s in enumerate(reads):
        progress, verdict, reason = observe_round(
            progress,
            measured=("m",),
            samples={"m": s},
            at=T0 + timedelta(seconds=i * spacing_s),
            settle_s=settle_s,
        )
        out.append((verdict, reason))
    return out


def test_the_exact_count_must_read_zero_on_both_reads() -> None:
    verdicts = rounds([idle(exact=0), idle(exact=1), idle(exact=0), idle(exact=0)])
    assert [v for v, _ in verdicts] == [Verdict.UNKNOWN] * 3 + [Verdict.VERIFIED]
    assert "1 held by its HTTP front end" in verdicts[1][1]


def test_the_sglang_settle_waits_from_the_last_work_seen() -> None:
    busy = Sample(complete=True, in_flight=1, counters=(5.0, 7.0))
    verdicts = rounds([busy, *[idle()] * 7], settle_s=SGLANG_GAUGE_SETTLE_S)
    first = next(i for i, (v, _) in enumerate(verdicts) if v is Verdict.VERIFIED)
    # The pair's first read must be SETTLE after the busy read at t=0: reads at 4 and 5 s.
    assert first == 5 and "may lag" in verdicts[3][1]
    assert rounds([busy, idle(), idle()])[2][0] is Verdict.VERIFIED  # no settle: at once
