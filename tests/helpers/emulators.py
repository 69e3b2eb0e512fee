"""Engine emulators started in the test's process, on 127.0.0.1 and free ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from testbed.emulator import EngineEmulator, EngineKind, PodEngineSpec

LOOPBACK = "127.0.0.1"


@contextmanager
def emulators(
    *, prefix: str, request_seconds: float | None = None
) -> Iterator[Callable[..., EngineEmulator]]:
    """A factory of started emulators (``start(engine, **spec_fields)``), each named
    ``<prefix>-<n>`` and answering a request in ``request_seconds`` (None: the spec's
    default) unless told otherwise; every one is stopped when the block ends."""
    made: list[EngineEmulator] = []

    def start(engine: EngineKind, **extra: Any) -> EngineEmulator:
        fields: dict[str, Any] = (
            {} if request_seconds is None else {"request_seconds": request_seconds}
        )
        fields.update(extra)
        emu = EngineEmulator(
            PodEngineSpec(
                name=f"{prefix}-{len(made)}",
                engine=engine,
                serve_host=LOOPBACK,
                serve_port=0,
                metrics_port=0,
                **fields,
            )
        )
        emu.start()
        made.append(emu)
        return emu

    try:
        yield start
    finally:
        for emu in made:
            emu.stop()
