"""The engine API's request handling: OpenAI ``/v1/completions`` and
``/v1/chat/completions`` (both engines), SGLang's native ``/generate``, and the small
model/server info answers.

Response shapes, ids and streaming follow the real engines, so routers and load
generators in the bed cannot tell the difference. Time and accounting are the engine's:
each handler asks it to admit the request and then spends the request's duration through
what it hands back, which is where stops and restarts cut a request.

The routes the identity probe uses (``activities/probes.py``) are read, and refused, as the
versions the bed declares do: vLLM 0.29.0's ``/v1/completions`` (and its chat route) and
SGLang 0.5.21's ``/generate``. :mod:`testbed.emulator.intake` has the rules, each citing the
real source: Content-Type, JSON, field types, the ``model`` check (vLLM: a name that is not
a served name is refused with 404 ``The model `x` does not exist.``; none, null or empty is
the first served name, which every response names), token limits, request ids (vLLM:
``cmpl-`` + the ``X-Request-Id`` header, else the body's ``request_id``; SGLang:
``meta_info.id`` is ``rid``, ``rid_<i>`` in a batch) and SGLang's refusal of an id already
in flight.

SGLang's OpenAI routes are not probe routes and are read as before: they do not check the
name; a missing ``model`` reads as ``"default"`` and the response echoes what was asked.
``GET /v1/models/{name}`` does check: 404 with an ``invalid_request_error`` /
``model_not_found`` body for a name it does not serve.
"""

from __future__ import annotations

import secrets
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from testbed.emulator import intake
from testbed.emulator.fields import int_field, seconds_field
from testbed.emulator.spec import SGLANG_DEFAULT_MODEL, EngineKind
from testbed.emulator.wire import (
    BadRequest,
    Handler,
    StreamWriter,
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
        self,
        *,
        prompt_tokens: int,
        generation_tokens: int,
        duration: float,
        stream: bool = False,
        connection: socket.socket | None = None,
    ) -> AbstractContextManager[Spend]:
        """Admit a request and count it as running while the block runs."""

    def server_load(self, handler: Handler) -> AbstractContextManager[Callable[[], None]]:
        """vLLM's ``load_aware_call`` around a handler: yields ``entered``, to call once
        the request passed FastAPI's validation."""

    def claim_rids(self, rids: list[str]) -> str | None:
        """Hold these request ids as in flight; the first one already held instead."""

    def release_rids(self, rids: list[str]) -> None:
        """Let go of request ids held by :meth:`claim_rids`."""


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
    if tokens <= 0:
        return [""] * pieces
    words = [" ok"] if tokens == 1 else [f" w{i}" for i in range(tokens)]
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
    partial: Callable[[int], list[Any]],
    finals: Callable[[], list[Any]],
) -> None:
    """Admit the request and spend its duration. When streaming, open the SSE response,
    queue the events ``partial(index)`` after every piece but the last, then, once the
    request has left the engine's accounting, ``finals()``, ``data: [DONE]`` and the last
    chunk, and return when they were written (:class:`StreamWriter`: the engine never waits
    for the client). Not streaming, the caller writes the answer."""
    writer: StreamWriter | None = None
    try:
        with engine.admitted(
            prompt_tokens=prompt_tokens,
            generation_tokens=generation_tokens,
            duration=duration,
            stream=stream,
            connection=handler.connection,
        ) as spend:
            if stream:
                start_stream(handler)
                writer = StreamWriter(handler)

                def on_piece(index: int) -> None:
                    if writer is not None and index < pieces - 1:
                        writer.put(*partial(index))

                spend(pieces, on_piece)
            else:
                spend(1)
        if writer is not None:
            writer.put(*finals())
            writer.finish()
    finally:
        if writer is not None:
            writer.abandon()


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


def _sglang_openai_model(body: dict[str, Any]) -> str:
    """SGLang's OpenAI routes do not check ``model``; a missing one reads as ``default``."""
    requested = body.get("model")
    if requested is not None and not isinstance(requested, str):
        raise BadRequest("model must be a string")
    return SGLANG_DEFAULT_MODEL if requested is None else requested


