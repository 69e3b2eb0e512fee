"""The fixed python3 one-shot a drain read runs inside the member's ``main`` container.

No string from any object is spliced into the command: the script is this constant, and
its arguments are a validated port number, a scheme from an allow-list, a path that passed
a strict pattern, a mode (``plain`` or ``exact``), and the expected series names (constants
of this project).  It GETs the engine's metrics over loopback with a 2 s timeout and a
1 MiB body cap, sums each expected series over its label sets, and in ``exact`` mode then
GETs the engine's request-level count (``/load``, a constant path, on the same port: the
API server serves both; after the metrics, so a request arriving between the two is still
counted); it prints ``name<TAB>value`` lines, ``#load<TAB>N``, then ``#end``, or
``#error<TAB>reason``.  In ``exact2`` mode it does all that twice, ``TWICE_SPACING_S``
apart, in the one process (the exact drain's two reads).  In ``quiet`` mode (the router-less
quiet window of a member with the exact count, ``quiet_command``) it first waits up to a
given time for the count to read 0 (``#busy<TAB>N`` when it does not), prints
``#waited<TAB>seconds``, reads, keeps the window on its own monotonic clock, prints
``#apart<TAB>seconds`` (from the end of the first read to the start of the second) and
reads again: a whole quiet window in one exec, instead of an exec at each of its ends and
the wait between them in the worker.  It reads only; it writes nothing.

Why the standard library only, and so little of it (no ``urllib``, no ``prometheus_client``,
and no ``http.client`` either: a GET of its own over a socket, below): every read of every
retirement starts this process on the member's node, and its start-up is the bulk of what a
fleet of reads costs.  Measured here (CPU per process): 97 ms with ``urllib`` and
``prometheus_client``'s parser, 44 ms with ``http.client`` (whose imports, ``email`` and
``ssl`` among them, were 60 % of it), 17 ms now (``_socket``, ``re``, ``json``); on the bed
one read, exec and all, went from 60-83 to 35-37 ms of the node's CPU (2026-12-06).  The GET
is HTTP/1.1 with ``Connection: close`` and reads the framings the engines' server (uvicorn)
sends: a Content-Length (``/load``) or chunked (``/metrics``: prometheus_client's ASGI app
sends no length); any other framing, a malformed head or chunk, or a cut inside either
fails the read (``tests/unit/test_oneshot_uvicorn.py`` reads uvicorn's own answers).  A body
delimited only by the server's close is refused too (``http.client`` read it): a close at a
line's end is indistinguishable from the body's end, and would have dropped, say, a busy
rank's gauge from a read that then parsed as idle.  The
parser reads the text exposition format strictly: any line that is not a comment, blank, or
a well-formed sample fails the whole read (``malformed metrics``), so a body it does not
understand reads UNKNOWN, never idle; on well-formed bodies its sums equal
``prometheus_client``'s (``tests/unit/test_oneshot_parser.py``).  A body cut short by an
early close fails the read too: shorter than its Content-Length, or a non-empty body
without the final line feed every exposition line ends with (a cut one may still parse,
without the series of the lines it lost: ``tests/unit/test_oneshot_truncated.py``).
"""

from __future__ import annotations

import re

from retirement.text import is_decimal

BODY_CAP = 1 << 20
HTTP_TIMEOUT_S = 2.0
#: The bound of one exec (connect, run, output).  Measured on the bed: one read takes
#: ~0.15 s alone; the bound is what a read may take when many start at once on one node.
EXEC_TIMEOUT_S = 5.0
PATH_RE = re.compile(r"^/[A-Za-z0-9._~/-]{0,200}$")
SCHEMES = ("http", "https")
#: How the one-shots start: ``-I`` (isolated: no PYTHON* variable, user site or working
#: directory of the engine's image on the path) and ``-S`` (no ``site``: none of the
#: image's ``.pth`` files or ``sitecustomize`` runs) in one word, so the code follows
#: ``-c`` as the argv's third word.  The one-shots need the standard library alone; ``site``
#: is most of the interpreter's start (32 of ~50 ms here, more in an image with many
#: packages), paid on the node by every read.
PYTHON = ("python3", "-ISc")

