"""The engine API's request handling: OpenAI ``/v1/completions`` and
``/v1/chat/completions`` (both engines), SGLang's native ``/generate``, and the small
model/server info answers.

Response shapes, ids and streaming follow the real engines, so routers and load
generators in the bed cannot tell the difference. Time and accounting are the engine's:
each handler asks it to admit the request and then spends the request's duration through
what it hands back, which is where stops and restarts cut a request.

The ``model`` of an OpenAI request is checked as strictly as the real engines check it
(vLLM 0.2x ``OpenAIServing._check_model``/``_is_model_supported``; SGLang's Python HTTP
server):

- vLLM: a missing, null or empty ``model`` is served by the first served model name; any
  other name that is not one of the served names is refused before the request is admitted,
  with 404 and ``{"error": {"message": "The model `x` does not exist.", "type":
  "NotFoundError", "param": "model", "code": 404}}``. The response's ``model`` is always
  the first served name.
- SGLang: ``/v1/completions`` and ``/v1/chat/completions`` do not check the name; a
  missing ``model`` reads as ``"default"`` and the response echoes what was asked.
  ``GET /v1/models/{name}`` does check: 404 with an ``invalid_request_error`` /
  ``model_not_found`` body for a name it does not serve. ``/generate`` has no model.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

from testbed.emulator.fields import int_field, seconds_field
from testbed.emulator.spec import SGLANG_DEFAULT_MODEL, EngineKind
from testbed.emulator.wire import (
    BadRequest,
    Handler,
    end_stream,
    read_json,
    send_json,
    start_stream,
    write_event,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "Engine",
    "Spend",
    "completions",
    "generate",
    "model_card",
    "model_info",
    "model_not_found",
    "models_list",
    "server_info",
]

DEFAULT_MAX_TOKENS = 16
"""Tokens generated when a request does not say how many."""


class Spend(Protocol):
    """Spends an admitted request's duration in ``pieces``, calling ``on_piece`` after each."""

    def __call__(self, pieces: int, on_piece: Callable[[int], None] | None = None) -> None:
        """Sleep one share per piece; raises the engine's cut when it stops."""


