"""Bad Update, signal and start payloads, retry tokens and the retry annotation: each is
refused with a validation error (or a ValueError saying why), through pydantic and through
the workflow's pydantic data converter decoding the raw JSON payload."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import pydantic_data_converter

from retirement.intents import PodView, RoleSpec, derive_intents
from retirement.models import (
    AbortRequest,
    CancelIntent,
    RetirementRequest,
    RetryRequest,
)
from retirement.names import LABEL_COMPONENT, LABEL_ORDINAL
from retirement.retry import ROLE_RE, TOKEN_RE, parse_retry_annotation, validate_token
from tests.corpus.cases import PAYLOADS, RETRY_ANNOTATIONS, RETRY_TOKENS, ROLE_NAMES, params

MODELS: dict[str, type[BaseModel]] = {
    m.__name__: m for m in (AbortRequest, RetryRequest, CancelIntent, RetirementRequest)
}


def decode(model: type[BaseModel], raw: bytes) -> Any:
    """Decode a raw JSON payload the way the worker decodes an Update or signal argument."""
    payload = Payload(metadata={"encoding": b"json/plain"}, data=raw)
    return pydantic_data_converter.payload_converter.from_payloads([payload], [model])[0]


@pytest.mark.parametrize("case", params(PAYLOADS))
def test_bad_payload_is_refused_by_the_model(case: tuple[str, bytes]) -> None:
    name, raw = case
    with pytest.raises(ValidationError) as err:
        MODELS[name].model_validate_json(raw)
    assert err.value.errors() and str(err.value).strip()


@pytest.mark.parametrize("case", params(PAYLOADS))
def test_bad_payload_is_refused_by_the_data_converter(case: tuple[str, bytes]) -> None:
    name, raw = case
    with pytest.raises(ValidationError):
        decode(MODELS[name], raw)


def test_a_good_payload_decodes() -> None:
    """The corpus's bad payloads are mutations of these."""
    req = decode(
        RetirementRequest,
        b'{"namespace": "demo", "deployment": "llm", "role": "worker", "ordinal": 1}',
    )
    assert (req.role, req.ordinal) == ("worker", 1)
    assert decode(AbortRequest, b'{"reason": "on-call"}').reason == "on-call"
    assert decode(RetryRequest, b'{"token": "t-1"}').token == "t-1"


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(
    body=st.dictionaries(st.sampled_from(["reason", "token", "role", "x"]), _json, max_size=3)
    | _json
)
def test_arbitrary_json_is_a_valid_request_or_a_validation_error(body: Any) -> None:
    raw = json.dumps(body).encode()
    for model in (AbortRequest, RetryRequest, CancelIntent):
        try:
            value = decode(model, raw)
        except ValidationError:
            continue
        if isinstance(value, AbortRequest):
            assert 1 <= len(value.reason) <= 256 and value.reason.isprintable()
            assert value.reason.strip()
        elif isinstance(value, RetryRequest):
            assert TOKEN_RE.fullmatch(value.token)
        else:
            assert len(value.reason) <= 256


# ------------------------------------------------------------------ retry tokens


@pytest.mark.parametrize("token", params(RETRY_TOKENS))
def test_bad_retry_token_is_refused_with_the_rule(token: Any) -> None:
    with pytest.raises(ValueError, match="retry token is 1-63 characters"):
        validate_token(token)
    with pytest.raises(ValidationError):
        RetryRequest.model_validate({"token": token})


@settings(max_examples=300, deadline=None)
@given(token=st.text(max_size=70))
def test_an_accepted_token_is_exactly_the_documented_alphabet(token: str) -> None:
    try:
        validate_token(token)
    except ValueError:
        return
    assert TOKEN_RE.fullmatch(token) and token.isascii() and token.strip() == token


# ------------------------------------------------------------------ the retry annotation


@pytest.mark.parametrize("value", params(RETRY_ANNOTATIONS))
def test_bad_retry_annotation_is_refused_saying_why(value: str) -> None:
    with pytest.raises(ValueError, match=r"role|ordinal|token|expected"):
        parse_retry_annotation(value)


@pytest.mark.parametrize("value", ["server:01:tok", "server:00:tok", "0:00:0"])
def test_an_ordinal_with_a_leading_zero_is_refused(value: str) -> None:
    """Hypothesis found "0:00:0" accepted as ordinal 0: one annotation, two spellings."""
    with pytest.raises(ValueError, match="leading zero"):
        parse_retry_annotation(value)


@settings(max_examples=300, deadline=None)
@given(value=st.text(alphabet=st.sampled_from("worker:0123456789-._tW \n\u00b2"), max_size=24))
def test_an_accepted_annotation_round_trips(value: str) -> None:
    try:
        ann = parse_retry_annotation(value)
    except ValueError:
        return
    assert f"{ann.role}:{ann.ordinal}:{ann.token}" == value
    assert ROLE_RE.fullmatch(ann.role) and TOKEN_RE.fullmatch(ann.token)


# ------------------------------------------------------------------ hostile role names


@pytest.mark.parametrize("role", params(ROLE_NAMES))
def test_an_intent_from_a_hostile_role_label_is_refused_by_the_request_model(role: str) -> None:
    """A Pod may carry any role label; the intent derived from it must not become a
    retirement: the request model refuses it with a validation error."""
    pods = [PodView(name="p-1", labels={LABEL_COMPONENT: role, LABEL_ORDINAL: "0"})]
    intents = derive_intents([], pods)  # the role is not declared: a departed role
    assert [(i.role, i.ordinal) for i in intents] == [(role, 0)]
    with pytest.raises(ValidationError, match="role"):
        RetirementRequest(
            namespace="demo",
            deployment="llm",
            role=intents[0].role,
            ordinal=intents[0].ordinal,
            intent=intents[0].kind,
        )
    with pytest.raises(ValueError):
        parse_retry_annotation(f"{role}:0:t")


def test_role_spec_with_a_hostile_name_is_only_matched_exactly() -> None:
    pods = [PodView(name="p-1", labels={LABEL_COMPONENT: "worker", LABEL_ORDINAL: "0"})]
    assert derive_intents([RoleSpec(name="Worker", replicas=1)], pods)[0].role == "worker"
