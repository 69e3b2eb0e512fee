"""Fixtures shared by the unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testbed.emulator import EngineEmulator, EngineKind, PodEngineSpec


@pytest.fixture
def vllm() -> Iterator[EngineEmulator]:
    """An emulated vLLM engine with two DP ranks on loopback (ephemeral ports)."""
    emu = EngineEmulator(
        PodEngineSpec(
            name="e",
            engine=EngineKind.VLLM,
            serve_host="127.0.0.1",
            serve_port=0,
            metrics_port=0,
            dp_ranks=2,
        )
    )
    emu.start()
    yield emu
    emu.stop()
