"""Retry tokens and the retry annotation (SPEC section 7)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from retirement.names import K8S_NAME, ROLE_NAME_MAX
from retirement.text import is_decimal

TOKEN_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
#: A role name exactly as ``RetirementRequest.role`` accepts it (its pattern and bound), so
#: a role whose retirement runs can be retried ('llama.v2' too).
ROLE_RE = re.compile(rf"(?=.{{1,{ROLE_NAME_MAX}}}\Z){K8S_NAME}")


class RetryDecision(StrEnum):
    """What a retry token does."""

    REPLAY = "Replay"  # equal to the last consumed token: ignored
    NOT_ABORTED = "NotAborted"  # the retirement is not held after an abort: nothing to retry
    ACCEPT = "Accept"  # consume the token, start a fresh attempt


def validate_token(token: str) -> str:
    """Return ``token`` if well formed, else raise ValueError with the rule."""
    if not isinstance(token, str) or not TOKEN_RE.fullmatch(token):
        raise ValueError(
            "a retry token is 1-63 characters of letters, digits, '.', '_' or '-',"
            " starting with a letter or digit"
        )
    return token


def decide_retry(*, token: str, last_consumed: str | None, aborted: bool) -> RetryDecision:
    """The replay check comes before the aborted-state check."""
    if last_consumed is not None and token == last_consumed:
        return RetryDecision.REPLAY
    if not aborted:
        return RetryDecision.NOT_ABORTED
    return RetryDecision.ACCEPT


@dataclass(frozen=True)
class RetryAnnotation:
    """A parsed ``role:ordinal:token`` annotation value."""

    role: str
    ordinal: int
    token: str


def parse_retry_annotation(value: str) -> RetryAnnotation:
    """Parse ``role:ordinal:token``; a bad value raises ValueError saying what is wrong."""
    parts = value.split(":")
    if len(parts) != 3:
        raise ValueError(f"expected role:ordinal:token, got {len(parts)} part(s)")
    role, ordinal, token = parts
    if not ROLE_RE.fullmatch(role):
        raise ValueError(f"role {role[:64]!r} is not a valid role name")
    if not is_decimal(ordinal) or len(ordinal) > 6:
        raise ValueError(f"ordinal {ordinal[:16]!r} is not a non-negative integer")
    if ordinal != str(int(ordinal)):  # "01" would name ordinal 1 under another spelling
        raise ValueError(f"ordinal {ordinal!r} has a leading zero (write {int(ordinal)})")
    return RetryAnnotation(role=role, ordinal=int(ordinal), token=validate_token(token))
