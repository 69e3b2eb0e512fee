"""Connect to Temporal the one way the project does: resolved settings, pydantic payloads."""

from __future__ import annotations

import asyncio
import logging
import threading

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime

from connection.settings import ConnectionSettings

log = logging.getLogger("retire-connection")

MAX_RETRY_DELAY_S = 15.0


async def connect(settings: ConnectionSettings, *, runtime: Runtime | None = None) -> Client:
    """One connection attempt; RuntimeError when the server cannot be reached.

    Every payload of the project is a pydantic model, so every client uses the pydantic
    data converter; a client without it would fail on the first workflow argument.
    ``runtime``: the SDK runtime (the worker's serves its metrics), else the default.
    """
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        api_key=settings.api_key,
        tls=settings.tls,
        rpc_metadata=settings.rpc_metadata,
        data_converter=pydantic_data_converter,
        runtime=runtime,
    )


async def connect_retrying(settings: ConnectionSettings, *, stop: threading.Event) -> Client | None:
    """Connect, retrying with back-off (1 s doubling to 15 s) while Temporal is down.

    For long-running processes: the server may be down for a while and that is not a
    reason to exit. Returns None only when ``stop`` is set before a connection is made.
    """
    delay = 1.0
    while not stop.is_set():
        try:
            return await connect(settings)
        except RuntimeError as e:
            log.warning(
                "Temporal at %s not reachable (%s); retrying in %.0f s",
                settings.address,
                str(e).splitlines()[0][:120],
                delay,
            )
            await asyncio.to_thread(stop.wait, delay)
            delay = min(delay * 2, MAX_RETRY_DELAY_S)
    return None
