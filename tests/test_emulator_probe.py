"""The engine emulator answers, and refuses, the identity probe's routes as the real engines
do (vLLM 0.29.0 ``POST /v1/completions``, SGLang 0.5.21 ``POST /generate``; the bed's
versions). That the product's probe reads UNKNOWN on each refusal is in
``tests/offline/test_probes.py``.

Every expectation here is read from the real engines' released sources; the rule and its
citation are in ``testbed/emulator/intake.py`` (named at each test). Everything stays on
127.0.0.1.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from testbed.emulator import EngineEmulator, EngineKind
from tests.helpers import eventually
from tests.helpers.emulators import LOOPBACK, emulators

Start = Callable[..., EngineEmulator]


@pytest.fixture
def start() -> Iterator[Start]:
    """Started emulators (request_seconds 0.3), stopped afterwards."""
    with emulators(prefix="strict", request_seconds=0.3) as factory:
        yield factory


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=5.0) as c:
        yield c


def at(emu: EngineEmulator, path: str) -> str:
    return f"http://{LOOPBACK}:{emu.serve_port}{path}"


def vllm_error(message: str, err_type: str, code: int, param: str | None) -> dict[str, Any]:
    """vLLM's ErrorResponse (``ErrorInfo``: message, type, param, code)."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


PING = {"prompt": "ping", "max_tokens": 1}


# ======================================================================== vLLM 0.29.0


def test_vllm_request_id_is_the_header_whenever_present_else_the_body(
    start: Start, client: httpx.Client
) -> None:
    """``BaseServing._base_request_id``: the header ``is not None`` wins, even empty; else
    the body's ``request_id``, whatever string, even empty."""
    emu = start(EngineKind.VLLM)
    post = client.post
    url = at(emu, "/v1/completions")
    assert post(url, json={**PING, "request_id": "b"}, headers={"X-Request-Id": "h"}).json()[
        "id"
    ] == ("cmpl-h")
    assert post(url, json={**PING, "request_id": "b"}, headers={"X-Request-Id": ""}).json()[
        "id"
    ] == ("cmpl-")
    assert post(url, json={**PING, "request_id": "b"}).json()["id"] == "cmpl-b"
    assert post(url, json={**PING, "request_id": ""}).json()["id"] == "cmpl-"
    generated = post(url, json=PING).json()["id"]
    assert generated.startswith("cmpl-") and len(generated) == len("cmpl-") + 32


@pytest.mark.parametrize(
    ("field", "value", "kind", "msg"),
    [
        ("request_id", None, "string_type", "Input should be a valid string"),
        ("request_id", 5, "string_type", "Input should be a valid string"),
        ("model", 7, "string_type", "Input should be a valid string"),
        (
            "max_tokens",
            "x",
            "int_parsing",
            "Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            "max_tokens",
            2.5,
            "int_from_float",
            "Input should be a valid integer, got a number with a fractional part",
        ),
    ],
)
def test_vllm_refuses_a_field_of_the_wrong_type_with_its_validation_error(
    start: Start, client: httpx.Client, field: str, value: Any, kind: str, msg: str
) -> None:
    """pydantic refuses it; vLLM's ``validation_exception_handler`` answers 400, type
    ``Bad Request``, ``param`` the location (a ``null`` request_id is refused: the field is
    a ``str`` with a default factory, not optional)."""
    emu = start(EngineKind.VLLM)
    r = client.post(at(emu, "/v1/completions"), json={**PING, field: value})
    assert r.status_code == 400
    err = {"type": kind, "loc": ("body", field), "msg": msg, "input": value}
    assert r.json() == vllm_error(
        f"1 validation error:\n  {err}", "Bad Request", 400, f"body.{field}"
    )
    assert (emu.completed, emu.in_flight) == (0, 0)


