"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.emulator import EngineEmulator, EngineKind
from tests.helpers.emulators import emulators


@pytest.fixture
def vllm() -> Iterator[EngineEmulator]:
    """An emulated vLLM engine with two DP ranks on loopback (ephemeral ports)."""
    with emulators(prefix="e") as start:
        yield start(EngineKind.VLLM, dp_ranks=2)
