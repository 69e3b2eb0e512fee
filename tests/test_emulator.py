"""Tests of the engine emulator (testbed.emulator). Everything stays on 127.0.0.1."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from testbed.emulator import (
    HUGE_METRICS_BYTES,
    EmulatorHub,
    EngineEmulator,
    EngineKind,
    PodEngineSpec,
)
from testbed.procs import free_port
from tests.helpers import eventually
from tests.helpers.emulator_calls import Background, Samples, parse, total

LOOPBACK = "127.0.0.1"
FAST = 0.3
QUICK = 3.0  # how long a wait for the emulator's state may take (it moves in milliseconds)

VLLM_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
)
SGLANG_SERIES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_prefill_bootstrap_queue_reqs",
    "sglang:num_prefill_inflight_queue_reqs",
    "sglang:num_decode_prealloc_queue_reqs",
    "sglang:num_decode_transfer_queue_reqs",
    "sglang:num_requests_total",
    "sglang:generation_tokens_total",
)


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    """An httpx client that never uses proxies."""
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        yield c


@pytest.fixture
def make() -> Iterator[Callable[..., EngineEmulator]]:
    """Factory for started emulators on 127.0.0.1 (free ports); all stopped afterwards."""
    made: list[EngineEmulator] = []

    def factory(
        engine: EngineKind = EngineKind.VLLM,
        dp_ranks: int = 1,
        request_seconds: float = FAST,
        **extra: Any,
    ) -> EngineEmulator:
        spec = PodEngineSpec(
            name=f"pod-{len(made)}",
            engine=engine,
            serve_host=LOOPBACK,
            serve_port=0,
            metrics_port=0,
            dp_ranks=dp_ranks,
            request_seconds=request_seconds,
            **extra,
        )
        emu = EngineEmulator(spec)
        emu.start()
        made.append(emu)
        return emu

    yield factory
    for emu in made:
        emu.stop()


def url(emu: EngineEmulator, path: str, metrics: bool = False) -> str:
    """URL on the serving address (or the loopback metrics port)."""
    return f"http://{LOOPBACK}:{emu.metrics_port if metrics else emu.serve_port}{path}"


def scrape(client: httpx.Client, emu: EngineEmulator, metrics: bool = True) -> Samples:
    """Parse the emulator's /metrics."""
    resp = client.get(url(emu, "/metrics", metrics))
    assert resp.status_code == 200
    return parse(resp.text)


def vllm_request(emu: EngineEmulator, **extra: Any) -> Background:
    """A vLLM completion in the background (its own client)."""
    body = {"model": "emulated", "prompt": "one two three four", "max_tokens": 5, **extra}

    def call() -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=5.0) as c:
            return c.post(url(emu, "/v1/completions"), json=body)

    return Background(call)


def sglang_request(emu: EngineEmulator, **extra: Any) -> Background:
    """An SGLang /generate in the background."""
    body = {"text": "one two three", "sampling_params": {"max_new_tokens": 7}, **extra}

    def call() -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=5.0) as c:
            return c.post(url(emu, "/generate"), json=body)

    return Background(call)


# --------------------------------------------------------------------------------------
# exposition


@pytest.mark.parametrize("metrics_port", [True, False])
def test_vllm_exposition_has_every_series_per_dp_engine(
    make: Callable[..., EngineEmulator], client: httpx.Client, metrics_port: bool
) -> None:
    emu = make(EngineKind.VLLM, dp_ranks=3)
    text = client.get(url(emu, "/metrics", metrics_port)).text
    assert "# TYPE vllm:num_requests_running gauge" in text
    assert "# TYPE vllm:prompt_tokens_total counter" in text
    samples = parse(text)
    for name in VLLM_SERIES:
        labels = sorted(lb["engine"] for lb, _ in samples[name])
        assert labels == ["0", "1", "2"], name
        assert all(lb["model_name"] == "emulated" for lb, _ in samples[name])
        assert total(samples, name) == 0.0
    assert "vllm:gpu_cache_usage_perc" in samples


@pytest.mark.parametrize("kind", [EngineKind.VLLM, EngineKind.SGLANG])
def test_metrics_come_chunked_as_uvicorn_sends_them(
    make: Callable[..., EngineEmulator], client: httpx.Client, kind: EngineKind
) -> None:
    """No Content-Length on ``/metrics``: the engines' uvicorn frames prometheus_client's
    answer chunked (its twin against uvicorn itself: ``tests/unit/test_oneshot_uvicorn.py``),
    so the bed's reads go through the one-shot's chunked path as the real ones do."""
    emu = make(kind)
    r = client.get(url(emu, "/metrics"))
    assert r.status_code == 200 and r.headers.get("transfer-encoding") == "chunked", r.headers
    assert "content-length" not in r.headers and r.text.endswith("\n")