#: The exposition-format parser, a function of its own so tests can run it alone:
#: ``parse(text, names) -> (sums, seen, bad)``; raises ValueError on a malformed line.
PARSER = r"""
import math, re
_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*"(?:[^"\\\n]|\\.)*"[ \t]*'
_SAMPLE = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)'
    r'(?:\{[ \t]*(?:' + _LABEL + r'(?:,[ \t]*' + _LABEL + r')*,?[ \t]*)?\})?'
    r'[ \t]+([^ \t]+)(?:[ \t]+-?[0-9]+)?[ \t]*'
)
_VALUE = re.compile(
    r'[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?'
    r'|[+-]?(?i:inf(?:inity)?)|(?i:nan)'
)
def parse(text, names):
    sums = {n: 0.0 for n in names}; seen = set(); bad = set()
    for line in text.split("\n"):
        if not line.strip(" \t") or line.startswith("#"):
            continue
        m = _SAMPLE.fullmatch(line)
        if m is None or not _VALUE.fullmatch(m.group(2)):
            raise ValueError("malformed line")
        name = m.group(1)
        if name in sums:
            seen.add(name)
            v = float(m.group(2))
            if math.isnan(v) or math.isinf(v) or v < 0:
                bad.add(name)
            else:
                sums[name] += v
    return sums, seen, bad
"""

_HTTP = r"""
class IncompleteRead(Exception):
    pass
class BadResponse(Exception):
    pass
def fetch(port, scheme, what, accept, cap, timeout):
    # One GET over loopback (HTTP/1.1, Connection: close): (status, body, the body's
    # Content-Length or None when chunked), within ``timeout`` seconds in all.  At most
    # cap + 1 bytes of body are read.  A 200 framed any other way than by a Content-Length
    # or chunked raises (a body read until the close cannot tell a cut at a line's end
    # from its end), as do a malformed head or chunk and a cut inside either.
    import time
    deadline = time.monotonic() + timeout
    if scheme == "https":
        import socket, ssl
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        raw = socket.create_connection(("127.0.0.1", port), timeout)
        try:
            s = ctx.wrap_socket(raw)
        except BaseException:
            raw.close()
            raise
    else:
        import _socket
        s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
        s.settimeout(timeout)
    try:
        if scheme != "https":
            s.connect(("127.0.0.1", port))
        head = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAccept-Encoding: identity\r\n"
                "Accept: %s\r\nConnection: close\r\n\r\n" % (what, port, accept))
        s.sendall(head.encode("ascii"))
        buf = bytearray()
        def more():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError()
            s.settimeout(left)
            data = s.recv(65536)
            buf.extend(data)
            return len(data) > 0
        def line():
            while True:
                i = buf.find(b"\n")
                if i >= 0:
                    out = bytes(buf[:i + 1]); del buf[:i + 1]
                    return out
                if len(buf) > 65536:
                    raise BadResponse("LineTooLong")
                if not more():
                    raise IncompleteRead()
        def take(n):
            while len(buf) < n and more():
                pass
            out = bytes(buf[:n]); del buf[:n]
            return out
        version, _, rest = line().rstrip(b"\r\n").partition(b" ")
        code = rest[:3]
        if version not in (b"HTTP/1.0", b"HTTP/1.1") or len(code) != 3 or not code.isdigit() \
                or rest[3:4] not in (b"", b" "):
            raise BadResponse("BadStatusLine")
        headers = {}
        while True:
            h = line()
            if h in (b"\r\n", b"\n"):
                break
            if len(headers) >= 100 or h[:1] in (b" ", b"\t"):
                raise BadResponse("BadHeader")
            name, colon, value = h.decode("latin-1").partition(":")
            name = name.lower()
            if not colon or not name or name != name.strip():
                raise BadResponse("BadHeader")
            if name in ("content-length", "transfer-encoding") and name in headers:
                raise BadResponse("BadHeader")  # the framing said twice
            headers[name] = value.strip()
        if int(code) != 200:
            return int(code), b"", None
        te, length = headers.get("transfer-encoding"), headers.get("content-length")
        if te is not None:
            if te.lower() != "chunked":
                raise BadResponse("UnknownTransferEncoding")
            body = bytearray()
            while True:
                size = line().rstrip(b"\r\n").partition(b";")[0].strip()
                if not size or len(size) > 16 or size.strip(b"0123456789abcdefABCDEF"):
                    raise BadResponse("BadChunkSize")
                size = int(size, 16)
                if size == 0:
                    while line() not in (b"\r\n", b"\n"):
                        pass
                    return 200, bytes(body), None
                want = min(size, cap + 1 - len(body))
                data = take(want)
                body.extend(data)
                if len(data) < want:
                    raise IncompleteRead()
                if want < size:
                    return 200, bytes(body), None  # over the cap: the caller says so
                end = take(2)
                if len(end) < 2:
                    raise IncompleteRead()
                if end != b"\r\n":
                    raise BadResponse("BadChunk")
        if length is None:
            raise BadResponse("NoFraming")
        if not (length.isascii() and length.isdigit()):
            raise BadResponse("BadContentLength")
        want = int(length)
        return 200, take(min(want, cap + 1)), want
    finally:
        s.close()
"""