def test_vllm_coerces_what_pydantic_coerces(start: Start, client: httpx.Client) -> None:
    """Lax validation: ``"3"`` and ``3.0`` are 3, ``true`` is 1, ``null`` is the default 16
    (``normalize_null_max_tokens``)."""
    emu = start(EngineKind.VLLM)
    for value, tokens in (("3", 3), (3.0, 3), (True, 1), (None, 16)):
        r = client.post(at(emu, "/v1/completions"), json={**PING, "max_tokens": value})
        assert r.status_code == 200, (value, r.text)
        assert r.json()["usage"]["completion_tokens"] == tokens, value


@pytest.mark.parametrize("tokens", [0, -1])
def test_vllm_refuses_max_tokens_below_one(start: Start, client: httpx.Client, tokens: int) -> None:
    """``SamplingParams._verify_args``: a ``VLLMValidationError`` -> 400 ``BadRequestError``."""
    emu = start(EngineKind.VLLM)
    r = client.post(at(emu, "/v1/completions"), json={**PING, "max_tokens": tokens})
    assert r.status_code == 400
    assert r.json() == vllm_error(
        f"max_tokens must be at least 1, got {tokens}. (parameter=max_tokens, value={tokens})",
        "BadRequestError",
        400,
        "max_tokens",
    )


@pytest.mark.parametrize("body", [{"max_tokens": 1}, {"prompt": "", "max_tokens": 1}])
def test_vllm_refuses_a_missing_or_empty_prompt(
    start: Start, client: httpx.Client, body: dict[str, Any]
) -> None:
    """``validate_prompt_and_prompt_embeds``: in 0.29.0 ``VLLMValidationError`` is not a
    ``ValueError``, so it passes pydantic and the VLLMError handler answers it."""
    emu = start(EngineKind.VLLM)
    r = client.post(at(emu, "/v1/completions"), json=body)
    assert r.status_code == 400
    assert r.json() == vllm_error(
        "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        "BadRequestError",
        400,
        "prompt",
    )


