"""Every HTTP answer the activities read is bounded in size and in time, whatever the other
end sends (issue 22, H2 and H3), and a cancellation of the activity is never read as an
answer.

The peers are ``testbed.hostile`` on loopback: raw sockets sending a body that never ends,
one byte every 0.3 s (in the body, or in the headers), or 4 MiB of ``[{},{},...]``.  Each
observer's view, each removal and re-add call, and the identity probe are asked; memory is
measured with ``tracemalloc`` (the peak of what Python allocated during the call).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.exceptions import CancelledError

from activities.probes import identity_probe
from activities.routers import LlmdPicker, ObserverEndpoints, SGLangGateway, VllmRouter
from activities.routers.common import RouterObserver
from retirement.models import IntentKind, MemberTarget, Target
from testbed.hostile import Hostile, serve

MiB = 1 << 20
#: A view's answer is read up to 4 MiB (``bounded.VIEW_CAP``): what one call may cost.
VIEW_PEAK = 16 * MiB
#: A removal's or re-add's answer is read up to 64 KiB: it only goes into a reason.
CALL_PEAK = 2 * MiB
#: The overall deadline the tests set (``bounded.CALL_DEADLINE_S``, 5 s in the product).
DEADLINE_S = 1.0
#: How long a test waits for a call before it says the call is not bounded.
HANG_S = 12.0
#: A dripping peer's pause between bytes: past the deadline, inside httpx's 3 s read
#: timeout, so only the deadline's watchdog (which shuts the socket down) ends the read.
DRIP_S = 2.5
#: How late after its deadline a call may end.
SLACK_S = 0.5

OBSERVERS: dict[str, Callable[[], RouterObserver]] = {
    "vllm-router": VllmRouter,
    "sglang-gateway": SGLangGateway,
    "patched": lambda: ObserverEndpoints(VllmRouter()),
    "llm-d": LlmdPicker,
}
ACTIVE = {k: v for k, v in OBSERVERS.items() if v().active}


@pytest.fixture(autouse=True)
def _short_deadline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A 1 s call deadline (the product's is 5 s) and a dedicated picker token."""
    try:
        import activities.routers.bounded as bounded
    except ImportError:  # the code before the bound: nothing to shorten
        pass
    else:
        monkeypatch.setattr(bounded, "CALL_DEADLINE_S", DEADLINE_S)
    token = tmp_path / "token"
    token.write_text("reader-token\n")
    monkeypatch.setenv("RETIRE_LLMD_TOKEN_FILE", str(token))


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(trust_env=False, timeout=3.0) as c:
        yield c


def measured(fn: Callable[[], Any]) -> tuple[Any, float, int]:
    """Run ``fn`` in a thread (so a call that never ends cannot hang the test): its
    result, how long it took, and the peak of Python's allocations meanwhile."""
    box: list[Any] = []
    tracemalloc.start()
    tracemalloc.reset_peak()
    started = time.monotonic()
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t.start()
    t.join(HANG_S)
    took = time.monotonic() - started
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert not t.is_alive(), f"the call was still reading after {HANG_S:g} s: not bounded"
    assert box, "the call raised"
    return box[0], took, peak


# ============================================================================ size (H2)


@pytest.mark.parametrize("kind", OBSERVERS)
def test_a_view_that_never_ends_is_cut_at_its_cap(http: httpx.Client, kind: str) -> None:
    peer = Hostile("endless")
    with serve(peer) as base:
        view, took, peak = measured(lambda: OBSERVERS[kind]().view(http, base))
    assert view.error, view
    assert "cap" in view.error or "deadline" in view.error, view.error
    assert peak < VIEW_PEAK, f"{peak / MiB:.0f} MiB for one view"
    assert took < DEADLINE_S + 1


