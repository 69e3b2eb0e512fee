"""SGLang's lagging in-flight gauges, its per-step token counter and its load snapshots, as
the emulator reproduces them (testbed.emulator.sglang_scheduler, metrics_sglang and
engine's ``GET /v1/loads``; the SGLang 0.5.21 sources are cited there).

Two kinds of tests: the scheduler's step clock driven with made-up times (exact step
counts, no timing), and the emulator over HTTP on 127.0.0.1 (what a drain read sees). The
headline: two reads of the gauge+counter rule one second apart both read idle while a
request is in flight, and ``sglang:realtime_tokens_total`` moves between them."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from activities.oneshot import command
from retirement.readings import SERIES, parse_oneshot_output, series_for
from testbed.emulator import EmulatorHub, EngineEmulator, EngineKind, PodEngineSpec
from testbed.emulator.engine_args import SglangArgs, sglang_args
from testbed.emulator.sglang_scheduler import (
    DEFAULT_STEP_SECONDS,
    WARMUP_NEW_TOKENS,
    WARMUP_PROMPT_TOKENS,
    SglangRank,
)
from tests.helpers import eventually
from tests.helpers.emulator_calls import Background, parse, total
from tests.helpers.emulators import emulators

LOOPBACK = "127.0.0.1"
STEP = 0.01  # the made-up step of the clock tests (any value: they count steps)
WAIT = 10.0  # a bound on how long a state change may take to show (not a figure)

#: The current drain rule for SGLang (retirement/readings.py): in flight is the sum of
#: these gauges, and these counters must not move between two idle reads.
GAUGES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
)
COUNTERS = ("sglang:num_requests_total", "sglang:generation_tokens_total")
STEP_COUNTER = "sglang:realtime_tokens_total"


def rank(
    *, interval: int = 40, publish: int = 15, overlap: bool = True, warm: bool = False
) -> SglangRank:
    """A rank at time 0 (after its warmup when ``warm``)."""
    out = SglangRank(
        dp_rank=0,
        step_seconds=STEP,
        decode_log_interval=interval,
        publish_interval=publish,
        overlap=overlap,
        now=0.0,
    )
    if warm:
        out.warmup(0.0)
    return out


def at_step(n: float) -> float:
    """The time when ``n`` steps have ended since 0 (half a step past, clear of rounding)."""
    return (n + 0.5) * STEP


def running(r: SglangRank, now: float) -> int | None:
    """The published ``num_running_reqs`` at ``now`` (None: never published)."""
    r.advance(now)
    return None if r.published is None else r.published.running


# --------------------------------------------------------------------------------------
# the step clock, exactly


def test_a_request_admitted_into_an_idle_rank_is_reported_by_its_prefill_as_0() -> None:
    r = rank()
    r.admit("a", 5, 0.0)  # idle: the prefill starts at once
    assert running(r, at_step(0)) is None  # nothing published before the prefill ends
    assert running(r, at_step(1)) == 0  # report_prefill_stats: the batch before the merge
    assert r.realtime == {"prefill_compute": 5}
    # Decode steps 1..39: invisible; the 40th publishes it.
    assert running(r, at_step(1 + 39)) == 0
    assert r.forward_ct_decode == 39 and r.realtime["decode"] == 39
    assert running(r, at_step(1 + 40)) == 1
    assert r.forward_ct_decode == 40


def test_the_refresh_follows_the_decode_counter_across_requests() -> None:
    """After the warmup (7 decode steps) the next publish is at decode step 40 overall:
    33 steps after a new request's prefill, not 40."""
    r = rank(warm=True)
    assert r.published is not None and r.published.running == 0
    assert r.realtime == {"prefill_compute": WARMUP_PROMPT_TOKENS, "decode": WARMUP_NEW_TOKENS - 1}
    r.admit("a", 3, 0.0)
    assert running(r, at_step(1 + 32)) == 0
    assert running(r, at_step(1 + 33)) == 1