def test_vllm_checks_in_order_body_then_model_then_max_tokens(
    start: Start, client: httpx.Client
) -> None:
    """Validation comes before ``_check_model``, which comes before the sampling params."""
    emu = start(EngineKind.VLLM)
    url = at(emu, "/v1/completions")
    r = client.post(url, json={"model": "probe", "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    r = client.post(url, json={"model": "probe", "prompt": "p", "max_tokens": 0})
    assert r.status_code == 404
    assert r.json() == vllm_error(
        "The model `probe` does not exist.", "NotFoundError", 404, "model"
    )
    r = client.post(url, json={"model": 7, "prompt": "p", "max_tokens": "x"})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and message.startswith("2 validation errors:\n")
    assert r.json()["error"]["param"] == "body.model"


@pytest.mark.parametrize(
    ("content", "headers", "message", "param"),
    [
        (
            b'{"prompt": "ping"}',
            {"Content-Type": "text/plain"},
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            None,
        ),
        (
            b'{"prompt": "ping"}',
            {},
            "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed",
            None,
        ),
        (
            b"{not json",
            {"Content-Type": "application/json"},
            "1 validation error:\n  {'type': 'json_invalid', 'loc': ('body', 1), 'msg': 'JSON "
            "decode error', 'input': {}, 'ctx': {'error': 'Expecting property name enclosed "
            "in double quotes'}}",
            "body.1",
        ),
        (
            b"",
            {"Content-Type": "application/json"},
            "1 validation error:\n  {'type': 'missing', 'loc': ('body',), 'msg': 'Field "
            "required', 'input': None}",
            "body",
        ),
        (
            b"[1]",
            {"Content-Type": "application/json; charset=utf-8"},
            "1 validation error:\n  {'type': 'model_attributes_type', 'loc': ('body',), 'msg': "
            "'Input should be a valid dictionary or object to extract fields from', 'input': "
            "[1]}",
            "body",
        ),
    ],
    ids=["text-plain", "no-content-type", "bad-json", "empty", "not-an-object"],
)
def test_vllm_refuses_a_body_that_is_not_a_json_object(
    start: Start,
    client: httpx.Client,
    content: bytes,
    headers: dict[str, str],
    message: str,
    param: str | None,
) -> None:
    """FastAPI parses JSON only under a JSON Content-Type (strict since 0.132); the route's
    ``validate_json_request`` dependency refuses any other media type."""
    emu = start(EngineKind.VLLM)
    r = client.post(at(emu, "/v1/completions"), content=content, headers=headers)
    assert r.status_code == 400
    assert r.json() == vllm_error(message, "Bad Request", 400, param)


def test_vllm_refuses_stream_options_without_stream(start: Start, client: httpx.Client) -> None:
    emu = start(EngineKind.VLLM)
    r = client.post(
        at(emu, "/v1/completions"), json={**PING, "stream_options": {"include_usage": True}}
    )
    assert r.status_code == 400
    assert r.json() == vllm_error(
        "Stream options can only be defined when `stream=True`. (parameter=stream_options)",
        "BadRequestError",
        400,
        "stream_options",
    )


def test_vllm_answers_one_choice_per_prompt(start: Start, client: httpx.Client) -> None:
    """A list of strings or of token lists is one engine prompt each, one choice each."""
    emu = start(EngineKind.VLLM)
    url = at(emu, "/v1/completions")
    r = client.post(url, json={"prompt": ["a", "b c"], "max_tokens": 1}).json()
    assert [c["index"] for c in r["choices"]] == [0, 1]
    assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    r = client.post(url, json={"prompt": [5, 6, 7], "max_tokens": 1}).json()
    assert len(r["choices"]) == 1 and r["usage"]["prompt_tokens"] == 3
    r = client.post(url, json={"prompt": [[5], [6, 7]], "max_tokens": 1}).json()
    assert len(r["choices"]) == 2


def test_vllm_refuses_an_empty_token_prompt(start: Start, client: httpx.Client) -> None:
    """``InputProcessor._validate_prompt_len``: 400 when not streaming; inside the 200
    stream (``completion_stream_generator``) when streaming."""
    emu = start(EngineKind.VLLM)
    url = at(emu, "/v1/completions")
    expected = vllm_error("The decoder prompt cannot be empty", "BadRequestError", 400, None)
    r = client.post(url, json={"prompt": [], "max_tokens": 1})
    assert r.status_code == 400 and r.json() == expected
    r = client.post(url, json={"prompt": [], "max_tokens": 1, "stream": True})
    assert r.status_code == 200
    assert r.text == f"data: {json.dumps(expected)}\n\ndata: [DONE]\n\n"


def test_vllm_route_and_method_errors_are_fastapis(start: Start, client: httpx.Client) -> None:
    emu = start(EngineKind.VLLM)
    r = client.get(at(emu, "/v1/completions"))
    assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"})
    r = client.post(at(emu, "/generate"), json={"text": "x"})
    assert (r.status_code, r.json()) == (404, {"detail": "Not Found"})


# ======================================================================== SGLang 0.5.21


def sglang_invalid(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """SGLang's validation answer: the flat ErrorResponse, message ``str(exc) errors``."""
    label = "error" if len(errors) == 1 else "errors"
    text = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
    # FastAPI names the first line of the decorated definition (``inspect.getsourcelines``):
    # ``@app.api_route(`` at line 910 of 0.5.21's http_server.py (the ``def`` is at 915).
    endpoint = (
        '\n  File "sglang/srt/entrypoints/http_server.py", line 910, in generate_request'
        "\n    POST /generate"
    )
    return {
        "object": "error",
        "message": f"{(text + endpoint).rstrip()} {errors}",
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }


ONE = {"max_new_tokens": 1}


def test_sglang_meta_info_id_is_the_rid_even_empty(start: Start, client: httpx.Client) -> None:
    emu = start(EngineKind.SGLANG)
    url = at(emu, "/generate")
    for rid in ("gpustack-qualify-1", ""):
        r = client.post(url, json={"text": "x", "rid": rid, "sampling_params": ONE})
        assert r.status_code == 200 and r.json()["meta_info"]["id"] == rid
    generated = client.post(url, json={"text": "x", "rid": None, "sampling_params": ONE})
    assert len(generated.json()["meta_info"]["id"]) == 32
    # The default budget is SamplingParams.max_new_tokens, 128.
    r = client.post(url, json={"text": "x", "emulate_seconds": 0})
    assert r.json()["meta_info"]["completion_tokens"] == 128


@pytest.mark.parametrize(
    ("field", "value", "errors"),
    [
        (
            "rid",
            5,
            [
                {
                    "type": "string_type",
                    "loc": ("body", "rid", "str"),
                    "msg": "Input should be a valid string",
                    "input": 5,
                },
                {
                    "type": "list_type",
                    "loc": ("body", "rid", "list[str]"),
                    "msg": "Input should be a valid list",
                    "input": 5,
                },
            ],
        ),
        (
            "text",
            5,
            [
                {
                    "type": "list_type",
                    "loc": ("body", "text", "list[str]"),
                    "msg": "Input should be a valid list",
                    "input": 5,
                },
                {
                    "type": "string_type",
                    "loc": ("body", "text", "str"),
                    "msg": "Input should be a valid string",
                    "input": 5,
                },
            ],
        ),
    ],
)
def test_sglang_refuses_a_rid_or_text_of_the_wrong_type(
    start: Start, client: httpx.Client, field: str, value: Any, errors: list[dict[str, Any]]
) -> None:
    """``GenerateReqInput.rid: str | list[str] | None``: a number is refused, not coerced."""
    emu = start(EngineKind.SGLANG)
    body = {"text": "x", "sampling_params": ONE, field: value}
    r = client.post(at(emu, "/generate"), json=body)
    assert r.status_code == 400 and r.json() == sglang_invalid(errors)


@pytest.mark.parametrize(
    ("content", "headers", "errors"),
    [
        (
            b'{"text": "x"}',
            {},
            [
                {
                    "type": "dataclass_type",
                    "loc": ("body",),
                    "msg": "Input should be a dictionary or an instance of GenerateReqInput",
                    "input": b'{"text": "x"}',
                    "ctx": {"class_name": "GenerateReqInput"},
                }
            ],
        ),
        (
            b"{not json",
            {"Content-Type": "application/json"},
            [
                {
                    "type": "json_invalid",
                    "loc": ("body", 1),
                    "msg": "JSON decode error",
                    "input": {},
                    "ctx": {"error": "Expecting property name enclosed in double quotes"},
                }
            ],
        ),
        (
            b"",
            {"Content-Type": "application/json"},
            [{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}],
        ),
    ],
    ids=["no-content-type", "bad-json", "empty"],
)
def test_sglang_refuses_a_body_that_is_not_a_json_object(
    start: Start,
    client: httpx.Client,
    content: bytes,
    headers: dict[str, str],
    errors: list[dict[str, Any]],
) -> None:
    emu = start(EngineKind.SGLANG)
    r = client.post(at(emu, "/generate"), content=content, headers=headers)
    assert r.status_code == 400 and r.json() == sglang_invalid(errors)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"sampling_params": ONE}, "Either text, input_ids or input_embeds should be provided."),
        ({"input_ids": []}, "input_ids cannot be empty."),
        (
            {"text": "x", "sampling_params": {"max_new_tokens": -1}},
            "max_new_tokens must be at least 0, got -1.",
        ),
        (
            {"text": ["a", "b"], "rid": ["only-one"]},
            "The specified rids length mismatch with the batch_size for batch processing.",
        ),
        (
            {"text": ["a", "b"], "rid": ["r", "r"]},
            "Duplicate request IDs detected within the request: ['r']",
        ),
    ],
    ids=["no-input", "empty-input-ids", "negative-budget", "rid-count", "rid-twice"],
)
def test_sglang_refuses_what_its_tokenizer_manager_refuses(
    start: Start, client: httpx.Client, body: dict[str, Any], message: str
) -> None:
    """A ``ValueError`` in ``TokenizerManager.generate_request``: 400
    ``{"error": {"message": ...}}`` (``_create_error_response``)."""
    emu = start(EngineKind.SGLANG)
    r = client.post(at(emu, "/generate"), json=body)
    assert r.status_code == 400 and r.json() == {"error": {"message": message}}
    assert (emu.completed, emu.in_flight) == (0, 0)


