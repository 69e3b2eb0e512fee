"""What one emulated Pod's engine is: its kind, its addresses and its request pace.

Kept apart from the engine itself so the hub's control API, the request handlers and
the metrics renderers can all name an engine without importing the server code.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from testbed.emulator.sglang_scheduler import DEFAULT_STEP_SECONDS

__all__ = ["MODEL_NAME", "SGLANG_DEFAULT_MODEL", "EngineKind", "PodEngineSpec"]

MODEL_NAME = "emulated"
"""The default served model name (``--served-model-name``) and model path of an emulated
engine, and the model name its metric series are labelled with. The bed's load generator
asks for it by this name."""

SGLANG_DEFAULT_MODEL = "default"
"""What SGLang puts in ``model`` when an OpenAI request omits it (its
``DEFAULT_MODEL_NAME``); SGLang echoes the request's ``model`` back unchecked."""


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

    ``served_model_names`` is the engine's ``--served-model-name`` (vLLM takes several,
    SGLang one) and ``model_path`` its ``--model``/``--model-path``. vLLM answers 404 to an
    OpenAI request that names any other model; SGLang does not check the name.

    ``shutdown_timeout`` is vLLM's ``--shutdown-timeout`` (0, its default, aborts every
    in-flight request on SIGTERM) and ``force_shutdown`` SGLang's ``SGL_FORCE_SHUTDOWN``
    (exit at the watchdog's first check whatever is in flight); see
    :mod:`testbed.emulator.termination`.

    ``args`` is the engine container's rendered command line (its ``command`` then its
    ``args``); the emulated engine reads from it what the real one would
    (:mod:`testbed.emulator.engine_args`): vLLM's ``--enable-server-load-tracking`` and API
    server count, SGLang's ``--decode-log-interval``, ``--load-snapshot-publish-interval``,
    ``--skip-server-warmup`` and ``--disable-overlap-schedule``.

    ``step_seconds`` is the emulated time of one SGLang scheduler step (prefill batch or
    decode step), which decides when its gauges and load snapshots are published
    (:mod:`testbed.emulator.sglang_scheduler`, where the 25 ms default is explained).
    """

    name: str
    engine: EngineKind
    serve_host: str
    serve_port: int
    metrics_port: int
    dp_ranks: int = 1
    request_seconds: float = 1.0
    served_model_names: tuple[str, ...] = (MODEL_NAME,)
    model_path: str = MODEL_NAME
    shutdown_timeout: float = 0.0
    force_shutdown: bool = False
    args: tuple[str, ...] = ()
    step_seconds: float = DEFAULT_STEP_SECONDS