@dataclass(frozen=True)
class _OpenAICall:
    """An accepted OpenAI request, as the answer is built from it."""

    resp_id: str
    model: str
    prompt_tokens: list[int]
    max_tokens: int
    stream: bool
    include_usage: bool
    raw: dict[str, Any]
    empty_prompt: bool = False


def _vllm_openai_call(
    engine: Engine, handler: Handler, *, chat: bool, entered: Callable[[], None]
) -> _OpenAICall:
    """A vLLM OpenAI request, read and refused as :func:`intake.vllm_call` says."""
    call = intake.vllm_call(handler, chat=chat, served=engine.served_model_names, entered=entered)
    counts = [_count_tokens(call.messages)] if chat else [_count_tokens(p) for p in call.prompts]
    return _OpenAICall(
        resp_id=call.resp_id,
        model=call.model,
        prompt_tokens=counts,
        max_tokens=DEFAULT_MAX_TOKENS if call.max_tokens is None else call.max_tokens,
        stream=call.stream,
        include_usage=call.include_usage,
        raw=call.raw,
        empty_prompt=any(isinstance(p, list) and not p for p in call.prompts),
    )


def _sglang_openai_call(handler: Handler, *, chat: bool) -> _OpenAICall:
    """An OpenAI request to SGLang, read as the emulator always has (not a probe route;
    see the module docstring)."""
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
    model = _sglang_openai_model(body)
    srid = body.get("rid")
    options = body.get("stream_options")
    stream = bool(body.get("stream", False))
    return _OpenAICall(
        resp_id=srid if isinstance(srid, str) and srid else secrets.token_hex(16),
        model=model,
        prompt_tokens=[prompt_tokens],
        max_tokens=max_tokens,
        stream=stream,
        include_usage=stream and isinstance(options, dict) and bool(options.get("include_usage")),
        raw=body,
    )


def completions(engine: Engine, handler: Handler, *, chat: bool) -> None:
    """OpenAI ``/v1/completions`` and ``/v1/chat/completions``.

    vLLM reads and refuses the request as vLLM 0.29.0 does (:func:`intake.vllm_call`,
    where each rule cites its source); the answer has one choice per prompt (a list of
    strings or of token lists is several prompts: ``OpenAIServingCompletion``), and a
    stream that asked for usage ends with a usage chunk whose ``choices`` is empty
    (``completion_stream_generator``). A chat without a token limit is given
    :data:`DEFAULT_MAX_TOKENS` (vLLM would allow the rest of the context).

    vLLM's handler runs inside its ``load_aware_call`` (:meth:`Engine.server_load`): from
    the end of FastAPI's validation until the answer's last byte was written.
    """
    if engine.engine is EngineKind.VLLM:
        with engine.server_load(handler) as entered:
            _answer(
                engine,
                handler,
                _vllm_openai_call(engine, handler, chat=chat, entered=entered),
                chat=chat,
            )
        return
    _answer(engine, handler, _sglang_openai_call(handler, chat=chat), chat=chat)


