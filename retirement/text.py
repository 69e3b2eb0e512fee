"""Strict checks of short text fields (annotations, flags, argv values, ports)."""

from __future__ import annotations


def is_decimal(raw: str) -> bool:
    """Only the ASCII digits 0-9 (``str.isdigit`` also accepts '²' or '٣', which ``int``
    then rejects or reads as another number)."""
    return raw.isascii() and raw.isdigit()