class Engine(Protocol):
    """What the request handlers need from the engine they answer for."""

    engine: EngineKind

    @property
    def request_seconds(self) -> float:
        """The default duration of a new request."""

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The names the engine serves its model under (``--served-model-name``)."""

    def admitted(
        self, *, prompt_tokens: int, generation_tokens: int, duration: float
    ) -> AbstractContextManager[Spend]:
        """Admit a request and count it as running while the block runs."""


def _count_tokens(value: Any) -> int:
    """A rough token count of a prompt: words of text, or the length of a token list."""
    if isinstance(value, str):
        return max(1, len(value.split()))
    if isinstance(value, list):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return max(1, len(value))
        return max(1, sum(_count_tokens(v) for v in value))
    if isinstance(value, dict):
        return _count_tokens(value.get("content", ""))
    return 1


def _split_text(tokens: int, pieces: int) -> list[str]:
    """``tokens`` emulated words split into ``pieces`` consecutive strings."""
    words = [" ok"] if tokens <= 1 else [f" w{i}" for i in range(tokens)]
    out: list[str] = []
    for index in range(pieces):
        lo = len(words) * index // pieces
        hi = len(words) * (index + 1) // pieces
        out.append("".join(words[lo:hi]))
    return out


def _duration(engine: Engine, body: dict[str, Any], generation_tokens: int) -> float:
    """How long a request takes: 0 for a 1-token request, else emulate_seconds/default."""
    override = seconds_field(body, "emulate_seconds")
    if generation_tokens <= 1:
        return 0.0
    if override is not None:
        return override
    return engine.request_seconds


def _run_request(
    engine: Engine,
    handler: Handler,
    *,
    stream: bool,
    pieces: int,
    prompt_tokens: int,
    generation_tokens: int,
    duration: float,
    partial: Callable[[int], Any],
) -> None:
    """Admit the request and spend its duration; when streaming, open the SSE response
    and send ``partial(index)`` after every piece but the last (the caller sends the last,
    after the request has left the engine's accounting)."""
    with engine.admitted(
        prompt_tokens=prompt_tokens, generation_tokens=generation_tokens, duration=duration
    ) as spend:
        if stream:
            start_stream(handler)

            def on_piece(index: int) -> None:
                if index < pieces - 1:
                    write_event(handler, partial(index))

            spend(pieces, on_piece)
        else:
            spend(1)


MAX_MODEL_LEN = 4096
"""The context length the emulated model reports."""


def model_card(*, kind: EngineKind, name: str, model_path: str, created: float) -> dict[str, Any]:
    """One ``/v1/models`` entry (vLLM's ``ModelCard``, or SGLang's smaller one)."""
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": int(created),
        "owned_by": "sglang" if kind is EngineKind.SGLANG else "vllm",
        "root": model_path,
        "max_model_len": MAX_MODEL_LEN,
    }
    if kind is EngineKind.VLLM:
        card["parent"] = None
        card["permission"] = [
            {
                "id": f"modelperm-{secrets.token_hex(16)}",
                "object": "model_permission",
                "created": int(created),
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ]
    return card


def models_list(
    *, kind: EngineKind, served: tuple[str, ...], model_path: str, created: float
) -> dict[str, Any]:
    """The ``/v1/models`` answer: one card per served name, in order."""
    return {
        "object": "list",
        "data": [
            model_card(kind=kind, name=n, model_path=model_path, created=created) for n in served
        ],
    }


def model_not_found(kind: EngineKind, model: str) -> dict[str, Any]:
    """The 404 body for a model the engine does not serve (each engine's own wording)."""
    if kind is EngineKind.VLLM:
        return {
            "error": {
                "message": f"The model `{model}` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }
    return {
        "error": {
            "message": f"The model '{model}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }


def model_info(*, model_path: str) -> dict[str, Any]:
    """The ``/get_model_info`` answer."""
    return {"model_path": model_path, "tokenizer_path": model_path, "is_generation": True}


def server_info(*, dp_ranks: int, model_path: str, served: tuple[str, ...]) -> dict[str, Any]:
    """The ``/get_server_info`` (``/server_info``) answer."""
    return {
        "model_path": model_path,
        "served_model_name": served[0],
        "dp_size": dp_ranks,
        "version": "emulated",
    }


def _response_model(engine: Engine, body: dict[str, Any]) -> str | None:
    """The ``model`` the response names, or None when the engine refuses the one asked
    for (vLLM only; see the module docstring)."""
    requested = body.get("model")
    if requested is not None and not isinstance(requested, str):
        raise BadRequest("model must be a string")
    served = engine.served_model_names
    if engine.engine is EngineKind.VLLM:
        if requested and requested not in served:
            return None
        return served[0]
    return SGLANG_DEFAULT_MODEL if requested is None else requested


def completions(engine: Engine, handler: Handler, *, chat: bool) -> None:
    """OpenAI ``/v1/completions`` and ``/v1/chat/completions``."""
    body = read_json(handler)
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("messages must be a non-empty list")
        prompt_tokens = _count_tokens(messages)
        max_tokens = int_field(
            body, "max_completion_tokens", int_field(body, "max_tokens", DEFAULT_MAX_TOKENS)
        )
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise BadRequest("prompt must be a string or a list")
        prompt_tokens = _count_tokens(prompt)
        max_tokens = int_field(body, "max_tokens", DEFAULT_MAX_TOKENS)
    stream = bool(body.get("stream", False))
    model = _response_model(engine, body)
    if model is None:
        send_json(handler, 404, model_not_found(engine.engine, str(body.get("model"))))
        return
    header_rid = handler.headers.get("X-Request-Id")
    body_rid = body.get("request_id")
    if engine.engine is EngineKind.VLLM:
        rid = header_rid or (body_rid if isinstance(body_rid, str) and body_rid else None)
        prefix = "chatcmpl-" if chat else "cmpl-"
        resp_id = prefix + (rid or secrets.token_hex(16))
    else:
        srid = body.get("rid")
        resp_id = srid if isinstance(srid, str) and srid else secrets.token_hex(16)
    duration = _duration(engine, body, max_tokens)
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens,
        "total_tokens": prompt_tokens + max_tokens,
    }
    pieces = max(1, min(max_tokens, 8)) if stream else 1
    texts = _split_text(max_tokens, pieces)

    def choice(text: str, final: bool, delta: bool) -> dict[str, Any]:
        reason = "length" if final else None
        if chat:
            key = "delta" if delta else "message"
            return {
                "index": 0,
                key: {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
            }
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    def chunk(payload: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": resp_id,
            "object": obj + (".chunk" if chat else ""),
            "created": created,
            "model": model,
            **payload,
        }

    _run_request(
        engine,
        handler,
        stream=stream,
        pieces=pieces,
        prompt_tokens=prompt_tokens,
        generation_tokens=max_tokens,
        duration=duration,
        partial=lambda index: chunk({"choices": [choice(texts[index], final=False, delta=True)]}),
    )
    if not stream:
        send_json(
            handler,
            200,
            {
                "id": resp_id,
                "object": obj,
                "created": created,
                "model": model,
                "choices": [choice("".join(texts), final=True, delta=False)],
                "usage": usage,
            },
        )
        return
    last: dict[str, Any] = {"choices": [choice(texts[-1], final=True, delta=True)]}
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        last["usage"] = usage
    write_event(handler, chunk(last))
    end_stream(handler)


def generate(engine: Engine, handler: Handler) -> None:
    """SGLang native ``/generate``."""
    body = read_json(handler)
    if "text" in body:
        text = body["text"]
        if not isinstance(text, str):
            raise BadRequest("text must be a string (batches are not emulated)")
        prompt_tokens = _count_tokens(text)
    elif isinstance(body.get("input_ids"), list):
        prompt_tokens = _count_tokens(body["input_ids"])
    else:
        raise BadRequest("text or input_ids is required")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    max_new = int_field(params, "max_new_tokens", DEFAULT_MAX_TOKENS)
    srid = body.get("rid")
    rid = srid if isinstance(srid, str) and srid else secrets.token_hex(16)
    stream = bool(body.get("stream", False))
    duration = _duration(engine, body, max_new)
    pieces = max(1, min(max_new, 8)) if stream else 1
    texts = _split_text(max_new, pieces)
    started = time.monotonic()

    def result(upto: int, final: bool) -> dict[str, Any]:
        done = max_new if final else max(1, max_new * upto // pieces)
        return {
            "text": "".join(texts[:upto]),
            "meta_info": {
                "id": rid,
                "finish_reason": {"type": "length", "length": max_new} if final else None,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": done,
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - started,
            },
        }

    _run_request(
        engine,
        handler,
        stream=stream,
        pieces=pieces,
        prompt_tokens=prompt_tokens,
        generation_tokens=max_new,
        duration=duration,
        partial=lambda index: result(index + 1, final=False),
    )
    if stream:
        write_event(handler, result(pieces, final=True))
        end_stream(handler)
    else:
        send_json(handler, 200, result(pieces, final=True))