def test_a_request_admitted_while_another_decodes_is_hidden_up_to_40_steps() -> None:
    r = rank()
    r.admit("a", 2, 0.0)
    assert running(r, at_step(41)) == 1  # a is visible (decode step 40)
    # b arrives during decode step 41: it waits for it, then its own prefill runs.
    r.admit("b", 2, at_step(41))
    assert running(r, at_step(42)) == 1  # step 41 (decode) ended
    assert running(r, at_step(43)) == 1  # b's prefill: running batch before the merge: a
    steps_at_prefill = r.forward_ct_decode
    assert steps_at_prefill == 41
    # Decode steps 42..79 show 1 while 2 run; the 80th publishes 2.
    assert running(r, at_step(43 + 38)) == 1
    assert running(r, at_step(43 + 39)) == 2
    assert r.forward_ct_decode == 80
    assert r.forward_ct_decode - steps_at_prefill == 39  # <= 40 decode steps hidden


def test_idle_is_published_at_once_and_republished_every_30_s() -> None:
    r = rank()
    r.admit("a", 2, 0.0)
    assert running(r, at_step(41)) == 1
    r.finish("a", at_step(41))  # the last request ends (during decode step 42)
    # Its step ends with it and the rank is idle: _maybe_log_idle_metrics publishes at once
    # (the gauge disagrees with the empty batch).
    assert r.published is not None and r.published.running == 0
    assert r.last_log == at_step(41)
    logged = r.last_log
    r.advance(logged + 29.0)
    assert r.last_log == logged  # agreeing gauges: no republish before 30 s
    r.advance(logged + 31.0)
    assert r.last_log == pytest.approx(logged + 30.0)


def test_a_rank_without_warmup_shows_no_gauge_until_it_works_or_30_s_pass() -> None:
    r = rank()
    assert running(r, 29.0) is None
    assert running(r, 30.5) == 0  # the idle republish creates the series
    assert r.realtime == {}  # realtime_tokens_total: no series until a mode moves


def test_a_request_ended_before_any_prefill_still_counts_its_prefill() -> None:
    """A 1-token request admitted while a step runs ends (here) before the next prefill."""
    r = rank()
    r.admit("a", 2, 0.0)
    r.admit("one", 4, at_step(5))
    r.finish("one", at_step(5))
    assert r.realtime["prefill_compute"] == 6
    assert r.true_waiting == 0


def test_the_decode_counter_moves_on_every_step_with_one_token_per_request() -> None:
    r = rank()
    r.admit("a", 1, 0.0)  # idle: a's prefill starts at once
    r.admit("b", 1, 0.0)  # b waits for it, then has its own prefill
    r.advance(at_step(1))
    assert r.realtime == {"prefill_compute": 1}
    r.advance(at_step(2))
    assert r.realtime == {"prefill_compute": 2}
    for n in range(1, 6):
        r.advance(at_step(2 + n))
        assert r.realtime["decode"] == 2 * n


@pytest.mark.parametrize(("overlap", "queued"), [(True, 0), (False, 1)])
def test_a_request_waiting_for_its_prefill_is_in_the_queue_gauge_only_in_the_normal_loop(
    overlap: bool, queued: int
) -> None:
    """The overlapping loop picks the next batch (the waiting request's prefill) before it
    reports the step that just ended; the normal loop reports first."""
    r = rank(interval=1, overlap=overlap)
    r.admit("a", 1, 0.0)
    r.advance(at_step(2))  # prefill, one decode step (reported: interval 1)
    r.admit("b", 1, at_step(2))  # waits for decode step 2
    r.advance(at_step(3))
    assert r.published is not None
    assert (r.published.running, r.published.queue) == (1, queued)


