"""The identity probe (``activities.probes.identity_probe``) against engines that answer as
the real ones do: offline through ``httpx.MockTransport``, and on loopback against the
engine emulator, which answers and refuses the probe's routes as the bed's versions do
(vLLM 0.29.0, SGLang 0.5.21; ``testbed/emulator/intake.py`` cites the source of each rule).

The real behaviour the fakes follow (vLLM 0.29.0, and 0.25.1 alike, read in the released
wheels): ``BaseServing._check_model`` (vllm/entrypoints/serve/engine/serving.py) answers
404 ``{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError",
"param": "model", "code": 404}}`` for a ``model`` that is not a served name, and accepts a
request without ``model`` (``_is_model_supported``: an empty name is the first served
model). The completion's ``id`` (``OpenAIServingCompletion._create_completion``) is
``cmpl-`` + ``_base_request_id``: the ``X-Request-Id`` header whenever present, else the
body's ``request_id``. SGLang's ``/generate`` answers ``meta_info.id`` = ``rid``
(``TokenizerManager._handle_batch_output``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from activities.probes import identity_probe
from retirement.models import IntentKind, MemberTarget, Target
from testbed.emulator import EngineEmulator, EngineKind
from tests.helpers import eventually
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


# ---------------------------------------------------------------- each refusal, read by the probe


Change = Callable[[dict[str, Any], dict[str, str]], bytes | None]


class Tamper(httpx.BaseTransport):
    """Forwards the probe's request to the emulator over loopback after ``change`` edits its
    JSON body and headers in place (returning bytes replaces the body whole): the probe
    then reads the emulator's real answer to a request the real engine refuses."""

    def __init__(self, change: Change) -> None:
        self.change = change
        self.inner = httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.read())
        headers = {k: v for k, v in request.headers.items() if k != "content-length"}
        replaced = self.change(body, headers)
        content = json.dumps(body).encode() if replaced is None else replaced
        sent = httpx.Request(request.method, request.url, headers=headers, content=content)
        return self.inner.handle_request(sent)

    def close(self) -> None:
        self.inner.close()


def probe_through(emu: EngineEmulator, change: Change) -> str:
    """The product's probe of ``emu`` (the bed's engine version), through :class:`Tamper`."""
    engine, version = ("vLLM", "0.29.0") if emu.engine is EngineKind.VLLM else ("SGLang", "0.5.21")
    with Tamper(change) as transport:
        return identity_probe(
            target(engine, version), member(ip=LOOPBACK, port=emu.serve_port), transport=transport
        )


def _set(key: str, value: Any) -> Change:
    def change(body: dict[str, Any], headers: dict[str, str]) -> None:
        body[key] = value

    return change


def _drop(key: str, *header: str) -> Change:
    def change(body: dict[str, Any], headers: dict[str, str]) -> None:
        body.pop(key, None)
        for name in header:
            headers.pop(name, None)

    return change


def _content_type(value: str | None) -> Change:
    def change(body: dict[str, Any], headers: dict[str, str]) -> None:
        headers.pop("content-type", None)
        if value is not None:
            headers["content-type"] = value

    return change


def _no_header_other_body_id(body: dict[str, Any], headers: dict[str, str]) -> None:
    headers.pop("x-request-id", None)
    body["request_id"] = "someone-else"


