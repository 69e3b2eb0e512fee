"""Validation of the JSON fields the engine API and the hub's control API accept.

One place for the rules (bools are not integers, seconds are finite and non-negative) so
that both APIs answer a bad field with the same 400.
"""

from __future__ import annotations

import math
from typing import Any

from testbed.emulator.wire import BadRequest

__all__ = ["int_field", "seconds_field"]


def int_field(obj: dict[str, Any], key: str, default: int, minimum: int = 0) -> int:
    """An integer field (bools rejected) or its default."""
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{key} must be an integer >= {minimum}")
    return value


def seconds_field(obj: dict[str, Any], key: str) -> float | None:
    """A non-negative, finite number of seconds, or None when absent."""
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BadRequest(f"{key} must be a number")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise BadRequest(f"{key} must be a finite number >= 0")
    return seconds