@pytest.mark.parametrize(
    "body",
    [
        {"text": "x", "rid": ["a"]},
        {"text": "x", "sampling_params": {"max_new_token": 1}},
        {"text": "x", "sampling_params": {"max_new_tokens": "1"}},
        {"text": "x", "sampling_params": [ONE]},
    ],
    ids=["single-with-rid-list", "unknown-key", "budget-not-a-number", "params-list"],
)
def test_sglang_fails_with_500_where_its_code_raises_a_type_error(
    start: Start, client: httpx.Client, body: dict[str, Any]
) -> None:
    emu = start(EngineKind.SGLANG)
    r = client.post(at(emu, "/generate"), json=body)
    assert (r.status_code, r.text) == (500, "Internal Server Error")
    assert r.headers["content-type"].startswith("text/plain")


def test_sglang_answers_a_batch_with_a_list(start: Start, client: httpx.Client) -> None:
    emu = start(EngineKind.SGLANG)
    url = at(emu, "/generate")
    r = client.post(url, json={"text": ["a", "b c"], "rid": "q", "sampling_params": ONE})
    assert r.status_code == 200 and isinstance(r.json(), list)
    assert [o["meta_info"]["id"] for o in r.json()] == ["q_0", "q_1"]
    assert [o["meta_info"]["prompt_tokens"] for o in r.json()] == [1, 2]
    r = client.post(url, json={"input_ids": [[1], [2]], "rid": ["x", "y"], "sampling_params": ONE})
    assert [o["meta_info"]["id"] for o in r.json()] == ["x", "y"]
    r = client.post(url, json={"text": ["a"], "stream": True, "sampling_params": ONE})
    events = [line for line in r.text.split("\n\n") if line.startswith("data: {")]
    assert [json.loads(e[len("data: ") :])["index"] for e in events] == [0]


