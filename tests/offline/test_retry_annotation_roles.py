"""The retry annotation (``role:ordinal:token``) accepts exactly the role names a
``RetirementRequest`` accepts: a role whose retirement can run can be retried."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from retirement.models import RetirementRequest
from retirement.retry import ROLE_RE, parse_retry_annotation


def request_accepts(role: str) -> bool:
    try:
        RetirementRequest(namespace="demo", deployment="llm", role=role, ordinal=0)
    except ValidationError:
        return False
    return True


def annotation_accepts(role: str) -> bool:
    try:
        ann = parse_retry_annotation(f"{role}:0:t1")
    except ValueError:
        return False
    assert ann.role == role and ROLE_RE.fullmatch(role)
    return True


@pytest.mark.parametrize("role", ["llama.v2", "a.b.c", "w" * 63, "a" + ".b" * 31])
def test_a_dotted_role_a_request_accepts_can_be_retried(role: str) -> None:
    assert request_accepts(role)
    ann = parse_retry_annotation(f"{role}:3:tok-1")
    assert (ann.role, ann.ordinal, ann.token) == (role, 3, "tok-1")


@settings(max_examples=500, deadline=None)
@given(role=st.text(alphabet=st.sampled_from("ab9-.A_ \n\u00e9"), max_size=70))
@example(role="w" * 64)
@example(role="a" + ".b" * 31 + "c")
@example(role="llama.v2")
@example(role=".llama")
@example(role="llama.")
@example(role="llama\n")
@example(role="")
def test_the_annotation_and_the_request_accept_the_same_roles(role: str) -> None:
    assert annotation_accepts(role) is request_accepts(role), role
