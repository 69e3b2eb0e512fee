"""The drain against engines whose metrics lag their work (issue 18), on the bed, judged by
the client's own request: the engine emulator lags exactly as the real engines do
(``testbed/emulator``, each behaviour cited), and a request it is still serving must
finish, whole, before the replica's delete begins.

- SGLang 0.5.21 writes its gauges after a prefill (without the request just admitted),
  every 40 decode steps and when idle, and its request counters move on finish: a
  request sent straight to the replica while it drains is invisible to both for 40
  steps.  ``sglang:realtime_tokens_total`` moves on every step: the drain sees the work.
- vLLM with ``--enable-server-load-tracking``: a streamed answer whose client reads slowly
  is done in the engine (gauges 0, counters moved once) while the API server still sends
  it; ``GET /load`` counts it until its last byte.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import pytest

from retirement.budgets import Budgets
from retirement.phases import Outcome, Phase
from tests.bed.conftest import Ctx
from tests.bed.support import Straggler, Witness, deploy_engine, retire_routerless, wait_state

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

BUDGETS = Budgets(overall_s=120, withdrawal_s=30, drain_s=60, settle_s=20, poll_interval_s=1.0)


def _no_selection() -> set[str]:
    return set()  # router-less: only the Pod's delete is witnessed


async def test_a_request_sglangs_gauges_do_not_show_yet_keeps_the_replica(ctx: Ctx) -> None:
    """Decode steps of 0.1 s: a request admitted into the idle engine stays out of the
    gauges for ~4 s (40 steps), and its counters move only when it ends after 6 s, so two
    drain reads 1 s apart by the gauge rule alone read idle with unchanged counters while it
    runs.  The per-step counter moves between them: the drain waits for the request."""
    name = "sglag"
    victim = await deploy_engine(
        ctx, name, engine="SGLang", args=[], request_seconds=6.0, step_seconds=0.1
    )
    handle = await retire_routerless(ctx, name, budgets=BUDGETS, quiet_s=0.5)
    witness = Witness(ctx, victim, _no_selection)
    witness.start()
    await wait_state(handle, Phase.DRAINING)
    straggler = Straggler(
        f"http://{victim.status.pod_ip}:8000/generate",
        {"text": "p", "sampling_params": {"max_new_tokens": 16}},
    )
    straggler.start()
    st = await handle.result()
    await asyncio.to_thread(straggler.join, 30)
    assert straggler.status == 200, straggler.error
    assert st.outcome is Outcome.COMPLETED, st.reasons
    await asyncio.to_thread(witness.join, 10)
    assert witness.deleting is not None and straggler.ended_at is not None
    assert straggler.ended_at < witness.deleting, "deleted while the request was in flight"
    drain = next(r for r in st.reasons if r.startswith("drain: VERIFIED"))
    assert int(drain.split(" after ")[1].split(" ")[0]) >= 4, drain  # it waited


def _stream_body() -> bytes:
    """A streamed completion of ~6.5 MB (256 choices of 4000 tokens): more than the socket
    buffers between a client that does not read and the server can hold."""
    body = json.dumps(
        {"model": "emulated", "prompt": ["x"] * 256, "max_tokens": 4000, "stream": True}
    ).encode()
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


async def test_a_stream_still_being_sent_keeps_the_replica(ctx: Ctx) -> None:
    """The client reads nothing for 5 s, then all of it: the engine finished the request
    long before (gauges 0, counters moved once), so the gauge rule reads idle twice with
    unchanged counters mid-stream.  The exact count holds the drain until the last byte."""
    name = "vtail"
    victim = await deploy_engine(
        ctx, name, engine="vLLM", args=["--enable-server-load-tracking"], request_seconds=0.3
    )
    handle = await retire_routerless(ctx, name, budgets=BUDGETS, quiet_s=0.5)
    witness = Witness(ctx, victim, _no_selection)
    witness.start()
    await wait_state(handle, Phase.DRAINING)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((victim.status.pod_ip, 8000))
    sock.sendall(_stream_body())
    await asyncio.sleep(5.0)  # a slow client: the engine is done, the answer is not
    received, whole = b"", False
    sock.settimeout(30)

    def read_all() -> None:
        nonlocal received, whole
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                return
            received = received[-64:] + chunk
            if received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
                whole = True
                return

    try:
        await asyncio.to_thread(read_all)
        done_at = time.monotonic()
    finally:
        sock.close()
    st = await handle.result()
    assert whole, "the stream was cut before its last chunk"
    assert st.outcome is Outcome.COMPLETED, st.reasons
    await asyncio.to_thread(witness.join, 10)
    assert witness.deleting is not None and done_at <= witness.deleting
    # It waited for the tail: the drain lasted the 5 s the client read nothing.  (Not its
    # number of polls: with the count, a busy member is waited for in its container, and
    # the reads are few however long the drain.)
    tl = st.phase_timeline
    i = next(i for i, (p, _) in enumerate(tl) if p is Phase.DRAINING)
    assert (tl[i + 1][1] - tl[i][1]).total_seconds() >= 5, tl