@pytest.mark.parametrize("dp_ranks", [1, 2])
def test_sglang_exposition_has_every_series(
    make: Callable[..., EngineEmulator], client: httpx.Client, dp_ranks: int
) -> None:
    """After SGLang's warmup (one 8-token request per DP rank): the scheduler's series per
    rank, the tokenizer's request counters once (see tests/test_emulator_drain_sglang.py)."""
    emu = make(EngineKind.SGLANG, dp_ranks=dp_ranks)
    samples = scrape(client, emu)
    for name in SGLANG_SERIES:
        scheduler = not name.endswith("_total")
        assert len(samples[name]) == (dp_ranks if scheduler else 1), name
        for labels, value in samples[name]:
            assert labels["model_name"] == "emulated"
            assert labels["engine_type"] == "unified"
            if scheduler:
                assert (labels["tp_rank"], labels["pp_rank"], labels["moe_ep_rank"]) == ("0",) * 3
                assert ("dp_rank" in labels) == (dp_ranks > 1)
                assert value == 0.0
            else:
                assert labels["is_streaming"] == "false" and "tp_rank" not in labels
    assert total(samples, "sglang:num_requests_total") == dp_ranks
    assert total(samples, "sglang:generation_tokens_total") == 8 * dp_ranks
    if dp_ranks > 1:
        assert sorted(lb["dp_rank"] for lb, _ in samples["sglang:num_running_reqs"]) == ["0", "1"]


# --------------------------------------------------------------------------------------
# requests move gauges and counters


def test_vllm_request_moves_gauges_and_counters(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, dp_ranks=2, request_seconds=0.5)
    bg = vllm_request(emu)
    assert eventually(
        lambda: total(scrape(client, emu), "vllm:num_requests_running") == 1.0,
        timeout=QUICK,
        interval=0.02,
    )
    during = scrape(client, emu)
    assert total(during, "vllm:prompt_tokens_total") == 4.0  # prompt counted at start
    assert total(during, "vllm:generation_tokens_total") == 0.0
    assert emu.in_flight == 1
    bg.join()
    assert bg.error is None and bg.response is not None and bg.response.status_code == 200
    after = scrape(client, emu)
    assert total(after, "vllm:num_requests_running") == 0.0
    assert total(after, "vllm:num_requests_waiting") == 0.0
    assert total(after, "vllm:generation_tokens_total") == 5.0
    assert emu.in_flight == 0 and emu.completed == 1


def test_vllm_dp_requests_spread_over_engines(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, dp_ranks=2, request_seconds=0.5)
    calls = [vllm_request(emu) for _ in range(2)]
    assert eventually(
        lambda: total(scrape(client, emu), "vllm:num_requests_running") == 2.0,
        timeout=QUICK,
        interval=0.02,
    )
    per_engine = [v for _, v in scrape(client, emu)["vllm:num_requests_running"]]
    assert per_engine == [1.0, 1.0]
    for bg in calls:
        bg.join()
    assert total(scrape(client, emu), "vllm:num_requests_running") == 0.0


