"""What the emulated engines accept on the routes the identity probe uses (vLLM's
``POST /v1/completions``, SGLang's ``POST /generate``), and how they refuse the rest: status
codes and error bodies as the real engines send them, each rule citing the real source.

Versions emulated: the ones the bed declares (``testbed/__main__.py``): **vLLM 0.29.0** and
**SGLang 0.5.21**. Sources read, the released wheels' Python sources (PyPI):

- vLLM 0.29.0 (``vllm/_version.py``: commit ``g98dff2a81``), compared with vLLM 0.25.1
  (``g752a3a504``), the other vLLM version ``activities/probes.py`` probes;
- SGLang 0.5.21, compared with SGLang 0.5.18, the other SGLang version it probes;
- FastAPI, which both engines serve with (``fastapi/routing.py``,
  ``get_request_handler``): how the body becomes the value that is validated, with strict
  Content-Type checking, the default since FastAPI 0.132.0 (vLLM 0.29.0 requires
  ``fastapi>=0.133,<0.137``; SGLang leaves it unpinned; neither turns it off).

Fields are validated by pydantic itself (a project dependency) against models typed as the
engines type the fields the emulator reads, so lax coercions (``"3"`` for an int, ``true``
for 1) and refusals (``null`` for a ``str``) are pydantic's own, and so are the error dicts
the engines put in their messages. Status codes and body shapes are exact; a message is the
engine's template filled the same way, except what depends on the installation (SGLang's
message names the file and line of its endpoint; here they are those of 0.5.21's source).

Where the two versions differ on these routes it is said at the rule; the emulator answers
as the version the bed declares. Request fields the emulator does not model are accepted
and ignored (vLLM allows extra fields; SGLang's dataclass ignores unknown ones), which is
what the engines do with the extra fields only; a request whose *answer* the emulator does
not produce (parallel sampling, prompt embeddings, ...) is answered 501 with a
``not emulated`` message, never with a made-up success.
"""

from __future__ import annotations

import email.message
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from testbed.emulator.wire import Handler, Refused, read_body

__all__ = [
    "SGLANG_DEFAULT_MAX_NEW_TOKENS",
    "SGLANG_EMULATED",
    "VLLM_DEFAULT_MAX_TOKENS",
    "VLLM_EMULATED",
    "GenerateReqInput",
    "SglangGenerate",
    "SglangItem",
    "VllmCall",
    "duplicate_rid",
    "method_not_allowed",
    "not_emulated",
    "route_not_found",
    "sglang_generate",
    "sglang_internal_error",
    "sglang_query_invalid",
    "sglang_value_error",
    "vllm_call",
    "vllm_empty_prompt",
]

VLLM_EMULATED = "0.29.0"
SGLANG_EMULATED = "0.5.21"

VLLM_DEFAULT_MAX_TOKENS = 16
"""``CompletionRequest.max_tokens`` default (vllm/entrypoints/openai/completion/protocol.py);
an explicit ``null`` reads as it too (``normalize_null_max_tokens``)."""

SGLANG_DEFAULT_MAX_NEW_TOKENS = 128
"""``SamplingParams.max_new_tokens`` default (sglang/srt/sampling/sampling_params.py)."""

_VLLM_MAX_COMPLETION_PROMPTS = 1024
"""``VLLM_MAX_COMPLETION_PROMPTS`` default (vllm/envs.py)."""

_SGLANG_ENDPOINT = (
    '\n  File "sglang/srt/entrypoints/http_server.py", line 910, in generate_request'
    "\n    POST /generate"
)
"""FastAPI's endpoint context in ``str(RequestValidationError)`` (fastapi/exceptions.py,
``ValidationException._format_endpoint_context``; the line is
``inspect.getsourcelines(func)[1]`` (fastapi/routing.py, ``_extract_endpoint_context``), the
first line of the decorated definition: SGLang 0.5.21's ``generate_request`` starts with
its ``@app.api_route(`` at line 910 of that file (its ``def`` is at 915); the real message
names the installed path."""