_MAIN = r"""
import sys
def fail(reason):
    print("#error\t" + reason); sys.exit(0)
try:
    port = int(sys.argv[1]); scheme = sys.argv[2]; path = sys.argv[3]; mode = sys.argv[4]
    if mode == "quiet":
        wait = float(sys.argv[5]); window = float(sys.argv[6]); names = sys.argv[7:]
    else:
        wait = window = 0.0; names = sys.argv[5:]
except (IndexError, ValueError):
    fail("bad arguments")
if (not 0 < port < 65536 or scheme not in ("http", "https") or not path.startswith("/")
        or not path.isprintable() or " " in path
        or mode not in ("plain", "exact", "exact2", "quiet")
        or not 0 <= wait <= %(max_wait)s or not 0 <= window <= %(max_window)s
        or (mode == "quiet" and window == 0)):
    fail("bad arguments")
def get(what, accept, cap, shown):
    try:
        status, body, want = fetch(port, scheme, what, accept, cap, %(timeout)s)
    except Exception as e:
        # The class, and the message of the GET's own refusals (fixed words: no text of
        # the answer or the system reaches the output).
        why = type(e).__name__ + (": " + str(e) if isinstance(e, BadResponse) else "")
        fail("GET failed: %s: %s" % (what, why))
    if status != 200:
        fail("GET failed: %s: HTTP %d" % (what, status))
    if len(body) > cap:
        fail("body over the %s cap (GET %s)" % (shown, what))
    # ``want``: the Content-Length (None when chunked): a body cut short by an
    # early close is shorter.
    if want is not None and len(body) != want:
        fail("body cut short: %d of its Content-Length %d bytes" % (len(body), want))
    return body
def count():
    import json
    try:
        n = json.loads(get("/load", "application/json", 4096, "4 KiB"))["server_load"]
    except Exception as e:
        fail("GET /load answered no count: " + type(e).__name__)
    if type(n) is not int or n < 0:
        fail("GET /load answered no count: not a whole number")
    return n
def read():
    body = get(path, "text/plain", %(cap)d, "1 MiB")
    # The exposition format ends every line with a line feed: without one, it was cut.
    if body and not body.endswith(b"\n"):
        fail("body cut short: no final line feed")
    try:
        sums, seen, bad = parse(body.decode("utf-8"), names)
    except Exception as e:
        fail("malformed metrics: " + type(e).__name__)
    # After the metrics: a request that arrives between the two reads is still counted
    # here, from its handler's start until its last byte is sent.
    load = None if mode == "plain" else count()
    for n in names:
        print(n + "\t" + ("invalid" if n in bad else repr(sums[n]) if n in seen else "missing"))
    if load is not None:
        print("#load\t%d" % load)
    print("#end", flush=True)
if mode == "quiet":
    import time
    start = time.monotonic()
    while True:
        n = count()
        if n == 0:
            break
        left = start + wait - time.monotonic()
        if left <= 0:
            print("#busy\t%d" % n, flush=True); sys.exit(0)
        time.sleep(min(%(poll)s, left))
    print("#waited\t%.3f" % (time.monotonic() - start))
    read()
    # The window runs from the end of the first read to the start of the second, on
    # this process's monotonic clock: no request finished in it (equal counters) and
    # none was held at either end (the count, 0 at both reads).
    after_first = time.monotonic()
    while time.monotonic() < after_first + window:
        time.sleep(max(0.0, after_first + window - time.monotonic()))
    print("#apart\t%.3f" % (time.monotonic() - after_first))
read()
if mode == "exact2":
    import time
    time.sleep(%(spacing)s)
    read()
"""

#: ``exact2``: the pause between the two reads of one exec (the exact drain's idle spacing:
#: with the engine's own count, two reads this far apart are the proof; one exec instead of
#: two halves what a drain costs the node and the API server).
TWICE_SPACING_S = 0.25

#: How often the wait one-shot asks the engine for its count (seconds): a member that goes
#: idle is noticed within this, for one small local GET each time.
WAIT_POLL_S = 0.25
#: The longest wait one exec may be asked for (seconds).
MAX_WAIT_S = 60.0
#: The longest quiet window one exec keeps (``quiet`` mode, seconds): longer windows are
#: read at their two ends by two execs, as before.
MAX_WINDOW_S = 30.0

SCRIPT = (
    PARSER
    + _HTTP
    + _MAIN.replace("%(timeout)s", repr(HTTP_TIMEOUT_S))
    .replace("%(cap)d", str(BODY_CAP))
    .replace("%(spacing)s", repr(TWICE_SPACING_S))
    .replace("%(max_wait)s", repr(MAX_WAIT_S))
    .replace("%(max_window)s", repr(MAX_WINDOW_S))
    .replace("%(poll)s", repr(WAIT_POLL_S))
)

