"""Engine version comparison: only release numbers, pre-releases below, unknown below."""

from __future__ import annotations

import pytest

from retirement.versions import at_least


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("0.8.0", True),
        ("v0.8.0", True),
        ("0.29.0", True),
        ("0.8.0.post1", True),
        ("0.8.0+cu124", True),
        ("0.8.1rc1", True),
        ("0.8.0rc1", False),
        ("0.8.0.dev3", False),
        ("0.7.3", False),
        ("0.7.99", False),
        ("", False),
        ("latest", False),
        ("0.8", False),
        ("0.8.0-custom", False),
        ("10.0.0", True),
    ],
)
def test_at_least(version: str, expected: bool) -> None:
    assert at_least(version, (0, 8, 0)) is expected