_SGLANG_LOADS_ENDPOINT = (
    '\n  File "sglang/srt/entrypoints/v1_loads.py", line 96, in get_loads\n    GET /v1/loads'
)
"""The same for SGLang 0.5.21's ``get_loads`` (``@router.get("/v1/loads")`` at line 96)."""


# ---------------------------------------------------------------- answers both engines share


def route_not_found() -> Refused:
    """An unknown route: Starlette's router raises its ``HTTPException(404)`` and FastAPI's
    default handler answers ``{"detail": "Not Found"}`` (fastapi/exception_handlers.py,
    ``http_exception_handler``). vLLM and SGLang register their handlers for FastAPI's
    ``HTTPException`` subclass only, so Starlette's own 404 keeps FastAPI's shape."""
    return Refused(404, {"detail": "Not Found"})


def method_not_allowed() -> Refused:
    """A known route asked with another method (FastAPI's default handler, as above)."""
    return Refused(405, {"detail": "Method Not Allowed"})


def not_emulated(what: str) -> Refused:
    """A request the real engine would answer in a way the emulator does not produce."""
    return Refused(501, {"error": {"message": f"not emulated: {what}"}})


class _Invalid(Exception):
    """FastAPI's ``RequestValidationError`` with these errors (dicts, or the plain strings
    vLLM's ``validate_json_request`` passes)."""

    def __init__(self, errors: list[Any]) -> None:
        super().__init__(f"{len(errors)} validation errors")
        self.errors = errors


class _Unparsable(Exception):
    """A JSON body that is not text: FastAPI raises ``HTTPException(400, "There was an
    error parsing the body")`` (fastapi/routing.py, ``get_request_handler``)."""


def _fastapi_body(handler: Handler) -> Any:
    """The body as FastAPI hands it to validation (fastapi/routing.py,
    ``get_request_handler``): None when empty; the parsed JSON when the Content-Type is
    ``application/json`` or ``application/*+json``; otherwise the raw bytes (strict
    Content-Type: a body without a Content-Type is *not* parsed). Bad JSON is a
    ``json_invalid`` validation error located at the decoder's position."""
    raw = read_body(handler)
    if not raw:
        return None
    content_type = handler.headers.get("Content-Type")
    if content_type:
        message = email.message.Message()
        message["content-type"] = content_type
        subtype = message.get_content_subtype()
        if message.get_content_maintype() == "application" and (
            subtype == "json" or subtype.endswith("+json")
        ):
            try:
                return json.loads(raw)
            except json.JSONDecodeError as exc:
                raise _Invalid(
                    [
                        {
                            "type": "json_invalid",
                            "loc": ("body", exc.pos),
                            "msg": "JSON decode error",
                            "input": {},
                            "ctx": {"error": exc.msg},
                        }
                    ]
                ) from exc
            except ValueError as exc:  # not UTF-8/16/32
                raise _Unparsable from exc
    return raw