def _answer(engine: Engine, handler: Handler, call: _OpenAICall, *, chat: bool) -> None:
    """Run an accepted OpenAI request and write its answer (see :func:`completions`)."""
    if call.empty_prompt:
        refusal = intake.vllm_empty_prompt()
        if not call.stream:
            raise refusal
        start_stream(handler)
        write_event(handler, refusal.body)
        end_stream(handler)
        return
    max_tokens = call.max_tokens
    prompt_tokens = sum(call.prompt_tokens)
    choices_n = len(call.prompt_tokens)
    duration = _duration(engine, call.raw, max_tokens)
    created = int(time.time())
    obj = "chat.completion" if chat else "text_completion"
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": max_tokens * choices_n,
        "total_tokens": prompt_tokens + max_tokens * choices_n,
    }
    pieces = max(1, min(max_tokens, 8)) if call.stream else 1
    texts = _split_text(max_tokens, pieces)
    # Why the answer stopped: vLLM's ``stop_reason``, SGLang's ``matched_stop`` (None here).
    stop_key = "stop_reason" if engine.engine is EngineKind.VLLM else "matched_stop"

    def choice(index: int, text: str, final: bool, delta: bool) -> dict[str, Any]:
        reason = "length" if final else None
        if chat:
            key = "delta" if delta else "message"
            return {
                "index": index,
                key: {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": reason,
                stop_key: None,
            }
        return {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": reason,
            stop_key: None,
        }

    def chunk(payload: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": call.resp_id,
            "object": obj + (".chunk" if chat else ""),
            "created": created,
            "model": call.model,
            **payload,
        }

    def partial(piece: int) -> list[dict[str, Any]]:
        return [
            chunk({"choices": [choice(i, texts[piece], final=False, delta=True)]})
            for i in range(choices_n)
        ]

    def finals() -> list[dict[str, Any]]:
        events = [
            chunk({"choices": [choice(i, texts[-1], final=True, delta=True)]})
            for i in range(choices_n)
        ]
        if call.include_usage:
            events.append(chunk({"choices": [], "usage": usage}))
        return events

    _run_request(
        engine,
        handler,
        stream=call.stream,
        pieces=pieces,
        prompt_tokens=prompt_tokens,
        generation_tokens=max_tokens * choices_n,
        duration=duration,
        partial=partial,
        finals=finals,
    )
    if not call.stream:
        send_json(
            handler,
            200,
            {
                "id": call.resp_id,
                "object": obj,
                "created": created,
                "model": call.model,
                "choices": [
                    choice(i, "".join(texts), final=True, delta=False) for i in range(choices_n)
                ],
                "usage": usage,
            },
        )


def generate(engine: Engine, handler: Handler) -> None:
    """SGLang native ``/generate``: read and refused as SGLang 0.5.21 does
    (:func:`intake.sglang_generate`, where each rule cites its source). A single request is
    answered with one object, a batch with a list (streamed: one event per item and piece,
    each with its ``index``, as ``TokenizerManager._stream_batch_responses`` does). A
    request without a token limit (``max_new_tokens: null``) runs to the context length."""
    call = intake.sglang_generate(handler, claim=engine.claim_rids, release=engine.release_rids)
    rids = [item.rid for item in call.items]
    try:
        _generate(engine, handler, call)
    finally:
        engine.release_rids(rids)


def _generate(engine: Engine, handler: Handler, call: intake.SglangGenerate) -> None:
    """Answer an accepted ``/generate`` (see :func:`generate`)."""
    prompt_tokens = [_count_tokens(item.prompt) for item in call.items]
    budgets = [
        item.max_new_tokens if item.max_new_tokens is not None else max(0, MAX_MODEL_LEN - tokens)
        for item, tokens in zip(call.items, prompt_tokens, strict=True)
    ]
    longest = max(budgets, default=0)
    duration = _duration(engine, call.raw, longest)
    pieces = max(1, min(longest, 8)) if call.stream else 1
    started = time.monotonic()

    def result(index: int, upto: int, final: bool) -> dict[str, Any]:
        max_new = budgets[index]
        texts = _split_text(max_new, pieces)
        done = max_new if final else max(1, max_new * upto // pieces) if max_new else 0
        out: dict[str, Any] = {
            "text": "".join(texts[:upto]),
            "meta_info": {
                "id": call.items[index].rid,
                "finish_reason": {"type": "length", "length": max_new} if final else None,
                "prompt_tokens": prompt_tokens[index],
                "completion_tokens": done,
                "cached_tokens": 0,
                "e2e_latency": time.monotonic() - started,
            },
        }
        if call.stream and not call.single:
            out["index"] = index
        return out

    def partial(piece: int) -> list[dict[str, Any]]:
        return [result(i, piece + 1, final=False) for i in range(len(call.items))]

    def finals() -> list[dict[str, Any]]:
        return [result(i, pieces, final=True) for i in range(len(call.items))]

    _run_request(
        engine,
        handler,
        stream=call.stream,
        pieces=pieces,
        prompt_tokens=sum(prompt_tokens),
        generation_tokens=sum(budgets),
        duration=duration,
        partial=partial,
        finals=finals,
    )
    if call.stream:
        return
    answers = finals()
    send_json(handler, 200, answers[0] if call.single else answers)
