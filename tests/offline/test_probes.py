"""The identity probe (``activities.probes.identity_probe``) against engines that answer as
the real ones do: offline through ``httpx.MockTransport``, and on loopback against the
engine emulator, which refuses a model name it does not serve as vLLM does.

The real behaviour the fakes follow (vLLM 0.2x ``vllm/entrypoints/openai``):
``OpenAIServing._check_model`` answers 404 ``{"error": {"message": "The model `x` does not
exist.", "type": "NotFoundError", "param": "model", "code": 404}}`` for a ``model`` that is
not a served name, and accepts a request without ``model`` (``_is_model_supported``: an
empty name is the first served model). The completion's ``id`` is ``cmpl-`` + the
``X-Request-Id`` header, else the body's ``request_id``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from activities.probes import identity_probe
from retirement.models import IntentKind, MemberTarget, Target
from testbed.emulator import EngineEmulator, EngineKind
from tests.helpers.emulators import emulators

Handler = Callable[[httpx.Request], httpx.Response]
LOOPBACK = "127.0.0.1"


def target(engine: str = "vLLM", version: str = "0.29.0") -> Target:
    return Target(
        namespace="default",
        deployment="llm",
        role="server",
        ordinal=1,
        intent=IntentKind.COUNT_TRIM,
        engine=engine,
        engine_version=version,
        shape="leader-served",
        members=[],
    )


def member(ip: str = "198.18.1.20", port: int | None = 8000) -> MemberTarget:
    return MemberTarget(pod="llm-1-0", uid="uid-1-0", container_id="c://1", ip=ip, serve_port=port)


def probe(
    handler: Handler, *, engine: str = "vLLM", port: int | None = 8000
) -> tuple[str, list[httpx.Request]]:
    """Run the probe against ``handler``; its reason and the requests it sent."""
    log: list[httpx.Request] = []

    def logged(request: httpx.Request) -> httpx.Response:
        log.append(request)
        return handler(request)

    reason = identity_probe(
        target(engine), member(port=port), transport=httpx.MockTransport(logged)
    )
    return reason, log


def real_vllm(*served: str) -> Handler:
    """An engine that answers ``/v1/models`` and ``/v1/completions`` as vLLM 0.2x does,
    serving the model under ``served`` (``--served-model-name``)."""
    names = served or ("Qwen/Qwen3-8B",)

    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path == "/v1/models":
            return httpx.Response(
                200,
                json={"object": "list", "data": [{"id": n, "object": "model"} for n in names]},
            )
        if request.method != "POST" or request.url.path != "/v1/completions":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        model = body.get("model")
        if model and model not in names:
            return httpx.Response(
                404,
                json={
                    "error": {
                        "message": f"The model `{model}` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
            )
        rid = request.headers.get("X-Request-Id") or body.get("request_id") or "random"
        return httpx.Response(
            200,
            json={
                "id": f"cmpl-{rid}",
                "object": "text_completion",
                "model": names[0],
                "choices": [{"index": 0, "text": " pong", "finish_reason": "length"}],
            },
        )

    return handle


# ---------------------------------------------------------------- vLLM


def test_vllm_probe_is_verified_by_an_engine_that_refuses_unknown_model_names() -> None:
    """The defect: the probe named ``"model": "probe"`` and a real vLLM answered 404, so
    no multi-member vLLM group was ever restored. Fails on the old probe."""
    reason, log = probe(real_vllm("Qwen/Qwen3-8B"))
    assert reason == ""
    assert [(r.method, str(r.url)) for r in log] == [
        ("POST", "http://198.18.1.20:8000/v1/completions")
    ]


def test_vllm_probe_names_no_model_and_binds_the_request_id() -> None:
    _, [request] = probe(real_vllm())
    body = json.loads(request.content)
    assert "model" not in body
    rid = request.headers["X-Request-Id"]
    assert rid.startswith("gpustack-qualify-") and len(rid) > len("gpustack-qualify-") + 8
    assert body == {"prompt": "ping", "max_tokens": 1, "request_id": rid}


def test_each_vllm_probe_uses_a_fresh_request_id() -> None:
    _, first = probe(real_vllm())
    _, second = probe(real_vllm())
    assert first[0].headers["X-Request-Id"] != second[0].headers["X-Request-Id"]


def test_vllm_probe_reads_a_refusal_with_the_engines_reason() -> None:
    def refusing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            404,
            json={
                "error": {
                    "message": "The model `x` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            },
        )

    reason, _ = probe(refusing)
    assert reason == "identity probe refused: HTTP 404: The model `x` does not exist."
    flat = {"object": "error", "message": "bad\nrequest", "type": "BadRequestError", "code": 400}
    reason, _ = probe(lambda r: httpx.Response(400, json=flat))
    assert reason == "identity probe refused: HTTP 400: bad?request"
    reason, _ = probe(lambda r: httpx.Response(422, text="x" * 500))
    assert reason == "identity probe refused: HTTP 422: " + "x" * 120


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            lambda r: httpx.Response(200, json={"id": "cmpl-someone-else"}),
            "identity probe echo mismatch",
        ),
        (lambda r: httpx.Response(200, json={"choices": []}), "identity probe echo mismatch"),
        (lambda r: httpx.Response(503, text="busy"), "identity probe failed: HTTPStatusError"),
        (lambda r: httpx.Response(200, text="<html>"), "identity probe failed: JSONDecodeError"),
        (lambda r: httpx.Response(200, json=["cmpl-x"]), "identity probe failed: AttributeError"),
    ],
    ids=["other-id", "no-id", "503", "not-json", "a-list"],
)
def test_vllm_probe_reads_unknown_when_the_echo_is_not_proven(answer: Handler, reason: str) -> None:
    assert probe(answer)[0] == reason


def test_vllm_probe_reads_unknown_when_the_engine_is_unreachable() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    assert probe(down)[0] == "identity probe failed: ConnectError"


def test_no_serving_port_sends_nothing() -> None:
    reason, log = probe(real_vllm(), port=None)
    assert reason == "no serving port" and log == []


# ---------------------------------------------------------------- SGLang


def test_sglang_probe_uses_generate_and_its_rid() -> None:
    def sglang(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        assert request.url.path == "/generate" and "model" not in body
        assert body["sampling_params"] == {"max_new_tokens": 1}
        meta = {"id": body["rid"], "finish_reason": {"type": "length", "length": 1}}
        return httpx.Response(200, json={"text": " pong", "meta_info": meta})

    reason, [request] = probe(sglang, engine="SGLang")
    assert reason == ""
    assert json.loads(request.content)["rid"].startswith("gpustack-qualify-")

    unfinished = {"meta_info": {"id": "x", "finish_reason": None}}
    assert probe(lambda r: httpx.Response(200, json=unfinished), engine="SGLang")[0] == (
        "identity probe echo mismatch"
    )


# ---------------------------------------------------------------- against the emulator


@pytest.fixture
def emulator() -> Iterator[Callable[..., EngineEmulator]]:
    """Started emulators on 127.0.0.1 (free port), stopped afterwards."""
    with emulators(prefix="probe", request_seconds=30.0) as start:
        yield start


def test_probe_is_verified_by_the_strict_emulator(
    emulator: Callable[..., EngineEmulator],
) -> None:
    """The emulator now refuses a model name it does not serve, as vLLM does: the probe is
    verified by it, and a probe naming a made-up model would not be."""
    vllm = emulator(EngineKind.VLLM, served_model_names=("org/served-name",))
    at = member(ip=LOOPBACK, port=vllm.serve_port)
    assert identity_probe(target("vLLM"), at) == ""
    assert vllm.completed == 1
    with httpx.Client(trust_env=False, timeout=5.0) as http:
        refused = http.post(
            f"http://{LOOPBACK}:{vllm.serve_port}/v1/completions",
            json={"model": "probe", "prompt": "ping", "max_tokens": 1},
        )
    assert refused.status_code == 404
    sglang = emulator(EngineKind.SGLANG, served_model_names=("other",))
    assert identity_probe(target("SGLang"), member(ip=LOOPBACK, port=sglang.serve_port)) == ""
    assert sglang.completed == 1