@pytest.mark.parametrize(
    ("overlap", "at_prefill"),
    [(True, 1), (False, 0)],
    ids=["overlap-loop", "normal-loop"],
)
def test_load_snapshots_at_prefill_every_15_decode_steps_and_idle(
    overlap: bool, at_prefill: int
) -> None:
    r = rank(overlap=overlap)
    r.admit("a", 3, 0.0)
    r.advance(at_step(1))
    snap = r.snapshot()
    # The overlapping loop processes the prefill's result after the next batch merged it.
    assert (snap["num_running_reqs"], snap["num_waiting_reqs"]) == (at_prefill, 0)
    # Published at the start of the result's processing: the step's own counters
    # (``_record_step_counters``, at its end) are in the next snapshot.
    assert snap["total_prefill_uncached_tokens"] == 0
    r.advance(at_step(1 + 14))
    assert r.snapshot()["num_running_reqs"] == at_prefill
    r.advance(at_step(1 + 15))  # the 15th decode result publishes
    assert r.snapshot()["num_running_reqs"] == 1
    assert r.snapshot()["total_prefill_uncached_tokens"] == 3
    assert r.snapshot()["decode_moments"][0] == 14.0
    r.finish("a", at_step(16))
    r.advance(at_step(17))  # idle: forced
    assert r.snapshot()["num_running_reqs"] == 0


# --------------------------------------------------------------------------------------
# the command line


def test_sglang_reads_its_intervals_warmup_and_loop_from_the_command_line() -> None:
    assert sglang_args([]) == SglangArgs(40, 15, False, True)
    line = ["python3", "-m", "sglang.launch_server", "--model-path", "m"]
    assert sglang_args(
        [
            *line,
            "--decode-log-interval",
            "10",
            "--load-snapshot-publish-interval=0",
            "--skip-server-warmup",
            "--disable-overlap-schedule",
            "--decode-log-interval=12",
        ]
    ) == SglangArgs(12, 1, True, False)
    # Plain argparse: no ``_`` spelling (it is an unknown option, not read here).
    assert sglang_args(["--decode_log_interval", "5"]).decode_log_interval == 40
    for bad in (
        ["--decode-log-interval"],
        ["--decode-log-interval", "x"],
        ["--decode-log-interval", "0"],
        ["--skip-server-warmup=1"],
    ):
        with pytest.raises(ValueError):
            sglang_args(bad)


# --------------------------------------------------------------------------------------
# over HTTP


@pytest.fixture
def start() -> Iterator[Callable[..., EngineEmulator]]:
    """Started emulators on 127.0.0.1 (free ports); all stopped afterwards."""
    with emulators(prefix="sg", request_seconds=0.1) as make:
        yield make


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """An httpx client that never uses proxies."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        yield c


def metrics(
    client: httpx.Client, emu: EngineEmulator
) -> dict[str, list[tuple[dict[str, str], float]]]:
    """The emulator's /metrics on its loopback port, parsed."""
    r = client.get(f"http://{LOOPBACK}:{emu.metrics_port}/metrics")
    assert r.status_code == 200
    return parse(r.text)


def rule(samples: dict[str, list[tuple[dict[str, str], float]]]) -> tuple[float, tuple[float, ...]]:
    """What the current drain rule reads: the gauges' sum and the counters."""
    return sum(total(samples, g) for g in GAUGES), tuple(total(samples, c) for c in COUNTERS)


def generate(emu: EngineEmulator, seconds: float, tokens: int = 7) -> Background:
    """An SGLang /generate in the background."""
    body = {
        "text": "a b c",
        "sampling_params": {"max_new_tokens": tokens},
        "emulate_seconds": seconds,
    }

    def call() -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=seconds + 10) as c:
            return c.post(f"http://{LOOPBACK}:{emu.serve_port}/generate", json=body)

    return Background(call)


