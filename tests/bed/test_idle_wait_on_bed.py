"""Waiting for idle through the real API server and kwok (issue 18): a router-less vLLM
replica with ``--enable-server-load-tracking`` holds four requests sent straight to it when
its retirement starts; the quiet window cannot start while ``GET /load`` counts them, so the
worker waits in the container (the whole window in one exec, ``quiet`` mode), and the
requests must all finish, whole, before the Pod's delete begins.  And a client that keeps
sending short requests while the window runs keeps it from ending until it stops.

Judged by evidence the product does not write: the clients' own answers, a witness reading
the Pod, and the API server's audit log (each ``pods/exec`` with its command: the wait
one-shot's and the one-exec window's execs are told from the reads' by their command)."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs, urlsplit

import pytest

from activities.oneshot import SCRIPT, WAIT_SCRIPT
from retirement.budgets import Budgets
from retirement.phases import Outcome, Phase
from tests.bed.conftest import Ctx
from tests.bed.support import Straggler, Witness, deploy_engine, retire_routerless

pytestmark = [pytest.mark.bed, pytest.mark.asyncio(loop_scope="session")]

BUDGETS = Budgets(overall_s=120, withdrawal_s=45, drain_s=30, settle_s=20, poll_interval_s=1.0)
REQUEST_S = 8.0


def execs_into(ctx: Ctx, pod: str) -> list[str]:
    """ "wait", "quiet" (a whole window in one exec) or "read" for every ``pods/exec`` into
    ``pod`` in the audit log, in order."""
    found = []
    for line in ctx.bed.cp.audit_log.read_text().splitlines():
        ev = json.loads(line)
        ref = ev.get("objectRef") or {}
        if ref.get("subresource") != "exec" or ref.get("name") != pod:
            continue
        if ref.get("namespace") != ctx.ns or ev.get("stage") != "ResponseStarted":
            continue
        command = parse_qs(urlsplit(ev["requestURI"]).query).get("command", [])
        kind = (
            "wait"
            if WAIT_SCRIPT in command
            else ("quiet" if "quiet" in command else "read")
            if SCRIPT in command
            else "?"
        )
        found.append(kind)
    return found


async def test_a_busy_router_less_replica_is_waited_for_in_its_container(ctx: Ctx) -> None:
    name = "vwait"
    victim = await deploy_engine(
        ctx,
        name,
        engine="vLLM",
        args=["--enable-server-load-tracking"],
        request_seconds=REQUEST_S,
    )
    url = f"http://{victim.status.pod_ip}:8000/v1/completions"
    body = {"model": "emulated", "prompt": "p", "max_tokens": 8}
    clients = [Straggler(url, body) for _ in range(4)]
    for c in clients:
        c.start()
    await asyncio.sleep(0.5)  # they are in the engine
    witness = Witness(ctx, victim, set)
    witness.start()
    handle = await retire_routerless(ctx, name, budgets=BUDGETS, quiet_s=0.5)
    st = await handle.result()
    for c in clients:
        await asyncio.to_thread(c.join, 30)
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert all(c.status == 200 for c in clients), [(c.status, c.error) for c in clients]
    await asyncio.to_thread(witness.join, 10)
    ended = max(c.ended_at or 0.0 for c in clients)
    assert witness.deleting is not None and ended < witness.deleting, "deleted in flight"
    await asyncio.sleep(1)  # the audit log is written behind
    kinds = execs_into(ctx, victim.metadata.name)
    assert "?" not in kinds, kinds
    # While the four requests ran (8 s), a read each second would be ~8 reads before the
    # first idle one; the withdrawal waited for them and kept its window in one exec.
    assert kinds[0] == "quiet" and kinds.count("quiet") == 1, kinds
    assert "read" in kinds[1:], f"the drain never read: {kinds}"
    print(
        f"execs {kinds}; delete began {witness.deleting - ended:.2f} s after the last request ended"
    )


async def test_requests_during_the_quiet_window_keep_it_from_ending(ctx: Ctx) -> None:
    """A client sends a short request (0.4 s) every 0.8 s for 8 s, from before the
    retirement starts; with a 2 s window, no window holds while it sends.  The retirement
    completes after it stopped, and no request was cut."""
    name = "vquiet"
    victim = await deploy_engine(
        ctx, name, engine="vLLM", args=["--enable-server-load-tracking"], request_seconds=0.4
    )
    url = f"http://{victim.status.pod_ip}:8000/v1/completions"
    body = {"model": "emulated", "prompt": "p", "max_tokens": 8}
    sent: list[Straggler] = []

    async def keep_sending() -> None:
        end = asyncio.get_running_loop().time() + 8.0
        while asyncio.get_running_loop().time() < end:
            c = Straggler(url, body)
            c.start()
            sent.append(c)
            await asyncio.sleep(0.8)

    sender = asyncio.create_task(keep_sending())
    await asyncio.sleep(0.5)
    witness = Witness(ctx, victim, set)
    witness.start()
    handle = await retire_routerless(ctx, name, budgets=BUDGETS, quiet_s=2.0)
    await sender
    st = await handle.result()
    for c in sent:
        await asyncio.to_thread(c.join, 30)
    assert st.outcome is Outcome.COMPLETED, st.reasons
    assert len(sent) >= 9 and all(c.status == 200 for c in sent), [
        (c.status, c.error) for c in sent
    ]
    await asyncio.to_thread(witness.join, 10)
    last = max(c.ended_at or 0.0 for c in sent)
    assert witness.deleting is not None and last < witness.deleting, "deleted in flight"
    # No window held while the client sent: the withdrawal ended (Draining began) at
    # least the 2 s window after its last answer (less 0.1 s: the client stamps its end
    # after the engine counted the request finished).
    [draining] = [at for phase, at in st.phase_timeline if phase is Phase.DRAINING]
    last_wall = max(c.ended_wall or 0.0 for c in sent)
    assert draining.timestamp() - last_wall >= 1.9, draining.timestamp() - last_wall
    await asyncio.sleep(1)
    kinds = execs_into(ctx, victim.metadata.name)
    assert "?" not in kinds and kinds.count("quiet") >= 2, kinds
    print(f"execs {kinds}; delete began {witness.deleting - last:.2f} s after the last request")