def _validate(adapter: Callable[[Any], Any], body: Any) -> Any:
    """Validate ``body`` as FastAPI does: a missing body is ``missing`` at ``body``; pydantic's
    errors are located under ``body`` (fastapi/_compat, ``_regenerate_error_with_loc``)."""
    if body is None:
        missing = {"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}
        raise _Invalid([missing])
    try:
        return adapter(body)
    except ValidationError as exc:
        errors = [
            {**err, "loc": ("body", *err.get("loc", ()))} for err in exc.errors(include_url=False)
        ]
        raise _Invalid(errors) from exc


# ---------------------------------------------------------------- vLLM 0.29.0


def _vllm_error(message: str, err_type: str, status: int, param: str | None) -> Refused:
    """vLLM's ``ErrorResponse`` (vllm/entrypoints/serve/engine/protocol.py: ``ErrorInfo``
    is ``message, type, param, code``), nested under ``error`` (since v0.10.1)."""
    return Refused(
        status, {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    )


class _VllmValidationError(Exception):
    """vLLM's ``VLLMValidationError`` (vllm/exceptions.py). In 0.29.0 it is a
    ``VLLMClientError``, *not* a ``ValueError``: raised in a pydantic validator it passes
    through pydantic untouched and the ``VLLMError`` handler answers it
    (vllm/entrypoints/serve/exception_handling: ``vllm_error_handler`` ->
    ``exception_handler`` -> ``create_error_response``): 400, ``BadRequestError``, ``param``
    the parameter, message ``str(exc)`` with ``(parameter=..., value=...)`` appended.

    vLLM 0.25.1 differs: there it *is* a ``ValueError``, so a validator's refusal became a
    pydantic error and was answered by the validation handler (type ``Bad Request``). The
    status (400) and ``param`` are the same."""

    def __init__(self, message: str, *, parameter: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def __str__(self) -> str:
        extras = []
        if self.parameter is not None:
            extras.append(f"parameter={self.parameter}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        base = super().__str__()
        return f"{base} ({', '.join(extras)})" if extras else base

    def refusal(self) -> Refused:
        return _vllm_error(str(self), "BadRequestError", 400, self.parameter)


# vllm/entrypoints/serve/exception_handling/handlers/validation.py: location segments that
# are pydantic's own (union members, wrappers), dropped from ``param``.
_PYDANTIC_LOC_MARKERS = frozenset(
    {"function-wrap", "function-after", "function-before", "function-plain", "union", "str"}
    | {"json-or-python", "lax-or-strict", "chain", "default", "nullable", "tagged-union"}
    | {"int", "float", "bool", "bytes", "list", "tuple", "dict", "set", "none", "nonetype"}
)


def _vllm_param(loc: tuple[Any, ...]) -> str:
    """``clean_loc_for_param``: the location joined with dots, without pydantic's markers
    (a segment with a bracket or parenthesis, or a schema-kind name)."""
    parts = [
        str(p)
        for p in loc
        if not any(c in str(p) for c in "[]{}()") and str(p).lower() not in _PYDANTIC_LOC_MARKERS
    ]
    return ".".join(parts) if parts else ".".join(str(p) for p in loc)


def _vllm_invalid(errors: list[Any]) -> Refused:
    """vLLM 0.29.0's ``validation_exception_handler``: 400, type ``Bad Request``, ``param``
    from the first error's location (None for vLLM's own string errors), message
    ``"N validation error(s):"`` and one indented line per error. (0.25.1 put
    ``str(exc)`` and the error list in the message instead; same status, type and param.)"""
    first = errors[0] if errors else None
    loc = first.get("loc") if isinstance(first, dict) else None
    param = _vllm_param(tuple(loc)) if loc else None
    label = "error" if len(errors) == 1 else "errors"
    message = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
    return _vllm_error(message.rstrip(), "Bad Request", 400, param)


_TokenIds = list[Annotated[int, Field(ge=0)]]


class _VllmStreamOptions(BaseModel):
    """``StreamOptions`` (vllm/entrypoints/generate/base/protocol.py)."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class _VllmRequest(BaseModel):
    """The fields of ``CompletionRequest``/``ChatCompletionRequest`` the emulator reads, typed
    as vLLM 0.29.0 types them; other fields are allowed (``OpenAIBaseModel``:
    ``extra="allow"``)."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    stream: bool | None = False
    stream_options: _VllmStreamOptions | None = None
    # ``default_factory=random_uuid``: a ``null`` is refused (it is not a ``str``).
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex)

    @model_validator(mode="before")
    @classmethod
    def _stream_options_need_stream(cls, data: Any) -> Any:
        """``validate_stream_options``."""
        if isinstance(data, dict) and data.get("stream_options") and not data.get("stream"):
            raise _VllmValidationError(
                "Stream options can only be defined when `stream=True`.",
                parameter="stream_options",
            )
        return data


class _VllmCompletion(_VllmRequest):
    """``CompletionRequest`` (vllm/entrypoints/openai/completion/protocol.py)."""

    prompt: _TokenIds | list[_TokenIds] | str | list[str] | None = None
    max_tokens: int | None = VLLM_DEFAULT_MAX_TOKENS

    # pydantic runs "before" validators last-defined first, the subclass's before the base
    # class's: as in vLLM, the prompt checks come before the stream-options check.
    @model_validator(mode="before")
    @classmethod
    def _prompt_given(cls, data: Any) -> Any:
        """``validate_prompt_and_prompt_embeds``."""
        if not isinstance(data, dict):
            return data
        prompt, embeds = data.get("prompt"), data.get("prompt_embeds")
        prompt_empty = prompt is None or prompt == ""
        embeds_empty = embeds is None or (isinstance(embeds, list) and not embeds)
        if prompt_empty and embeds_empty:
            raise _VllmValidationError(
                "Either prompt or prompt_embeds must be provided and non-empty.",
                parameter="prompt",
            )
        return data

    @model_validator(mode="before")
    @classmethod
    def _prompt_count(cls, data: Any) -> Any:
        """``validate_prompt_list_length`` (``VLLM_MAX_COMPLETION_PROMPTS``, 1024)."""
        if not isinstance(data, dict):
            return data
        prompt = data.get("prompt")
        if (
            isinstance(prompt, list)
            and prompt
            and not all(isinstance(p, int) for p in prompt)
            and len(prompt) > _VLLM_MAX_COMPLETION_PROMPTS
        ):
            raise _VllmValidationError(
                f"prompt list length {len(prompt)} exceeds the maximum allowed count of "
                f"{_VLLM_MAX_COMPLETION_PROMPTS}. To increase this limit, set the "
                "VLLM_MAX_COMPLETION_PROMPTS environment variable.",
                parameter="prompt",
            )
        return data


class _VllmChat(_VllmRequest):
    """``ChatCompletionRequest`` (vllm/entrypoints/openai/chat_completion/protocol.py):
    ``messages`` is required (a list of message objects); ``max_completion_tokens`` wins
    over the deprecated ``max_tokens``."""

    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None


@dataclass(frozen=True)
class VllmCall:
    """A completion vLLM accepted: what the emulator needs to answer it."""

    resp_id: str
    model: str
    prompts: list[str | list[int]]
    max_tokens: int | None
    stream: bool
    include_usage: bool
    messages: list[dict[str, Any]] = dc_field(default_factory=list)
    raw: dict[str, Any] = dc_field(default_factory=dict)
    """The JSON body, for the emulator's own ``emulate_seconds``."""


def vllm_call(
    handler: Handler,
    *,
    chat: bool,
    served: tuple[str, ...],
    entered: Callable[[], None] = lambda: None,
) -> VllmCall:
    """Read a vLLM ``/v1/completions`` (or chat) request as vLLM 0.29.0 does, or raise the
    :class:`Refused` it answers instead. ``entered`` is called once steps 1-3 (FastAPI's,
    before the route's handler) have passed: the handler starts there (where vLLM's
    ``load_aware_call`` counts the request). In order:

    1. the body (FastAPI): bad JSON -> 400 validation error;
    2. ``validate_json_request`` (vllm/entrypoints/serve/utils/api_utils.py), a dependency
       of the route: a media type other than ``application/json`` -> 400, message
       ``Unsupported Media Type: Only 'application/json' is allowed``, ``param`` null;
    3. the request model (pydantic): wrong types -> 400 validation error; the before-
       validators' refusals -> 400 ``BadRequestError`` (see :class:`_VllmValidationError`);
    4. ``BaseServing._check_model`` (vllm/entrypoints/serve/engine/serving.py): a ``model``
       that is set and not a served name -> 404 ``NotFoundError``; none, ``null`` or ``""``
       is the first served name (``_is_model_supported``);
    5. ``SamplingParams._verify_args`` (vllm/sampling_params.py), reached from
       ``create_completion`` -> ``to_sampling_params``: ``max_tokens`` < 1 -> 400.

    The response's id (``OpenAIServingCompletion._create_completion``) is ``cmpl-`` (chat:
    ``chatcmpl-``) + ``BaseServing._base_request_id``: the ``X-Request-Id`` header whenever
    it is present, even empty; otherwise the body's ``request_id`` (whatever string, even
    empty; a random hex uuid when absent). Its ``model`` is ``models.model_name()``, the
    first served name. Unchanged since 0.25.1.
    """
    try:
        body = _fastapi_body(handler)
        media = handler.headers.get("Content-Type", "").lower().split(";", maxsplit=1)[0]
        if media != "application/json":
            raise _Invalid(["Unsupported Media Type: Only 'application/json' is allowed"])
        model_cls: type[_VllmRequest] = _VllmChat if chat else _VllmCompletion
        req = _validate(lambda b: model_cls.model_validate(b, from_attributes=True), body)
    except _Invalid as exc:
        raise _vllm_invalid(exc.errors) from exc
    except _Unparsable as exc:
        # The HTTPException handler (vllm/entrypoints/serve/exception_handling/handlers/
        # http.py): type is the status phrase, no param.
        raise _vllm_error("There was an error parsing the body", "Bad Request", 400, None) from exc
    except _VllmValidationError as exc:
        raise exc.refusal() from exc
    entered()
    if req.model and req.model not in served:
        raise _vllm_error(f"The model `{req.model}` does not exist.", "NotFoundError", 404, "model")
    if isinstance(req, _VllmChat):
        max_tokens = (
            req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        )
        prompts: list[str | list[int]] = [""]
    else:
        assert isinstance(req, _VllmCompletion)
        max_tokens = VLLM_DEFAULT_MAX_TOKENS if req.max_tokens is None else req.max_tokens
        prompts = _vllm_prompts(req)
    if max_tokens is not None and max_tokens < 1:
        raise _VllmValidationError(
            f"max_tokens must be at least 1, got {max_tokens}.",
            parameter="max_tokens",
            value=max_tokens,
        ).refusal()
    header_rid = handler.headers.get("X-Request-Id")
    rid = header_rid if header_rid is not None else req.request_id
    options = req.stream_options
    return VllmCall(
        resp_id=("chatcmpl-" if chat else "cmpl-") + rid,
        model=served[0],
        prompts=prompts,
        max_tokens=max_tokens,
        stream=bool(req.stream),
        include_usage=bool(req.stream and options is not None and options.include_usage),
        messages=req.messages if isinstance(req, _VllmChat) else [],
        raw=body if isinstance(body, dict) else {},
    )


def _vllm_prompts(req: _VllmCompletion) -> list[str | list[int]]:
    """The engine prompts of a completion (one choice each): a string or a token list is
    one prompt; a list of strings or of token lists is one prompt per entry."""
    prompt = req.prompt
    if prompt is None:
        raise not_emulated("prompt_embeds")
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) for p in prompt):
        return [[p for p in prompt if isinstance(p, int)]]
    out: list[str | list[int]] = []
    for p in prompt:
        if p == "":
            raise not_emulated("an empty string in a prompt list (depends on the tokenizer)")
        if isinstance(p, str | list):
            out.append(p)
    return out


def vllm_empty_prompt() -> Refused:
    """A token prompt without tokens: the engine's ``InputProcessor._validate_prompt_len``
    (vllm/v1/engine/input_processor.py) raises ``VLLMValidationError("The decoder prompt
    cannot be empty")`` (no parameter) when the request is first iterated: a 400 when not
    streaming; in a stream, the same body as a ``data:`` event after the 200."""
    return _vllm_error("The decoder prompt cannot be empty", "BadRequestError", 400, None)


# ---------------------------------------------------------------- SGLang 0.5.21


def _sglang_invalid(errors: list[Any], endpoint: str = _SGLANG_ENDPOINT) -> Refused:
    """SGLang's ``validation_exception_handler`` (sglang/srt/entrypoints/http_server.py):
    400 instead of FastAPI's 422, the flat ``ErrorResponse`` (sglang/srt/entrypoints/openai/
    protocol.py: ``object, message, type, param, code``) with type ``Bad Request``, no param,
    message ``f"{str(exc)} {exc.errors()}"``. Same in 0.5.18."""
    label = "error" if len(errors) == 1 else "errors"
    text = f"{len(errors)} validation {label}:\n" + "".join(f"  {e}\n" for e in errors)
    message = f"{(text + endpoint).rstrip()} {errors}"
    return Refused(
        400,
        {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400},
    )


def sglang_query_invalid(name: str, text: str) -> Refused:
    """An integer query parameter of ``GET /v1/loads`` that is not an integer (``dp_rank``:
    ``Optional[int]``): FastAPI's ``RequestValidationError`` with pydantic's
    ``int_parsing`` error under ``("query", name)``, answered by SGLang's validation
    handler (:func:`_sglang_invalid`)."""
    error = {
        "type": "int_parsing",
        "loc": ("query", name),
        "msg": "Input should be a valid integer, unable to parse string as an integer",
        "input": text,
    }
    return _sglang_invalid([error], _SGLANG_LOADS_ENDPOINT)


def sglang_value_error(message: str) -> Refused:
    """A ``ValueError`` from ``TokenizerManager.generate_request``: ``generate_request`` in
    sglang/srt/entrypoints/http_server.py answers it with ``_create_error_response``:
    ``{"error": {"message": str(e)}}``, 400. Same in 0.5.18."""
    return Refused(400, {"error": {"message": message}})


def sglang_internal_error() -> Refused:
    """Any other exception escapes SGLang's handlers (it registers none for ``Exception``):
    Starlette's ``ServerErrorMiddleware`` answers 500 ``Internal Server Error`` as text."""
    return Refused(500, "Internal Server Error")


def _sglang_input_ids(value: Any) -> Any:
    """``validate_optional_list_i64_1d_2d`` (sglang/srt/utils/field_validators.py), the
    ``PlainValidator`` of ``GenerateReqInput.input_ids``: None, a list of ints or a list of
    lists of ints (int64)."""

    def row(v: Any) -> None:
        if v is None:
            raise ValueError("must not be None")
        if not isinstance(v, list):
            raise ValueError(f"must be list; got {type(v).__name__}")
        if v and not isinstance(v[0], int):
            raise ValueError(f"elements must be int; got {type(v[0]).__name__}")
        for x in v:
            if not isinstance(x, int) or not -(2**63) <= x < 2**63:
                raise ValueError(f"contains non-int64 element: {x!r}")

    if value is None:
        return value
    if not isinstance(value, list):
        raise ValueError(f"must be list or null; got {type(value).__name__}")
    if not value:
        return value
    if isinstance(value[0], int):
        row(value)
        return value
    if isinstance(value[0], list):
        for i, r in enumerate(value):
            try:
                row(r)
            except ValueError as e:
                raise ValueError(f"row {i}: {e}") from None
        return value
    raise ValueError(f"elements must be int or list; got {type(value[0]).__name__}")


@dataclass
class GenerateReqInput:
    """The fields of SGLang's ``GenerateReqInput`` (sglang/srt/managers/io_struct.py) the
    emulator reads, typed as 0.5.21 types them. A plain dataclass body: FastAPI validates it
    with pydantic and unknown fields are ignored."""

    rid: str | list[str] | None = dc_field(default=None, kw_only=True)
    text: list[str] | str | None = None
    input_ids: Annotated[list[list[int]] | list[int] | None, PlainValidator(_sglang_input_ids)] = (
        None
    )
    input_embeds: list[list[list[float]]] | list[list[float]] | None = None
    sampling_params: list[dict[str, Any]] | dict[str, Any] | None = None
    stream: bool = False


_GENERATE = TypeAdapter(GenerateReqInput)

# ``SamplingParams`` (sglang/srt/sampling/sampling_params.py) is a ``msgspec.Struct`` built
# with ``SamplingParams(**sampling_params)``: an unknown key is a ``TypeError`` (a 500). Its
# fields in 0.5.21 (0.5.18 has neither ``beam_width`` nor ``ebnf_full_assistant``):
_SGLANG_SAMPLING_KEYS = frozenset(
    {"max_new_tokens", "stop", "stop_token_ids", "stop_regex", "temperature", "top_p"}
    | {"top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"}
    | {"min_new_tokens", "n", "beam_width", "json_schema", "regex", "ebnf", "structural_tag"}
    | {"ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"}
    | {"stream_interval", "logit_bias", "sampling_seed", "custom_params", "stop_strs"}
    | {"stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized"}
    | {"ebnf_full_assistant"}
)


@dataclass(frozen=True)
class SglangItem:
    """One request of a ``/generate`` call: its id, prompt and token budget (None: until
    the context is full)."""

    rid: str
    prompt: str | list[int]
    max_new_tokens: int | None


@dataclass(frozen=True)
class SglangGenerate:
    """A ``/generate`` SGLang accepted: one item (``single``) or a batch."""

    single: bool
    items: list[SglangItem]
    stream: bool
    raw: dict[str, Any] = dc_field(default_factory=dict)
    """The JSON body, for the emulator's own ``emulate_seconds``."""


def sglang_generate(
    handler: Handler,
    *,
    claim: Callable[[list[str]], str | None],
    release: Callable[[list[str]], None],
) -> SglangGenerate:
    """Read SGLang's ``POST /generate`` as 0.5.21 does (0.5.18 the same on these paths), or
    raise the :class:`Refused` it answers instead. ``claim`` registers the request's ids as
    in flight (returning one already in flight instead); the caller releases them
    when the request ends, and this function does when it refuses after claiming. In order:

    1. the body (FastAPI; ``/generate`` has no Content-Type dependency, so a body that is
       not parsed as JSON is refused by the dataclass: ``dataclass_type``) and the dataclass
       fields (pydantic): 400 validation error (:func:`_sglang_invalid`); ``rid`` must be a
       string or a list of strings (a number is refused, not coerced);
    2. ``GenerateReqInput.normalize_batch_and_arguments`` (io_struct.py): no ``text``,
       ``input_ids`` or ``input_embeds`` -> 400 ``ValueError``; a list ``text`` or a list of
       token lists is a batch, whose ids are ``rid`` + ``_<i>`` for a string ``rid``, the
       given list (of the batch's length, else 400), or random hex uuids; then duplicate
       ids within the request -> 400; sampling ``n`` > 1 (parallel sampling) is not
       emulated;
    3. ``TokenizerManager._init_req_state`` (tokenizer_manager.py): a batch with fewer
       sampling-parameter objects than prompts fails indexing them (500); an id already in
       flight -> 400 ``Duplicate request ID detected: <rid>``; a single request with a list
       ``rid`` is a ``TypeError`` (a list is unhashable) -> 500;
    4. ``SamplingParams(**sampling_params)`` and ``SamplingParams.verify``: a list for a
       single request or an unknown key -> 500 (``TypeError``); ``max_new_tokens`` < 0 ->
       400; a non-number -> 500 (it is compared with 0).

    A single request's answer is one object whose ``meta_info.id`` is its ``rid``
    (``TokenizerManager._handle_batch_output``), even an empty one; a batch's is a list.
    """
    try:
        body = _fastapi_body(handler)
        req: GenerateReqInput = _validate(
            lambda b: _GENERATE.validate_python(b, from_attributes=True), body
        )
    except _Invalid as exc:
        raise _sglang_invalid(exc.errors) from exc
    except _Unparsable as exc:
        # SGLang's HTTPException handler: the flat ErrorResponse, type the status as text.
        raise Refused(
            400,
            {
                "object": "error",
                "message": "There was an error parsing the body",
                "type": "400",
                "param": None,
                "code": 400,
            },
        ) from exc
    # -- 2. normalize_batch_and_arguments
    if req.text is None and req.input_ids is None and req.input_embeds is None:
        raise sglang_value_error("Either text, input_ids or input_embeds should be provided.")
    prompts: list[str | list[int]]
    if req.text is not None:
        single = isinstance(req.text, str)
        prompts = [req.text] if isinstance(req.text, str) else list(req.text)
    elif req.input_ids is not None:
        ids: list[Any] = req.input_ids
        if not ids:
            raise sglang_value_error("input_ids cannot be empty.")
        single = isinstance(ids[0], int)
        prompts = [list(ids)] if single else [list(r) for r in ids]
    else:
        raise not_emulated("input_embeds")
    params = req.sampling_params
    if isinstance(params, list) and not params:
        raise sglang_internal_error()  # ``sampling_params[0]``: IndexError
    first = params[0] if isinstance(params, list) else (params or {})
    n, beams = first.get("n", 1), first.get("beam_width") or 1
    if not isinstance(n, int | float) or not isinstance(beams, int | float):
        raise sglang_internal_error()  # ``n > 1`` / ``beam_width > 1``: TypeError
    if n > 1 or beams > 1:
        raise not_emulated("parallel sampling or beam search")
    rids = _sglang_rids(req.rid, single=single, size=len(prompts))
    # -- 3. _init_req_state
    per_item = params if isinstance(params, list) else [params or {}] * len(prompts)
    if not single and len(per_item) < len(prompts):
        raise sglang_internal_error()  # ``obj[i]`` indexes the list: IndexError
    if single and isinstance(req.rid, list):
        raise sglang_internal_error()  # ``rid in self.rid_to_state``: TypeError
    held = claim(rids)
    if held is not None:
        raise duplicate_rid(held)
    # -- 4. SamplingParams
    try:
        if single and isinstance(params, list):
            raise sglang_internal_error()  # ``SamplingParams(**list)``: TypeError
        items = [
            SglangItem(rid, prompt, _sglang_max_new_tokens(p))
            for rid, prompt, p in zip(rids, prompts, per_item, strict=False)
        ]
    except Refused:
        release(rids)
        raise
    raw = body if isinstance(body, dict) else {}
    return SglangGenerate(single=single, items=items, stream=req.stream, raw=raw)


def _sglang_rids(rid: str | list[str] | None, *, single: bool, size: int) -> list[str]:
    """The request ids: ``_normalize_single_inputs`` / ``_normalize_rid``, then
    ``_validate_rid_uniqueness`` (io_struct.py)."""
    if single:
        ids = [uuid.uuid4().hex] if rid is None else ([rid] if isinstance(rid, str) else rid)
    elif rid is None:
        ids = [uuid.uuid4().hex for _ in range(size)]
    elif isinstance(rid, str):
        ids = [f"{rid}_{i}" for i in range(size)]
    elif len(rid) != size:
        raise sglang_value_error(
            "The specified rids length mismatch with the batch_size for batch processing."
        )
    else:
        ids = list(rid)
    if isinstance(rid, list) and len(set(rid)) != len(rid):
        dups = [r for r in dict.fromkeys(rid) if rid.count(r) > 1]
        raise sglang_value_error(f"Duplicate request IDs detected within the request: {dups}")
    return ids


def _sglang_max_new_tokens(params: dict[str, Any]) -> int | None:
    """One item's ``max_new_tokens`` as ``SamplingParams`` takes it (see step 4 above)."""
    unknown = set(params) - _SGLANG_SAMPLING_KEYS
    if unknown:
        raise sglang_internal_error()  # msgspec: Unexpected keyword argument
    value = params.get("max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS)
    if value is None:
        return None
    if not isinstance(value, int | float):
        raise sglang_internal_error()  # ``value < 0``: TypeError
    if value < 0:
        raise sglang_value_error(f"max_new_tokens must be at least 0, got {value}.")
    if isinstance(value, float):
        raise not_emulated("a fractional max_new_tokens")
    return int(value)


def duplicate_rid(rid: str) -> Refused:
    """``TokenizerManager._init_req_state``: an id already in ``rid_to_state`` (in flight)."""
    return sglang_value_error(f"Duplicate request ID detected: {rid}")