def test_two_idle_reads_one_second_apart_while_a_request_is_in_flight(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """The hole: a request admitted into an idle engine is reported by its prefill as 0
    running and is not published again for up to 40 decode steps; its counters move only
    when it finishes. With 0.1 s steps (a large batch or model; 25 ms is the default) the
    window is 33 decode steps after the warmup's 7, 3.3 s: two reads 1 s apart inside it
    both read idle by the gauge+counter rule, while the per-step counter moves."""
    emu = start(EngineKind.SGLANG, step_seconds=0.1)
    before = rule(metrics(client, emu))
    assert before == (0.0, (1.0, float(WARMUP_NEW_TOKENS)))  # the warmup request
    bg = generate(emu, seconds=10.0)
    eventually(lambda: emu.status()["schedulers"][0]["steps"] >= 2, timeout=WAIT, interval=0.02)
    began = time.monotonic()
    first = metrics(client, emu)
    time.sleep(1.0)
    second = metrics(client, emu)
    elapsed = time.monotonic() - began
    assert emu.in_flight == 1
    assert rule(first) == rule(second) == before  # both idle, counters unchanged
    assert total(second, STEP_COUNTER) > total(first, STEP_COUNTER)  # decoding meanwhile
    decode = [v for lb, v in second[STEP_COUNTER] if lb["mode"] == "decode"]
    assert decode and decode[0] >= WARMUP_NEW_TOKENS - 1 + 5
    assert elapsed < 3.0, "the reads left the window: the machine is too slow for this test"
    # The 40th decode step publishes it; it ends; counters move only then.
    eventually(
        lambda: total(metrics(client, emu), "sglang:num_running_reqs") == 1.0,
        timeout=WAIT,
        interval=0.05,
    )
    assert rule(metrics(client, emu))[1] == before[1]
    emu.stop()
    bg.join()


def test_a_request_admitted_while_another_decodes_is_invisible_to_the_gauges(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """B arrives while A decodes: B's prefill reports only A, and the gauges show 1 while
    2 run until the decode counter next reaches a multiple of 40; no counter moves."""
    emu = start(EngineKind.SGLANG, step_seconds=0.02)
    a = generate(emu, seconds=10.0)
    eventually(
        lambda: total(metrics(client, emu), "sglang:num_running_reqs") == 1.0,
        timeout=WAIT,
        interval=0.02,
    )
    counters = rule(metrics(client, emu))[1]
    b = generate(emu, seconds=10.0)
    eventually(lambda: emu.status()["running_requests"] == 2, timeout=WAIT, interval=0.01)
    eventually(
        lambda: (
            emu.status()["schedulers"][0]["forward_ct_decode"] % 40 != 0
            and emu.status()["schedulers"][0]["published"]["running"] == 1
        ),
        timeout=WAIT,
        interval=0.01,
    )
    seen = metrics(client, emu)
    assert total(seen, "sglang:num_running_reqs") == 1.0 and emu.in_flight == 2
    assert rule(seen)[1] == counters
    step_before = emu.status()["schedulers"][0]["forward_ct_decode"]
    eventually(
        lambda: total(metrics(client, emu), "sglang:num_running_reqs") == 2.0,
        timeout=WAIT,
        interval=0.02,
    )
    sched = emu.status()["schedulers"][0]
    assert sched["published"]["running"] == 2
    assert step_before < sched["forward_ct_decode"] <= step_before + 40
    assert rule(metrics(client, emu))[1] == counters
    emu.stop()
    a.join()
    b.join()


def test_counters_move_at_finish_and_the_gauges_at_idle(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = start(EngineKind.SGLANG)
    bg = generate(emu, seconds=2.0)
    eventually(
        lambda: total(metrics(client, emu), "sglang:num_running_reqs") == 1.0,
        timeout=WAIT,
        interval=0.02,
    )
    bg.join(timeout=WAIT)
    assert bg.response is not None and bg.response.status_code == 200
    after = metrics(client, emu)
    # Idle is published at once (within the step the request ended in).
    assert rule(after) == (0.0, (2.0, float(WARMUP_NEW_TOKENS + 7)))
    by_stream = {lb["is_streaming"]: v for lb, v in after["sglang:num_requests_total"]}
    assert by_stream == {"false": 2.0}


def test_labels_are_sglangs_per_collector(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """Scheduler series per DP rank (tp/pp/moe_ep rank labels, dp_rank with DP > 1);
    the tokenizer's request counters once per server, by ``is_streaming``."""
    emu = start(EngineKind.SGLANG, dp_ranks=2, served_model_names=("qwen",))
    samples = metrics(client, emu)
    for name in GAUGES:
        assert sorted(lb["dp_rank"] for lb, _ in samples[name]) == ["0", "1"], name
        for labels, _ in samples[name]:
            assert {k: v for k, v in labels.items() if k != "dp_rank"} == {
                "model_name": "qwen",
                "engine_type": "unified",
                "tp_rank": "0",
                "pp_rank": "0",
                "moe_ep_rank": "0",
            }
    modes = sorted((lb["dp_rank"], lb["mode"]) for lb, _ in samples[STEP_COUNTER])
    assert modes == [
        ("0", "decode"),
        ("0", "prefill_compute"),
        ("1", "decode"),
        ("1", "prefill_compute"),
    ]
    for name in (*COUNTERS, "sglang:prompt_tokens_total"):
        assert [lb for lb, _ in samples[name]] == [
            {"model_name": "qwen", "engine_type": "unified", "is_streaming": "false"}
        ], name
    assert total(samples, "sglang:num_requests_total") == 2.0  # one warmup per DP rank
    assert total(samples, "sglang:prompt_tokens_total") == 2.0 * WARMUP_PROMPT_TOKENS
    r = client.post(
        f"http://{LOOPBACK}:{emu.serve_port}/generate",
        json={"text": "x", "sampling_params": {"max_new_tokens": 3}, "stream": True},
    )
    assert r.status_code == 200
    streamed = {
        lb["is_streaming"]: v for lb, v in metrics(client, emu)["sglang:num_requests_total"]
    }
    assert streamed == {"false": 2.0, "true": 1.0}


def test_without_warmup_the_series_appear_only_once_written(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """``--skip-server-warmup``: before any request the multiprocess collector has no
    gauge, no request counter and no per-step counter to show (only pre-seeded series)."""
    emu = start(EngineKind.SGLANG, args=("--skip-server-warmup",))
    samples = metrics(client, emu)
    for name in (*GAUGES, *COUNTERS, STEP_COUNTER):
        assert name not in samples, name
    assert total(samples, "sglang:prefill_effective_tokens_total") == 0.0
    r = client.post(
        f"http://{LOOPBACK}:{emu.serve_port}/generate",
        json={"text": "x y", "sampling_params": {"max_new_tokens": 4}},
    )
    assert r.status_code == 200
    samples = metrics(client, emu)
    assert rule(samples) == (0.0, (1.0, 4.0))
    assert all(name in samples for name in (*GAUGES, STEP_COUNTER))


def test_a_longer_decode_log_interval_on_the_command_line_lengthens_the_lag(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = start(EngineKind.SGLANG, step_seconds=0.01, args=("--decode-log-interval", "400"))
    bg = generate(emu, seconds=10.0)
    eventually(lambda: emu.status()["schedulers"][0]["forward_ct_decode"] >= 100, timeout=WAIT)
    assert total(metrics(client, emu), "sglang:num_running_reqs") == 0.0
    assert emu.in_flight == 1
    emu.stop()
    bg.join()


def test_traps_still_apply_to_the_published_gauges(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = start(EngineKind.SGLANG, dp_ranks=2, args=("--skip-server-warmup",))
    emu.set_stale_gauges(3, 1)  # frozen values, reported on rank 0, even before any report
    samples = metrics(client, emu)
    assert total(samples, "sglang:num_running_reqs") == 3.0
    assert total(samples, "sglang:num_queue_reqs") == 1.0
    emu.clear_traps()
    emu.set_metrics_mode("missing:" + STEP_COUNTER)
    emu.set_frontend_hidden(0.5)
    bg = generate(emu, seconds=0.1)
    eventually(lambda: emu.in_flight == 1, timeout=WAIT, interval=0.01)
    samples = metrics(client, emu)
    assert STEP_COUNTER not in samples
    assert emu.status()["running_requests"] == 0  # still in the front end
    bg.join(timeout=WAIT)


# --------------------------------------------------------------------------------------
# GET /v1/loads


def loads(client: httpx.Client, emu: EngineEmulator, query: str = "") -> httpx.Response:
    """``GET /v1/loads`` on the loopback port."""
    return client.get(f"http://{LOOPBACK}:{emu.metrics_port}/v1/loads{query}")


def test_v1_loads_answers_one_snapshot_per_dp_rank(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = start(EngineKind.SGLANG, dp_ranks=2)
    r = loads(client, emu)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    data = r.json()
    assert set(data) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert data["version"] == "0.5.21"
    assert [load["dp_rank"] for load in data["loads"]] == [0, 1]
    first = data["loads"][0]
    assert first["num_running_reqs"] == 0 and first["num_waiting_reqs"] == 0
    assert set(first) >= {
        "timestamp",
        "num_used_tokens",
        "num_total_tokens",
        "max_total_num_tokens",
        "token_usage",
        "gen_throughput",
        "total_prefill_uncached_tokens",
        "decode_moments",
        "memory",
        "disaggregation",
        "queues",
    }
    assert first["total_prefill_uncached_tokens"] == WARMUP_PROMPT_TOKENS
    assert first["disaggregation"]["mode"] == "null"
    assert "speculative" not in first and "lora" not in first
    one = loads(client, emu, "?dp_rank=1").json()["loads"]
    assert [load["dp_rank"] for load in one] == [1]
    assert loads(client, emu, "?dp_rank=7").json()["loads"] == []
    core = loads(client, emu, "?include=core").json()["loads"][0]
    assert "memory" not in core and "queues" not in core and "num_running_reqs" in core
    assert set(loads(client, emu, "?include=queues").json()["loads"][0]) - set(core) == {"queues"}
    assert loads(client, emu, "?include=bogus").status_code == 500
    bad = loads(client, emu, "?dp_rank=x")
    assert bad.status_code == 400 and "int_parsing" in bad.json()["message"]
    text = loads(client, emu, "?format=prometheus").text
    assert 'sglang_num_running_reqs{dp_rank="1"} 0' in text
    assert 'sglang_queues_waiting{dp_rank="0"} 0' in text
    # 0.5.21 removed /get_load (a deprecated wrapper of /v1/loads in 0.5.18); vLLM's /load
    # is not SGLang's.
    base = f"http://{LOOPBACK}:{emu.serve_port}"
    assert client.get(base + "/get_load").status_code == 404
    assert client.get(base + "/load").status_code == 404
    assert client.post(base + "/v1/loads").status_code == 405


def test_v1_loads_refreshes_at_prefill_every_15_decode_steps_and_idle(
    start: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """With the normal loop the prefill's snapshot shows neither running nor waiting; the
    request appears at the 15th decode result; idle is published at once."""
    emu = start(EngineKind.SGLANG, step_seconds=0.05, args=("--disable-overlap-schedule",))
    bg = generate(emu, seconds=3.0)
    eventually(lambda: emu.status()["schedulers"][0]["steps"] >= 2, timeout=WAIT, interval=0.01)
    snap = loads(client, emu).json()["loads"][0]
    assert emu.in_flight == 1
    if emu.status()["schedulers"][0]["steps"] < 15:
        assert (snap["num_running_reqs"], snap["num_waiting_reqs"]) == (0, 0)
    eventually(
        lambda: loads(client, emu).json()["loads"][0]["num_running_reqs"] == 1,
        timeout=WAIT,
        interval=0.05,
    )
    bg.join(timeout=WAIT)
    eventually(
        lambda: loads(client, emu).json()["loads"][0]["num_running_reqs"] == 0,
        timeout=WAIT,
        interval=0.05,
    )


def test_the_hub_takes_the_command_line_and_the_step(client: httpx.Client) -> None:
    hub = EmulatorHub(LOOPBACK, 0)
    thread = hub.start_background()
    try:
        base = f"http://{LOOPBACK}:{hub.control_port}"
        pod: dict[str, Any] = {
            "engine": "SGLang",
            "serve_host": LOOPBACK,
            "serve_port": 0,
            "metrics_port": 0,
        }
        r = client.post(
            f"{base}/pods",
            json={**pod, "name": "a", "args": ["--decode-log-interval", "5"], "step_seconds": 0.2},
        )
        assert r.status_code == 201, r.text
        assert r.json()["args"] == ["--decode-log-interval", "5"]
        assert r.json()["step_seconds"] == 0.2
        assert hub.get("a").spec.args == ("--decode-log-interval", "5")
        default = client.post(f"{base}/pods", json={**pod, "name": "b"}).json()
        assert default["step_seconds"] == DEFAULT_STEP_SECONDS and default["args"] == []
        refused = client.post(
            f"{base}/pods", json={**pod, "name": "c", "args": ["--decode-log-interval", "x"]}
        )
        assert refused.status_code == 500 and "invalid int value" in refused.json()["error"]
        for bad in ({"args": "--x"}, {"args": [1]}, {"step_seconds": 0}):
            assert client.post(f"{base}/pods", json={**pod, "name": "d", **bad}).status_code == 400
    finally:
        hub.shutdown()
        thread.join(5)


def test_a_pod_spec_is_validated() -> None:
    with pytest.raises(ValueError):
        EngineEmulator(PodEngineSpec("p", EngineKind.SGLANG, LOOPBACK, 0, 0, step_seconds=0.0))
    with pytest.raises(ValueError):
        EngineEmulator(
            PodEngineSpec("p", EngineKind.SGLANG, LOOPBACK, 0, 0, args=("--decode-log-interval",))
        )


# --------------------------------------------------------------------------------------
# the product's own reads against the lagging emulator


def oneshot(emu: EngineEmulator, names: tuple[str, ...]) -> str:
    """The drain's in-container one-shot (activities/oneshot.py), run for real."""
    argv = command(port=emu.metrics_port, scheme="http", path="/metrics", names=names)
    argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def test_the_drains_own_reads_old_rule_idle_twice_new_rule_sees_the_steps(
    start: Callable[..., EngineEmulator],
) -> None:
    """The same hole through the product's one-shot and parser: with the series of the rule
    before issue 18 both reads are idle with the same counters; with SGLang 0.5.21's series
    (the per-step counter among the work counters) the counters moved between them."""
    emu = start(EngineKind.SGLANG, step_seconds=0.1)
    bg = generate(emu, seconds=10.0)
    eventually(lambda: emu.status()["schedulers"][0]["steps"] >= 2, timeout=WAIT, interval=0.02)
    old_names, new_names = SERIES["SGLang"].all, series_for("SGLang", "0.5.21")
    assert new_names is not None and STEP_COUNTER in new_names.counters
    began = time.monotonic()
    old1 = parse_oneshot_output(engine="SGLang", stdout=oneshot(emu, old_names))
    new1 = parse_oneshot_output(
        engine="SGLang", version="0.5.21", stdout=oneshot(emu, new_names.all)
    )
    time.sleep(1.0)
    old2 = parse_oneshot_output(engine="SGLang", stdout=oneshot(emu, old_names))
    new2 = parse_oneshot_output(
        engine="SGLang", version="0.5.21", stdout=oneshot(emu, new_names.all)
    )
    assert time.monotonic() - began < 3.0, "the reads left the window: too slow a machine"
    assert emu.in_flight == 1
    assert old1.idle and old2.idle and old1.counters == old2.counters  # the old rule: idle
    assert new1.idle and new2.idle  # the gauges alone still say idle ...
    assert new1.counters != new2.counters  # ... but the work counters moved: not idle
    emu.stop()
    bg.join()