def test_sglang_refuses_a_rid_already_in_flight(start: Start, client: httpx.Client) -> None:
    """``TokenizerManager._init_req_state``: ``Duplicate request ID detected``; the id is
    free again once the first request has finished."""
    emu = start(EngineKind.SGLANG)
    url = at(emu, "/generate")
    body = {"text": "x", "rid": "held", "sampling_params": {"max_new_tokens": 4}}
    answers: list[httpx.Response] = []

    def long_request() -> None:
        with httpx.Client(trust_env=False, timeout=5.0) as c:
            answers.append(c.post(url, json={**body, "emulate_seconds": 1.0}))

    thread = threading.Thread(target=long_request, daemon=True)
    thread.start()
    assert eventually(lambda: emu.in_flight == 1, timeout=3.0, interval=0.01)
    r = client.post(url, json={**body, "sampling_params": ONE})
    assert r.status_code == 400
    assert r.json() == {"error": {"message": "Duplicate request ID detected: held"}}
    thread.join(5.0)
    assert answers[0].status_code == 200
    assert client.post(url, json={**body, "sampling_params": ONE}).status_code == 200


def test_sglang_generate_takes_put_and_not_get(start: Start, client: httpx.Client) -> None:
    emu = start(EngineKind.SGLANG)
    r = client.put(at(emu, "/generate"), json={"text": "x", "rid": "p", "sampling_params": ONE})
    assert r.status_code == 200 and r.json()["meta_info"]["id"] == "p"
    r = client.get(at(emu, "/generate"))
    assert (r.status_code, r.json()) == (405, {"detail": "Method Not Allowed"})


def test_sglang_parallel_sampling_is_not_emulated(start: Start, client: httpx.Client) -> None:
    """SGLang would answer ``n`` > 1 with a list under fresh ids; the emulator says it does
    not emulate that rather than answer something else."""
    emu = start(EngineKind.SGLANG)
    r = client.post(at(emu, "/generate"), json={"text": "x", "sampling_params": {"n": 2}})
    assert r.status_code == 501 and "not emulated" in r.json()["error"]["message"]
