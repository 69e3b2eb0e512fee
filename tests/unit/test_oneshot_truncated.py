"""The one-shot against a raw socket that sends a 200 answer and then closes early: a body
shorter than its Content-Length, one without the final line feed, and a chunked body cut
short each read UNKNOWN (``#error``), never as a complete body that lacks the series which
say requests are running."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from activities.oneshot import command
from retirement.readings import SERIES, parse_oneshot_output

NAMES = SERIES["vLLM"].all
#: A whole body: 12 requests running on DP rank 1, whose gauge comes last, so a body cut
#: before it still parses, and as idle.
BODY = (
    b'vllm:num_requests_running{engine="0"} 0.0\n'
    b'vllm:num_requests_waiting{engine="0"} 0.0\n'
    b'vllm:prompt_tokens_total{engine="0"} 10.0\n'
    b'vllm:generation_tokens_total{engine="0"} 20.0\n'
    b'vllm:num_requests_running{engine="1"} 12.0\n'
)
#: BODY cut at the start of its last line: every line whole, rank 1 gone.
CUT = BODY[: BODY.rindex(b"vllm:")]


def _head(*headers: str) -> bytes:
    return ("HTTP/1.1 200 OK\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.fixture
def raw_server() -> Iterator[tuple[int, list[bytes]]]:
    """A loopback socket that answers each connection with the next bytes of the list the
    test fills in, then closes it (whatever a Content-Length said)."""
    answers: list[bytes] = []
    sock = socket.create_server(("127.0.0.1", 0))
    sock.settimeout(0.05)  # a blocked accept() does not see the socket closed
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(4096)
                    if not data:
                        break
                    request += data
                with contextlib.suppress(OSError):  # the one-shot may stop reading early
                    conn.sendall(answers.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield sock.getsockname()[1], answers
    done.set()
    thread.join(timeout=5)
    sock.close()


def read(port: int) -> str:
    argv = command(port=port, scheme="http", path="/metrics", names=NAMES)
    argv[0] = sys.executable
    return subprocess.run(argv, capture_output=True, text=True, timeout=10, check=True).stdout


def test_a_whole_body_reads_complete(raw_server: tuple[int, list[bytes]]) -> None:
    """The server itself: the same answer, not cut, reads complete and idle."""
    port, answers = raw_server
    answers.append(_head(f"Content-Length: {len(BODY)}") + BODY)
    s = parse_oneshot_output(engine="vLLM", stdout=read(port))
    assert s.complete and s.in_flight == 12 and s.counters == (10.0, 20.0), s


def test_a_body_shorter_than_its_content_length_reads_unknown(
    raw_server: tuple[int, list[bytes]],
) -> None:
    port, answers = raw_server
    answers.append(_head(f"Content-Length: {len(BODY)}") + CUT)
    out = read(port)
    assert out.startswith("#error\t"), out
    s = parse_oneshot_output(engine="vLLM", stdout=out)
    assert not s.complete and not s.idle and "Content-Length" in s.reason, s


def test_a_body_cut_mid_value_reads_unknown(raw_server: tuple[int, list[bytes]]) -> None:
    """Cut inside the last value, the last line still parses (``... 1`` of ``12.0``)."""
    port, answers = raw_server
    answers.append(_head(f"Content-Length: {len(BODY)}") + BODY[:-4])
    s = parse_oneshot_output(engine="vLLM", stdout=read(port))
    assert not s.complete and not s.idle and "Content-Length" in s.reason, s


@pytest.mark.parametrize(
    "answer",
    [
        _head(f"Content-Length: {len(BODY) - 1}") + BODY[:-1],
        _head(f"Content-Length: {len(CUT) - 1}", "Connection: close") + CUT[:-1],
    ],
    ids=["with-length", "cut-at-a-line-end"],
)
def test_a_body_without_its_final_line_feed_reads_unknown(
    raw_server: tuple[int, list[bytes]], answer: bytes
) -> None:
    port, answers = raw_server
    answers.append(answer)
    out = read(port)
    assert out.startswith("#error\t"), out
    s = parse_oneshot_output(engine="vLLM", stdout=out)
    assert not s.complete and not s.idle and "line feed" in s.reason, s


@pytest.mark.parametrize(
    "tail",
    [b"", b"5\r\nvll", b"5"],
    ids=["no-last-chunk", "cut-mid-chunk", "cut-in-a-chunk-size"],
)
def test_a_chunked_body_cut_short_reads_unknown(
    raw_server: tuple[int, list[bytes]], tail: bytes
) -> None:
    """http.client raises IncompleteRead here: already an ``#error``."""
    port, answers = raw_server
    answers.append(_head("Transfer-Encoding: chunked") + _chunk(CUT) + tail)
    out = read(port)
    assert out.startswith("#error\t"), out
    s = parse_oneshot_output(engine="vLLM", stdout=out)
    assert not s.complete and not s.idle and "GET failed" in s.reason, s


def test_a_whole_chunked_body_reads_complete(raw_server: tuple[int, list[bytes]]) -> None:
    port, answers = raw_server
    answers.append(_head("Transfer-Encoding: chunked") + _chunk(CUT) + _chunk(BODY[len(CUT) :]))
    answers[-1] += _chunk(b"")
    s = parse_oneshot_output(engine="vLLM", stdout=read(port))
    assert s.complete and s.in_flight == 12, s