@pytest.mark.parametrize("kind", ACTIVE)
@pytest.mark.parametrize("call", ["remove", "add"])
def test_a_removal_or_readd_answer_is_read_only_up_to_its_cap(
    http: httpx.Client, kind: str, call: str
) -> None:
    """The answer to a mutating call only goes into a reason: 64 MiB of it are not read."""
    peer = Hostile("endless", limit=64 * MiB)
    obs = OBSERVERS[kind]()
    url = "http://198.18.1.1:8000"
    with serve(peer) as base:
        if call == "remove":
            answer, took, peak = measured(lambda: obs.remove(http, base, url, "w1") or "")
        else:
            answer, took, peak = measured(lambda: obs.add(http, base, url))
    assert peak < CALL_PEAK, f"{peak / MiB:.0f} MiB for one {call} call"
    assert peer.sent < 64 * MiB or took < DEADLINE_S + 1
    if call == "add":
        assert answer.startswith("HTTP 200"), answer
        assert "\x00" not in answer and len(answer) < 200


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-gateway", "patched"])
def test_a_json_answer_of_too_many_objects_is_not_decoded(http: httpx.Client, kind: str) -> None:
    """4 MiB of ``[{},{},...]`` would cost ``json.loads`` ~100 MiB."""
    with serve(Hostile("json-bomb", size=4 * MiB - 4096)) as base:
        view, _took, peak = measured(lambda: OBSERVERS[kind]().view(http, base))
    assert "JSON objects and arrays" in view.error, view.error
    assert peak < VIEW_PEAK, f"{peak / MiB:.0f} MiB to refuse one answer"


def test_an_identity_probe_answer_is_read_only_up_to_its_cap() -> None:
    with serve(Hostile("endless", limit=64 * MiB)) as base:
        port = int(base.rsplit(":", 1)[1])
        reason, _took, peak = measured(lambda: identity_probe(target(), member("127.0.0.1", port)))
    assert reason.startswith("identity probe failed") and "cap" in reason, reason
    assert peak < CALL_PEAK, f"{peak / MiB:.0f} MiB for one probe"


# ============================================================================ time (H3)


@pytest.mark.parametrize("mode", ["drip-body", "drip-headers"])
@pytest.mark.parametrize("kind", OBSERVERS)
def test_a_view_that_drips_ends_at_the_call_deadline(
    http: httpx.Client, kind: str, mode: str
) -> None:
    """One byte every 2.5 s never trips httpx's 3 s read timeout: the call's own deadline
    ends it, in the middle of a blocked read."""
    with serve(Hostile(mode, interval=DRIP_S)) as base:
        view, took, _peak = measured(lambda: OBSERVERS[kind]().view(http, base))
    assert view.error and "deadline" in view.error, view.error
    assert took < DEADLINE_S + SLACK_S, f"{took:.1f} s"


@pytest.mark.parametrize("kind", ACTIVE)
def test_a_readd_that_drips_ends_at_the_call_deadline(http: httpx.Client, kind: str) -> None:
    with serve(Hostile("drip-body", interval=DRIP_S)) as base:
        answer, took, _peak = measured(
            lambda: OBSERVERS[kind]().add(http, base, "http://198.18.1.1:8000")
        )
    assert "deadline" in answer, answer
    assert took < DEADLINE_S + SLACK_S, f"{took:.1f} s"


def test_an_identity_probe_that_drips_ends_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import activities.probes as probes

    monkeypatch.setattr(probes, "PROBE_TIMEOUT_S", DEADLINE_S)
    with serve(Hostile("drip-body", interval=DRIP_S)) as base:
        port = int(base.rsplit(":", 1)[1])
        reason, took, _peak = measured(lambda: identity_probe(target(), member("127.0.0.1", port)))
    assert reason.startswith("identity probe failed"), reason
    assert took < DEADLINE_S + SLACK_S, f"{took:.1f} s"


