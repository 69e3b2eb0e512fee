"""What one emulated Pod's engine is: its kind, its addresses and its request pace.

Kept apart from the engine itself so the hub's control API, the request handlers and
the metrics renderers can all name an engine without importing the server code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["MODEL_NAME", "EngineKind", "PodEngineSpec"]

MODEL_NAME = "emulated"
"""The model name every emulated engine serves and labels its series with."""


class EngineKind(StrEnum):
    """Which engine an emulator imitates."""

    VLLM = "vLLM"
    SGLANG = "SGLang"


@dataclass
class PodEngineSpec:
    """One emulated Pod's engine.

    ``serve_host``/``serve_port`` is the Pod address the engine API listens on;
    ``metrics_port`` is the port on ``127.0.0.1`` serving the same routes. A port of 0
    binds a free port (read it back from :attr:`EngineEmulator.serve_port`).
    """

    name: str
    engine: EngineKind
    serve_host: str
    serve_port: int
    metrics_port: int
    dp_ranks: int = 1
    request_seconds: float = 1.0