def test_an_empty_body_still_reads_missing_series(raw_server: tuple[int, list[bytes]]) -> None:
    port, answers = raw_server
    answers.append(_head("Content-Length: 0"))
    out = read(port)
    assert "#error" not in out and "missing" in out, out
    assert not parse_oneshot_output(engine="vLLM", stdout=out).complete


def test_chunk_extensions_and_trailers_read_complete(raw_server: tuple[int, list[bytes]]) -> None:
    """What RFC 9112 allows around chunks (an extension, a trailer field) is read past."""
    port, answers = raw_server
    answers.append(
        _head("Transfer-Encoding: chunked")
        + b"%x;name=value\r\n%s\r\n" % (len(BODY), BODY)
        + b"0\r\nX-Trailer: 1\r\n\r\n"
    )
    s = parse_oneshot_output(engine="vLLM", stdout=read(port))
    assert s.complete and s.in_flight == 12, s


@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_a_body_delimited_by_the_close_reads_unknown(
    raw_server: tuple[int, list[bytes]], version: str
) -> None:
    """No Content-Length and not chunked: the body ends where the server closed, and a
    close at a line's end cannot be told from the body's end.  Here the busy rank's line
    is lost and what is left parses as idle: http.client (the one-shot before 2026-12-06)
    read exactly that, as idle."""
    port, answers = raw_server
    answers.append(f"{version} 200 OK\r\nContent-Type: text/plain\r\n\r\n".encode() + CUT)
    out = read(port)
    assert out.startswith("#error\tGET failed: /metrics: BadResponse: NoFraming"), out
    s = parse_oneshot_output(engine="vLLM", stdout=out)
    assert not s.complete and not s.idle, s


def test_a_chunk_over_the_cap_is_not_read_whole(raw_server: tuple[int, list[bytes]]) -> None:
    """A chunk that declares more than the 1 MiB cap: at most the cap is read (the process
    runs in the engine's memory), and the read fails on the cap."""
    port, answers = raw_server
    answers.append(_head("Transfer-Encoding: chunked") + b"ffffffffffff\r\n" + BODY * 30000)
    out = read(port)
    assert out.startswith("#error\tbody over the 1 MiB cap"), out


def test_an_interim_answer_reads_unknown(raw_server: tuple[int, list[bytes]]) -> None:
    port, answers = raw_server
    answers.append(b"HTTP/1.1 100 Continue\r\n\r\n" + _head(f"Content-Length: {len(BODY)}") + BODY)
    assert read(port).startswith("#error\tGET failed: /metrics: HTTP 100")


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (_head("Transfer-Encoding: gzip") + BODY, "BadResponse: UnknownTransferEncoding"),
        (_head("Transfer-Encoding: chunked, gzip") + BODY, "BadResponse: UnknownTransferEncoding"),
        (_head("Transfer-Encoding: chunked") + b"zz\r\n" + BODY, "BadResponse: BadChunkSize"),
        (_head("Transfer-Encoding: chunked") + b"1_0\r\n" + BODY, "BadResponse: BadChunkSize"),
        (
            _head("Transfer-Encoding: chunked") + b"%x\r\n%sXX0\r\n\r\n" % (len(BODY), BODY),
            "BadResponse: BadChunk",
        ),
        (
            _head(f"Content-Length: {len(BODY)}", f"Content-Length: {len(CUT)}") + BODY,
            "BadResponse: BadHeader",
        ),
        (b"HTTP/2 200\r\n\r\n" + BODY, "BadResponse: BadStatusLine"),
        (b"ICY 200 OK\r\n\r\n" + BODY, "BadResponse: BadStatusLine"),
        (_head("Content-Length: 12", " folded") + BODY, "BadResponse: BadHeader"),
        (_head("Content-Length: -1") + BODY, "BadResponse: BadContentLength"),
        (_head("Content-Length: +5") + BODY, "BadResponse: BadContentLength"),
        (_head("Content-Length: 0x10") + BODY, "BadResponse: BadContentLength"),
        (_head("Content-Length: \u00b2") + BODY, "BadResponse: BadContentLength"),
        (b"HTTP/1.1 200 OK\r\nContent-Len", "IncompleteRead"),
        (b"", "IncompleteRead"),
    ],
    ids=[
        "unknown-transfer-encoding",
        "chunked-then-gzip",
        "bad-chunk-size",
        "underscore-in-chunk-size",
        "chunk-without-its-crlf",
        "two-content-lengths",
        "not-http-1",
        "not-http",
        "folded-header",
        "negative-length",
        "signed-length",
        "hex-length",
        "superscript-length",
        "cut-in-the-head",
        "closed-at-once",
    ],
)
def test_framing_it_does_not_understand_reads_unknown(
    raw_server: tuple[int, list[bytes]], answer: bytes, why: str
) -> None:
    """The one-shot's own GET (no ``http.client``) refuses what it cannot frame for sure."""
    port, answers = raw_server
    answers.append(answer)
    out = read(port)
    assert out == f"#error\tGET failed: /metrics: {why}\n", out
    s = parse_oneshot_output(engine="vLLM", stdout=out)
    assert not s.complete and not s.idle and why in s.reason, s