class GoodThenDrip(Hostile):
    """Answers the first request well, keeping the connection alive; drips on every later
    request, on that connection or a new one."""

    def handle(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        buf = b""
        while True:
            try:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    buf += chunk
            except OSError:
                return
            buf = buf.split(b"\r\n\r\n", 1)[1]
            self.requests += 1
            if self.requests == 1:
                body = b'{"urls": []}'
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                continue
            conn.settimeout(None)
            with contextlib.suppress(OSError):
                self._drip_body(conn)
            return


def test_the_deadline_holds_on_a_client_that_called_the_router_before(
    http: httpx.Client,
) -> None:
    """Every call opens a connection of its own, on which the deadline's watchdog is armed:
    a good answer first, then a dripping one from the same router on the same client."""
    peer = GoodThenDrip("drip-body", interval=DRIP_S)
    with serve(peer) as base:
        assert VllmRouter().view(http, base).error == ""
        view, took, _ = measured(lambda: VllmRouter().view(http, base))
    assert "deadline" in view.error, view.error
    assert took < DEADLINE_S + SLACK_S, f"{took:.1f} s"


# ============================================================================ cancellation


@pytest.mark.parametrize("kind", OBSERVERS)
def test_a_cancellation_raised_into_a_read_is_not_an_answer(kind: str) -> None:
    """Temporal cancels a threaded activity by raising ``CancelledError`` (an ``Exception``)
    into its thread, wherever it is: an observer must let it through, not read it as
    "no answer"."""

    def cancelled(request: httpx.Request) -> httpx.Response:
        raise CancelledError("cancelled")

    mock = httpx.MockTransport(cancelled)
    with httpx.Client(transport=mock, trust_env=False) as http, pytest.raises(CancelledError):
        OBSERVERS[kind]().view(http, "http://198.18.1.2:30000")


def test_a_cancellation_raised_in_the_pickers_parser_is_not_an_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import activities.routers.llmd as llmd

    def parse(text: str) -> frozenset[str]:
        raise CancelledError("cancelled while parsing")

    monkeypatch.setattr(llmd, "endpoints", parse)
    ok = httpx.MockTransport(lambda r: httpx.Response(200, text="x 1\n"))
    with httpx.Client(transport=ok, trust_env=False) as http, pytest.raises(CancelledError):
        LlmdPicker().view(http, "http://198.18.1.2:9090")


@pytest.mark.parametrize("kind", ACTIVE)
def test_a_cancellation_in_a_removal_is_not_swallowed(kind: str) -> None:
    def cancelled(request: httpx.Request) -> httpx.Response:
        raise CancelledError("cancelled")

    mock = httpx.MockTransport(cancelled)
    with httpx.Client(transport=mock, trust_env=False) as http, pytest.raises(CancelledError):
        OBSERVERS[kind]().add(http, "http://198.18.1.2:30000", "http://198.18.1.1:8000")


# ============================================================================ probe addresses


def target(engine: str = "vLLM", version: str = "0.29.0") -> Target:
    return Target(
        namespace="default",
        deployment="llm",
        role="server",
        ordinal=1,
        intent=IntentKind.COUNT_TRIM,
        engine=engine,
        engine_version=version,
        shape="leader-served",
        members=[],
    )


def member(ip: str, port: int = 8000) -> MemberTarget:
    return MemberTarget(pod="llm-1-0", uid="uid-1-0", container_id="c://1", ip=ip, serve_port=port)


@pytest.mark.parametrize("engine", ["vLLM", "SGLang"])
def test_an_ipv6_member_is_probed_at_its_bracketed_address(engine: str) -> None:
    seen: list[httpx.Request] = []

    def echo(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        import json

        body = json.loads(request.content)
        if engine == "vLLM":
            return httpx.Response(200, json={"id": "cmpl-" + request.headers["x-request-id"]})
        return httpx.Response(200, json={"meta_info": {"id": body["rid"], "finish_reason": "x"}})

    reason = identity_probe(
        target(engine, "0.29.0" if engine == "vLLM" else "0.5.21"),
        member("fd00:10::7"),
        transport=httpx.MockTransport(echo),
    )
    assert reason == ""
    assert [str(r.url.host) for r in seen] == ["fd00:10::7"]
    assert seen[0].url.port == 8000


@pytest.mark.parametrize("ip", ["", "llm-1-0.llm", "fd00::1]:1[", "1.2.3.4:80"])
def test_a_member_address_that_is_no_ip_reads_unknown(ip: str) -> None:
    def never(request: httpx.Request) -> httpx.Response:
        raise AssertionError("nothing may be sent")

    reason = identity_probe(target(), member(ip), transport=httpx.MockTransport(never))
    assert reason.startswith("identity probe"), reason
    assert reason != ""