#: The wait one-shot (``wait_command``): no evidence, only a trigger.  It asks the engine for
#: its request-level count (``GET /load``, on loopback, 2 s timeout, 4 KiB cap) every
#: ``WAIT_POLL_S`` until the count is 0 or the wait is over, then prints one line and exits:
#: ``#idle<TAB>seconds waited``, ``#busy<TAB>last count``, or ``#error<TAB>reason``.  Its
#: caller then reads the member as it always does (``SCRIPT``): the proof is unchanged, it
#: only comes sooner after the engine goes idle than a read spaced for a busy engine would.
WAIT_SCRIPT = (
    _HTTP
    + r"""
import sys, time, json
def done(line):
    print(line, flush=True); sys.exit(0)
try:
    port = int(sys.argv[1]); scheme = sys.argv[2]; wait = float(sys.argv[3])
except (IndexError, ValueError):
    done("#error\tbad arguments")
if not 0 < port < 65536 or scheme not in ("http", "https") or not 0 < wait <= %(max)s:
    done("#error\tbad arguments")
def count():
    try:
        status, body, want = fetch(port, scheme, "/load", "application/json", 4096, %(timeout)s)
        ok = status == 200 and len(body) <= 4096 and (want is None or len(body) == want)
        n = json.loads(body)["server_load"] if ok else None
    except Exception:
        return None
    return n if type(n) is int and n >= 0 else None
start = time.monotonic()
while True:
    n = count()
    if n is None:
        done("#error\tGET /load answered no count")
    if n == 0:
        done("#idle\t%%.3f" %% (time.monotonic() - start))
    left = start + wait - time.monotonic()
    if left <= 0:
        done("#busy\t%%d" %% n)
    time.sleep(min(%(poll)s, left))
""".replace("%(max)s", repr(MAX_WAIT_S))
    .replace("%(timeout)s", repr(HTTP_TIMEOUT_S))
    .replace("%(poll)s", repr(WAIT_POLL_S))
    .replace("%%", "%")
)


def wait_command(*, port: int, scheme: str, wait_s: float) -> list[str]:
    """The wait one-shot's argv (``WAIT_SCRIPT``): wait up to ``wait_s`` seconds (at most
    ``MAX_WAIT_S``) for the engine's request-level count to be 0."""
    if scheme not in SCHEMES or not 0 < port < 65536 or not 0 < wait_s <= MAX_WAIT_S:
        raise ValueError("bad wait arguments")
    return [*PYTHON, WAIT_SCRIPT, str(port), scheme, f"{wait_s:.3f}"]


def valid_port(raw: str | None) -> int:
    """The ``prometheus.io/port`` annotation as a port number, or ValueError saying why."""
    if raw is None:
        raise ValueError("no prometheus.io/port annotation")
    if not is_decimal(raw) or len(raw) > 5 or not 0 < int(raw) < 65536:
        raise ValueError(f"prometheus.io/port {raw[:16]!r} is not a port number")
    return int(raw)


def valid_scheme(raw: str | None) -> str:
    """The ``prometheus.io/scheme`` annotation (default http), or ValueError."""
    scheme = raw or "http"
    if scheme not in SCHEMES:
        raise ValueError(f"prometheus.io/scheme {scheme[:16]!r} is not http or https")
    return scheme


def valid_path(raw: str | None) -> str:
    """The ``prometheus.io/path`` annotation (default /metrics), or ValueError."""
    path = raw or "/metrics"
    if not PATH_RE.fullmatch(path):
        raise ValueError(f"prometheus.io/path {path[:40]!r} is not a plain URL path")
    return path


def command(
    *,
    port: int,
    scheme: str,
    path: str,
    names: tuple[str, ...],
    exact: bool = False,
    twice: bool = False,
) -> list[str]:
    """The exec command (an argv, never a shell line); ``exact``: also read the engine's
    request-level count (``GET /load`` on the same port, after the metrics); ``twice``
    (with ``exact`` only): read it all twice, ``TWICE_SPACING_S`` apart, each read's block
    ending in its own ``#end``."""
    if twice and not exact:
        raise ValueError("a double read is for the exact count only")
    mode = "exact2" if twice else "exact" if exact else "plain"
    return [*PYTHON, SCRIPT, str(port), scheme, path, mode, *names]


def quiet_command(
    *, port: int, scheme: str, path: str, names: tuple[str, ...], wait_s: float, window_s: float
) -> list[str]:
    """The ``quiet`` one-shot's argv: wait up to ``wait_s`` (0: not at all) for the engine's
    exact count to read 0, then read, keep a ``window_s`` quiet window, and read again."""
    if not 0 <= wait_s <= MAX_WAIT_S or not 0 < window_s <= MAX_WINDOW_S:
        raise ValueError("bad quiet-window arguments")
    return [
        *PYTHON, SCRIPT, str(port), scheme, path, "quiet",
        f"{wait_s:.3f}", f"{window_s:.3f}", *names,
    ]  # fmt: skip