def _empty_header(body: dict[str, Any], headers: dict[str, str]) -> None:
    headers["x-request-id"] = ""


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b, h: None, ""),
        (
            _set("model", "probe"),
            "identity probe refused: HTTP 404: The model `probe` does not exist.",
        ),
        (
            _set("max_tokens", 0),
            "identity probe refused: HTTP 400: max_tokens must be at least 1, got 0. "
            "(parameter=max_tokens, value=0)",
        ),
        (
            _drop("prompt"),
            "identity probe refused: HTTP 400: Either prompt or prompt_embeds must be "
            "provided and non-empty. (parameter=prompt)",
        ),
        (
            _set("request_id", None),
            "identity probe refused: HTTP 400: 1 validation error:?  {'type': 'string_type', "
            "'loc': ('body', 'request_id'), 'msg': 'Input should be a valid string', 'i",
        ),
        (
            _content_type("text/plain"),
            "identity probe refused: HTTP 400: 1 validation error:?  Unsupported Media Type: "
            "Only 'application/json' is allowed",
        ),
        (
            _content_type(None),
            "identity probe refused: HTTP 400: 1 validation error:?  Unsupported Media Type: "
            "Only 'application/json' is allowed",
        ),
        (_no_header_other_body_id, "identity probe echo mismatch"),
        (_empty_header, "identity probe echo mismatch"),
    ],
    ids=[
        "as-sent",
        "unserved-model",
        "zero-tokens",
        "no-prompt",
        "null-request-id",
        "text-plain",
        "no-content-type",
        "other-body-id",
        "empty-header",
    ],
)
def test_vllm_probe_reads_unknown_on_each_refusal(
    emulator: Callable[..., EngineEmulator], change: Change, reason: str
) -> None:
    """The product's vLLM probe, its request edited on the way: VERIFIED as sent, UNKNOWN
    (with the engine's reason) for each request vLLM 0.29.0 refuses or answers with another
    id. ``no-content-type`` and ``empty-header`` read VERIFIED against the old emulator."""
    emu = emulator(EngineKind.VLLM, request_seconds=0.3)
    assert probe_through(emu, change) == reason
    assert emu.completed == (1 if reason in ("", "identity probe echo mismatch") else 0)


def _batch(body: dict[str, Any], headers: dict[str, str]) -> None:
    body["text"] = [body["text"]]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda b, h: None, ""),
        (_set("rid", 12345), "identity probe failed: HTTPStatusError"),
        (_drop("text"), "identity probe failed: HTTPStatusError"),
        (_set("sampling_params", {"max_new_tokens": -1}), "identity probe failed: HTTPStatusError"),
        (_set("sampling_params", {"max_tokens": 1}), "identity probe failed: HTTPStatusError"),
        (_content_type(None), "identity probe failed: HTTPStatusError"),
        (lambda b, h: b"{not json", "identity probe failed: HTTPStatusError"),
        (_batch, "identity probe failed: AttributeError"),
        (_set("rid", "someone-else"), "identity probe echo mismatch"),
    ],
    ids=[
        "as-sent",
        "rid-a-number",
        "no-text",
        "negative-budget",
        "unknown-sampling-key",
        "no-content-type",
        "bad-json",
        "batch",
        "other-rid",
    ],
)
def test_sglang_probe_reads_unknown_on_each_refusal(
    emulator: Callable[..., EngineEmulator], change: Change, reason: str
) -> None:
    """The product's SGLang probe, its request edited on the way. ``rid-a-number`` read
    ``echo mismatch`` (a 200) and ``unknown-sampling-key``/``no-content-type`` VERIFIED
    against the old emulator; a real SGLang refuses all three."""
    emu = emulator(EngineKind.SGLANG, request_seconds=0.3)
    assert probe_through(emu, change) == reason


def test_sglang_probe_reads_unknown_when_its_rid_is_already_in_flight(
    emulator: Callable[..., EngineEmulator],
) -> None:
    """SGLang refuses an id in flight; the probe (fresh id each time) is never refused so,
    but a probe that reused one would read UNKNOWN, not VERIFIED."""
    emu = emulator(EngineKind.SGLANG, request_seconds=0.3)
    url = f"http://{LOOPBACK}:{emu.serve_port}/generate"
    held = {"text": "x", "rid": "held", "sampling_params": {"max_new_tokens": 4}}

    def long_request() -> None:
        with httpx.Client(trust_env=False, timeout=5.0) as c:
            c.post(url, json={**held, "emulate_seconds": 1.0})

    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    assert eventually(lambda: emu.in_flight == 1, timeout=3.0, interval=0.01)
    started = time.monotonic()
    assert probe_through(emu, _set("rid", "held")) == "identity probe failed: HTTPStatusError"
    assert time.monotonic() - started < 1.0
    thread.join(5.0)