def test_sglang_counters_move_only_at_finish(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    """Counters at finish only; the gauges as SGLang publishes them (here: the request is
    reported running once the decode counter reaches 40, 33 steps after the warmup's 7)."""
    emu = make(EngineKind.SGLANG, request_seconds=2.0)
    warm = scrape(client, emu)
    bg = sglang_request(emu)
    assert eventually(
        lambda: total(scrape(client, emu), "sglang:num_running_reqs") == 1.0,
        timeout=QUICK,
        interval=0.02,
    )
    during = scrape(client, emu)
    for name in ("sglang:num_requests_total", "sglang:generation_tokens_total"):
        assert total(during, name) == total(warm, name), name
    bg.join()
    assert bg.response is not None and bg.response.status_code == 200
    after = scrape(client, emu)
    assert total(after, "sglang:num_running_reqs") == 0.0
    assert total(after, "sglang:num_requests_total") == total(warm, "sglang:num_requests_total") + 1
    assert (
        total(after, "sglang:generation_tokens_total")
        == total(warm, "sglang:generation_tokens_total") + 7
    )


def test_emulate_seconds_overrides_and_one_token_is_immediate(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=30.0)
    start = time.monotonic()
    r = client.post(
        url(emu, "/v1/completions"), json={"model": "emulated", "prompt": "hi", "max_tokens": 1}
    )
    assert r.status_code == 200 and time.monotonic() - start < 1.0
    start = time.monotonic()
    r = client.post(
        url(emu, "/v1/completions"),
        json={"model": "emulated", "prompt": "hi", "max_tokens": 4, "emulate_seconds": 0.2},
    )
    elapsed = time.monotonic() - start
    assert r.status_code == 200 and 0.15 < elapsed < 2.0
    sg = make(EngineKind.SGLANG, request_seconds=30.0)
    start = time.monotonic()
    r = client.post(
        url(sg, "/generate"), json={"text": "hi", "sampling_params": {"max_new_tokens": 1}}
    )
    assert r.status_code == 200 and time.monotonic() - start < 1.0


# --------------------------------------------------------------------------------------
# identity echo and API shapes


def test_vllm_id_echo(make: Callable[..., EngineEmulator], client: httpx.Client) -> None:
    emu = make(EngineKind.VLLM)
    body = {"model": "emulated", "prompt": "x", "max_tokens": 1}
    r = client.post(
        url(emu, "/v1/completions"), json=body, headers={"X-Request-Id": "gpustack-qualify-abc"}
    )
    data = r.json()
    assert data["id"] == "cmpl-gpustack-qualify-abc"
    assert data["object"] == "text_completion"
    assert isinstance(data["created"], int)
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == 1
    r = client.post(
        url(emu, "/v1/completions"), json={**body, "request_id": "gpustack-qualify-body"}
    )
    assert r.json()["id"] == "cmpl-gpustack-qualify-body"
    r = client.post(
        url(emu, "/v1/completions"), json={**body, "request_id": "b"}, headers={"X-Request-Id": "h"}
    )
    assert r.json()["id"] == "cmpl-h"
    random_id = client.post(url(emu, "/v1/completions"), json=body).json()["id"]
    assert random_id.startswith("cmpl-") and len(random_id) > len("cmpl-") + 8
    assert client.post(url(emu, "/generate"), json={"text": "x"}).status_code == 404


def test_sglang_meta_info_id_echo(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.SGLANG)
    r = client.post(
        url(emu, "/generate"),
        json={
            "text": "hello there",
            "sampling_params": {"max_new_tokens": 1},
            "rid": "gpustack-qualify-42",
        },
    )
    data = r.json()
    assert r.status_code == 200
    assert data["meta_info"]["id"] == "gpustack-qualify-42"
    assert data["meta_info"]["finish_reason"] == {"type": "length", "length": 1}
    assert data["meta_info"]["prompt_tokens"] == 2
    assert data["meta_info"]["completion_tokens"] == 1
    assert isinstance(data["text"], str)
    other = client.post(
        url(emu, "/generate"), json={"text": "x", "sampling_params": {"max_new_tokens": 1}}
    ).json()
    assert len(other["meta_info"]["id"]) >= 16
    oa = client.post(
        url(emu, "/v1/completions"), json={"model": "emulated", "prompt": "x", "max_tokens": 1}
    )
    assert oa.status_code == 200 and oa.json()["choices"][0]["finish_reason"] == "length"
    assert client.get(url(emu, "/get_model_info")).json()["model_path"] == "emulated"
    assert client.get(url(emu, "/get_model_info")).json()["is_generation"] is True
    assert isinstance(client.get(url(emu, "/get_server_info")).json(), dict)
    assert client.get(url(emu, "/v1/models")).json()["data"][0]["id"] == "emulated"
    assert client.get(url(emu, "/health")).status_code == 200
    assert client.get(url(emu, "/health_generate")).status_code == 200
    assert client.get(url(emu, "/nope")).status_code == 404
    assert client.post(url(emu, "/generate"), content=b"{not json").status_code == 400


# --------------------------------------------------------------------------------------
# the requested model name, checked as each real engine checks it


def _vllm_not_found(model: str) -> dict[str, Any]:
    """vLLM 0.2x's 404 body (``OpenAIServing._check_model``; nested since v0.10.1)."""
    return {
        "error": {
            "message": f"The model `{model}` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


def test_vllm_refuses_a_model_it_does_not_serve(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=30.0)
    for route, body in (
        ("/v1/completions", {"prompt": "x", "max_tokens": 4}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ):
        for stream in (False, True):
            r = client.post(
                url(emu, route),
                json={**body, "model": "probe", "stream": stream},
                headers={"X-Request-Id": "gpustack-qualify-1"},
            )
            assert r.status_code == 404, (route, stream, r.text)
            assert r.headers["content-type"].startswith("application/json")
            assert r.json() == _vllm_not_found("probe")
    # Refused before admission: nothing ran, nothing was counted.
    assert (emu.completed, emu.in_flight, emu.aborted) == (0, 0, 0)
    assert total(scrape(client, emu), "vllm:prompt_tokens_total") == 0.0


def test_vllm_without_a_model_serves_the_first_served_name(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, served_model_names=("org/big-model", "big"))
    for body in ({}, {"model": None}, {"model": ""}, {"model": "big"}, {"model": "org/big-model"}):
        r = client.post(
            url(emu, "/v1/completions"),
            json={"prompt": "x", "max_tokens": 1, **body},
            headers={"X-Request-Id": "rid-1"},
        )
        assert r.status_code == 200, (body, r.text)
        # vLLM names the first served name whatever alias was asked for.
        assert r.json()["model"] == "org/big-model"
        assert r.json()["id"] == "cmpl-rid-1"
    r = client.post(url(emu, "/v1/completions"), json={"model": "emulated", "prompt": "x"})
    assert r.status_code == 404 and r.json() == _vllm_not_found("emulated")
    r = client.post(url(emu, "/v1/completions"), json={"model": 7, "prompt": "x"})
    assert r.status_code == 400


def test_vllm_models_list_names_every_served_name(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, served_model_names=("a", "b"), model_path="/models/Qwen3-0.6B")
    data = client.get(url(emu, "/v1/models")).json()
    assert data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["a", "b"]
    assert {m["root"] for m in data["data"]} == {"/models/Qwen3-0.6B"}
    assert {m["owned_by"] for m in data["data"]} == {"vllm"}
    assert all(m["object"] == "model" and m["parent"] is None for m in data["data"])
    # vLLM has no GET /v1/models/{name}.
    assert client.get(url(emu, "/v1/models/a")).status_code == 404
    default = make(EngineKind.VLLM)
    assert [m["id"] for m in client.get(url(default, "/v1/models")).json()["data"]] == ["emulated"]


def test_sglang_openai_routes_do_not_check_the_model(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.SGLANG, served_model_names=("qwen",), model_path="/models/q")
    r = client.post(url(emu, "/v1/completions"), json={"model": "probe", "prompt": "x"})
    assert r.status_code == 200 and r.json()["model"] == "probe"
    r = client.post(url(emu, "/v1/completions"), json={"prompt": "x", "max_tokens": 1})
    assert r.status_code == 200 and r.json()["model"] == "default"
    r = client.post(
        url(emu, "/v1/chat/completions"),
        json={"model": "other", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
    )
    assert r.status_code == 200 and r.json()["model"] == "other"
    assert [m["id"] for m in client.get(url(emu, "/v1/models")).json()["data"]] == ["qwen"]
    card = client.get(url(emu, "/v1/models/qwen"))
    assert card.status_code == 200 and card.json()["id"] == "qwen"
    missing = client.get(url(emu, "/v1/models/probe"))
    assert missing.status_code == 404
    assert missing.json() == {
        "error": {
            "message": "The model 'probe' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert client.get(url(emu, "/get_model_info")).json()["model_path"] == "/models/q"
    assert client.get(url(emu, "/get_server_info")).json()["served_model_name"] == "qwen"


def test_served_model_names_are_validated() -> None:
    def spec(engine: EngineKind, **kw: Any) -> PodEngineSpec:
        return PodEngineSpec("p", engine, LOOPBACK, 0, 0, **kw)

    with pytest.raises(ValueError):
        EngineEmulator(spec(EngineKind.SGLANG, served_model_names=("a", "b")))
    with pytest.raises(ValueError):
        EngineEmulator(spec(EngineKind.VLLM, served_model_names=()))
    with pytest.raises(ValueError):
        EngineEmulator(spec(EngineKind.VLLM, served_model_names=("",)))
    with pytest.raises(ValueError):
        EngineEmulator(spec(EngineKind.VLLM, model_path=""))
    emu = EngineEmulator(spec(EngineKind.VLLM, served_model_names=["x", "y"]))  # type: ignore[arg-type]
    assert emu.served_model_names == ("x", "y")


def test_hub_takes_a_served_model_name(
    hub: tuple[EmulatorHub, list[PodEngineSpec]], client: httpx.Client
) -> None:
    h, _ = hub
    base = f"http://{LOOPBACK}:{h.control_port}"
    pod = {"engine": "vLLM", "serve_host": LOOPBACK, "serve_port": 0, "metrics_port": 0}
    r = client.post(
        f"{base}/pods",
        json={**pod, "name": "v", "served_model_name": ["m1", "m2"], "model_path": "/m"},
    )
    assert r.status_code == 201, r.text
    assert r.json()["served_model_names"] == ["m1", "m2"]
    assert r.json()["model_path"] == "/m"
    serve = f"http://{LOOPBACK}:{r.json()['serve_port']}"
    assert (
        client.post(f"{serve}/v1/completions", json={"model": "m2", "prompt": "x"}).json()["model"]
        == "m1"
    )
    assert (
        client.post(
            f"{serve}/v1/completions", json={"model": "emulated", "prompt": "x"}
        ).status_code
        == 404
    )
    r = client.post(f"{base}/pods", json={**pod, "name": "s", "served_model_name": "one"})
    assert r.status_code == 201 and r.json()["served_model_names"] == ["one"]
    r = client.post(f"{base}/pods", json={**pod, "name": "d"})
    assert r.json()["served_model_names"] == ["emulated"]
    sg = {**pod, "engine": "SGLang"}
    for bad in (
        {**sg, "name": "x1", "served_model_name": ["a", "b"]},
        {**pod, "name": "x2", "served_model_name": []},
        {**pod, "name": "x3", "served_model_name": [""]},
        {**pod, "name": "x4", "served_model_name": 5},
        {**pod, "name": "x5", "model_path": ""},
    ):
        assert client.post(f"{base}/pods", json=bad).status_code == 400, bad
    assert "x1" not in h.names()


def test_chat_completions(make: Callable[..., EngineEmulator], client: httpx.Client) -> None:
    emu = make(EngineKind.VLLM)
    r = client.post(
        url(emu, "/v1/chat/completions"),
        headers={"X-Request-Id": "c1"},
        json={
            "model": "emulated",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
        },
    )
    data = r.json()
    assert data["id"] == "chatcmpl-c1"
    assert data["choices"][0]["message"]["role"] == "assistant"


def _events(text: str) -> list[str]:
    return [part[len("data: ") :] for part in text.split("\n\n") if part.startswith("data: ")]


def test_vllm_streaming_spreads_over_the_request(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=0.4)
    arrivals: list[float] = []
    chunks: list[str] = []
    start = time.monotonic()
    with client.stream(
        "POST",
        url(emu, "/v1/completions"),
        headers={"X-Request-Id": "s1"},
        json={
            "model": "emulated",
            "prompt": "a",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for chunk in r.iter_text():
            arrivals.append(time.monotonic() - start)
            chunks.append(chunk)
    events = _events("".join(chunks))
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(p["id"] == "cmpl-s1" for p in parsed)
    # vLLM's completion_stream_generator: the last choice chunk carries the finish reason,
    # then a chunk with no choices carries the usage (stream_options.include_usage).
    assert parsed[-2]["choices"][0]["finish_reason"] == "length"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 4
    assert len(parsed) == 5
    assert arrivals[0] < 0.35 and arrivals[-1] >= 0.35
    assert emu.completed == 1


def test_sglang_streaming(make: Callable[..., EngineEmulator], client: httpx.Client) -> None:
    emu = make(EngineKind.SGLANG, request_seconds=FAST)
    r = client.post(
        url(emu, "/generate"),
        json={"text": "a", "sampling_params": {"max_new_tokens": 3}, "rid": "r9", "stream": True},
    )
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert all(p["meta_info"]["id"] == "r9" for p in parsed)
    assert parsed[-1]["meta_info"]["finish_reason"]["type"] == "length"


# --------------------------------------------------------------------------------------
# traps


@pytest.mark.parametrize("engine", [EngineKind.VLLM, EngineKind.SGLANG])
def test_stale_gauges(
    make: Callable[..., EngineEmulator], client: httpx.Client, engine: EngineKind
) -> None:
    emu = make(engine, dp_ranks=2)
    running, waiting = (
        ("vllm:num_requests_running", "vllm:num_requests_waiting")
        if engine is EngineKind.VLLM
        else ("sglang:num_running_reqs", "sglang:num_queue_reqs")
    )
    emu.set_stale_gauges(3, 2)
    samples = scrape(client, emu)
    assert total(samples, running) == 3.0 and total(samples, waiting) == 2.0
    assert emu.in_flight == 0
    emu.clear_traps()
    samples = scrape(client, emu)
    assert total(samples, running) == 0.0 and total(samples, waiting) == 0.0


def test_frontend_hidden_request_is_not_in_gauges(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=0.1)
    emu.set_frontend_hidden(0.6)
    bg = vllm_request(emu)
    assert eventually(lambda: emu.in_flight == 1, timeout=QUICK, interval=0.02)
    samples = scrape(client, emu)
    assert total(samples, "vllm:num_requests_running") == 0.0
    assert total(samples, "vllm:num_requests_waiting") == 0.0
    assert total(samples, "vllm:prompt_tokens_total") == 0.0
    assert total(samples, "vllm:generation_tokens_total") == 0.0
    bg.join()
    assert bg.response is not None and bg.response.status_code == 200
    after = scrape(client, emu)
    assert total(after, "vllm:prompt_tokens_total") == 4.0
    assert total(after, "vllm:generation_tokens_total") == 5.0
    assert emu.in_flight == 0


def test_restart_resets_counters_and_cuts_requests(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=FAST)
    ports = (emu.serve_port, emu.metrics_port)
    assert (
        client.post(
            url(emu, "/v1/completions"), json={"prompt": "a b", "max_tokens": 3}
        ).status_code
        == 200
    )
    assert total(scrape(client, emu), "vllm:generation_tokens_total") == 3.0
    emu.set_stale_gauges(5)
    slow = vllm_request(emu, emulate_seconds=5.0)
    assert eventually(lambda: emu.in_flight == 1, timeout=QUICK, interval=0.02)
    emu.restart()
    slow.join()
    assert slow.error is not None  # cut, no complete response
    assert (emu.serve_port, emu.metrics_port) == ports
    samples = scrape(client, emu)
    for name in VLLM_SERIES:
        assert total(samples, name) == 0.0, name
    assert emu.in_flight == 0
    assert emu.status()["restarts"] == 1


@pytest.mark.parametrize("engine", [EngineKind.VLLM, EngineKind.SGLANG])
def test_metrics_huge(
    make: Callable[..., EngineEmulator], client: httpx.Client, engine: EngineKind
) -> None:
    emu = make(engine)
    emu.set_metrics_mode("huge")
    body = client.get(url(emu, "/metrics", metrics=True)).content
    assert len(body) > 2 * 1024 * 1024 and len(body) >= HUGE_METRICS_BYTES
    samples = parse(body.decode())  # still valid exposition, only too big
    assert "vllm:num_requests_running" in samples or "sglang:num_running_reqs" in samples


@pytest.mark.parametrize("mode", ["malformed", "nonnumeric"])
def test_metrics_malformed(
    make: Callable[..., EngineEmulator], client: httpx.Client, mode: str
) -> None:
    emu = make(EngineKind.VLLM)
    emu.set_metrics_mode(mode)
    text = client.get(url(emu, "/metrics", metrics=True)).text
    with pytest.raises(ValueError):
        parse(text)


@pytest.mark.parametrize("engine", [EngineKind.VLLM, EngineKind.SGLANG])
def test_metrics_nan_negative_missing(
    make: Callable[..., EngineEmulator], client: httpx.Client, engine: EngineKind
) -> None:
    emu = make(engine, dp_ranks=2)
    vllm = engine is EngineKind.VLLM
    running = "vllm:num_requests_running" if vllm else "sglang:num_running_reqs"
    waiting = "vllm:num_requests_waiting" if vllm else "sglang:num_queue_reqs"
    emu.set_metrics_mode("nan")
    assert math.isnan(total(scrape(client, emu), running))
    emu.set_metrics_mode("negative")
    assert total(scrape(client, emu), running) < 0
    emu.set_metrics_mode("missing")
    samples = scrape(client, emu)
    assert waiting not in samples and running in samples
    counter = "vllm:prompt_tokens_total" if vllm else "sglang:num_requests_total"
    emu.set_metrics_mode(f"missing:{counter}")
    samples = scrape(client, emu)
    assert counter not in samples and waiting in samples
    emu.clear_traps()
    samples = scrape(client, emu)
    assert all(name in samples for name in (VLLM_SERIES if vllm else SGLANG_SERIES))


def test_metrics_slow_and_empty_and_error(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.SGLANG)
    emu.set_metrics_mode("slow")
    start = time.monotonic()
    with pytest.raises(httpx.TimeoutException):
        client.get(url(emu, "/metrics", metrics=True), timeout=0.5)
    assert time.monotonic() - start < 2.0
    assert client.get(url(emu, "/health")).status_code == 200  # only /metrics stalls
    emu.set_metrics_mode("empty")
    r = client.get(url(emu, "/metrics"))
    assert r.status_code == 200 and r.content == b""
    emu.set_metrics_mode("error")
    assert client.get(url(emu, "/metrics")).status_code == 500
    with pytest.raises(ValueError):
        emu.set_metrics_mode("bogus")


def test_stop_refuses_connections_and_cuts_in_flight(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=5.0)
    emu.set_healthy(False)
    assert client.get(url(emu, "/health")).status_code == 503
    emu.set_healthy(True)
    assert client.get(url(emu, "/health")).status_code == 200
    plain = vllm_request(emu)
    streamed = vllm_request(emu, stream=True)
    assert eventually(lambda: emu.in_flight == 2, timeout=QUICK, interval=0.02)
    start = time.monotonic()
    emu.stop()
    assert time.monotonic() - start < 2.0
    plain.join()
    streamed.join()
    assert plain.error is not None and plain.response is None
    assert streamed.error is not None and streamed.response is None
    assert emu.in_flight == 0 and emu.completed == 0 and emu.aborted == 2
    for metrics in (False, True):
        with pytest.raises(httpx.ConnectError):
            client.get(url(emu, "/health", metrics))


# --------------------------------------------------------------------------------------
# the hub


@pytest.fixture
def hub() -> Iterator[tuple[EmulatorHub, list[PodEngineSpec]]]:
    """A hub on 127.0.0.1 serving in a thread; records on_add calls."""
    added: list[PodEngineSpec] = []
    h = EmulatorHub(LOOPBACK, 0, on_add=added.append)
    thread = h.start_background()
    yield h, added
    h.shutdown()
    thread.join(5)
    assert not thread.is_alive()


def test_hub_control_api(
    hub: tuple[EmulatorHub, list[PodEngineSpec]], client: httpx.Client
) -> None:
    h, added = hub
    base = f"http://{LOOPBACK}:{h.control_port}"
    assert client.get(f"{base}/health").json()["ok"] is True
    serve_port, metrics_port = free_port(), free_port()
    spec = {
        "name": "llm-0",
        "engine": "vLLM",
        "serve_host": LOOPBACK,
        "serve_port": serve_port,
        "metrics_port": metrics_port,
        "dp_ranks": 2,
        "request_seconds": FAST,
    }
    r = client.post(f"{base}/pods", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["serve_port"] == serve_port
    assert [s.name for s in added] == ["llm-0"]
    assert client.post(f"{base}/pods", json=spec).status_code == 409
    assert (
        client.post(f"{base}/pods", json={**spec, "name": "x", "engine": "tgi"}).status_code == 400
    )
    assert (
        client.post(
            f"{base}/pods", json={**spec, "name": "x", "serve_host": "example.org"}
        ).status_code
        == 400
    )

    metrics = f"http://{LOOPBACK}:{metrics_port}/metrics"
    samples = parse(client.get(metrics).text)
    assert len(samples["vllm:num_requests_running"]) == 2

    r = client.post(f"{base}/pods/llm-0/traps", json={"stale_gauges": [4, 1]})
    assert r.status_code == 200 and r.json()["traps"]["stale_gauges"] == [4, 1]
    samples = parse(client.get(metrics).text)
    assert total(samples, "vllm:num_requests_running") == 4.0
    assert total(samples, "vllm:num_requests_waiting") == 1.0
    r = client.post(
        f"{base}/pods/llm-0/traps",
        json={"clear": True, "metrics_mode": "nan", "frontend_hidden": 0.0},
    )
    assert r.json()["traps"] == {
        "stale_gauges": None,
        "frontend_hidden": 0.0,
        "metrics_mode": "nan",
        "healthy": True,
        "silent": False,
    }
    assert client.post(f"{base}/pods/llm-0/traps", json={"metrics_mode": "zzz"}).status_code == 400
    assert client.post(f"{base}/pods/llm-0/traps", json={"what": 1}).status_code == 400
    client.post(f"{base}/pods/llm-0/traps", json={"clear": True})

    serve = f"http://{LOOPBACK}:{serve_port}"
    assert (
        client.post(f"{serve}/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code
        == 200
    )
    status = client.get(f"{base}/pods/llm-0").json()
    assert status["completed"] == 1 and status["in_flight"] == 0
    assert status["generation_tokens"] == 2

    status = client.post(f"{base}/pods/llm-0/restart").json()
    assert status["restarts"] == 1 and status["generation_tokens"] == 0
    assert [p["name"] for p in client.get(f"{base}/pods").json()["pods"]] == ["llm-0"]

    assert client.delete(f"{base}/pods/llm-0").status_code == 200
    assert client.get(f"{base}/pods/llm-0").status_code == 404
    with pytest.raises(httpx.ConnectError):
        client.get(f"{serve}/health")
    with pytest.raises(httpx.ConnectError):
        client.get(metrics)


def test_hub_sglang_pod(hub: tuple[EmulatorHub, list[PodEngineSpec]], client: httpx.Client) -> None:
    h, _ = hub
    base = f"http://{LOOPBACK}:{h.control_port}"
    r = client.post(
        f"{base}/pods",
        json={
            "name": "sg",
            "engine": "SGLang",
            "serve_host": LOOPBACK,
            "serve_port": 0,
            "metrics_port": 0,
        },
    )
    assert r.status_code == 201
    port = r.json()["serve_port"]
    out = client.post(
        f"http://{LOOPBACK}:{port}/generate",
        json={"text": "a", "sampling_params": {"max_new_tokens": 1}, "rid": "q"},
    )
    assert out.json()["meta_info"]["id"] == "q"
    assert h.get("sg").completed == 1


def test_main_runs_a_hub_until_sigterm(client: httpx.Client) -> None:
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testbed.emulator",
            "--control-host",
            LOOPBACK,
            "--control-port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        port = json.loads(line)["control_port"]
        base = f"http://{LOOPBACK}:{port}"
        assert client.get(f"{base}/health").status_code == 200
        r = client.post(
            f"{base}/pods",
            json={
                "name": "p",
                "engine": "vLLM",
                "serve_host": LOOPBACK,
                "serve_port": 0,
                "metrics_port": 0,
            },
        )
        assert r.status_code == 201
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


def test_hub_replaces_an_emulator_whose_address_is_reused() -> None:
    """A new Pod on a deleted Pod's address: the stale emulator is stopped, not a 500."""
    hub = EmulatorHub("127.0.0.1", 0)
    try:
        port, metrics = free_port(), free_port()
        spec = PodEngineSpec(
            name="old",
            engine=EngineKind.VLLM,
            serve_host="127.0.0.1",
            serve_port=port,
            metrics_port=metrics,
        )
        hub.add(spec)
        hub.add(
            PodEngineSpec(
                name="new",
                engine=EngineKind.VLLM,
                serve_host="127.0.0.1",
                serve_port=port,
                metrics_port=free_port(),
            )
        )
        assert hub.names() == ["new"]
    finally:
        hub.shutdown()


# --------------------------------------------------------------------------------------
# the journal (the fault campaign's ground truth)


def test_the_journal_records_each_request_and_the_hub_keeps_a_removed_pods(
    hub: tuple[EmulatorHub, list[PodEngineSpec]], client: httpx.Client
) -> None:
    h, _ = hub
    base = f"http://{LOOPBACK}:{h.control_port}"
    pod = {"engine": "vLLM", "serve_host": LOOPBACK, "serve_port": 0, "metrics_port": 0}
    r = client.post(f"{base}/pods", json={**pod, "name": "j", "request_seconds": 3})
    assert r.status_code == 201, r.text
    emu = h.get("j")
    before = time.time()
    assert (
        client.post(
            url(emu, "/v1/completions"), json={"prompt": "x", "emulate_seconds": 0.05}
        ).status_code
        == 200
    )
    held = vllm_request(emu)  # 3 s: still in flight when read, then cut by the removal
    assert eventually(lambda: emu.in_flight == 1, timeout=QUICK, interval=0.02)
    j = client.get(f"{base}/journal").json()["pods"]["j"]
    ((admitted, ended, ok),) = j["ended"]
    assert before <= admitted <= ended <= time.time() and ok is True
    assert len(j["open"]) == 1 and j["open"][0] >= admitted
    assert client.delete(f"{base}/pods/j").status_code == 200
    held.join()
    kept = client.get(f"{base}/journal").json()["pods"]["j"]
    assert kept["open"] == [] and [e[2] for e in kept["ended"]] == [True, False]


def test_a_silent_engine_keeps_its_request_in_flight_and_running_until_it_speaks(
    make: Callable[..., EngineEmulator], client: httpx.Client
) -> None:
    emu = make(EngineKind.VLLM, request_seconds=0.2)
    emu.set_silent(True)
    bg = vllm_request(emu)
    assert eventually(lambda: emu.in_flight == 1, timeout=QUICK, interval=0.02)
    time.sleep(0.6)  # three times the request's length: still not done
    assert emu.in_flight == 1 and emu.completed == 0
    assert total(scrape(client, emu), "vllm:num_requests_running") == 1.0
    emu.clear_traps()
    bg.join()
    assert bg.response is not None and bg.response.status_code == 200
    assert emu.completed == 1 and emu.in_flight == 0
