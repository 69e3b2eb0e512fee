"""The fixed python3 one-shot a drain read runs inside the member's ``main`` container.

No string from any object is spliced into the command: the script is this constant, and
its arguments are a validated port number, a scheme from an allow-list, a path that passed
a strict pattern, and the expected series names (constants of this project).  It GETs the
engine's metrics over loopback with a 2 s timeout and a 1 MiB body cap, sums each expected
series over its label sets with prometheus_client's parser (the vLLM and SGLang images
ship it), and prints ``name<TAB>value`` lines then ``#end``, or ``#error<TAB>reason``.
It reads only; it writes nothing.
"""

from __future__ import annotations

import re

from retirement.text import is_decimal

BODY_CAP = 1 << 20
HTTP_TIMEOUT_S = 2.0
EXEC_TIMEOUT_S = 5.0
PATH_RE = re.compile(r"^/[A-Za-z0-9._~/-]{0,200}$")
SCHEMES = ("http", "https")

SCRIPT = r"""
import math, ssl, sys, urllib.request
def fail(reason):
    print("#error\t" + reason); sys.exit(0)
try:
    port = int(sys.argv[1]); scheme = sys.argv[2]; path = sys.argv[3]; names = sys.argv[4:]
except (IndexError, ValueError):
    fail("bad arguments")
if not 0 < port < 65536 or scheme not in ("http", "https") or not path.startswith("/"):
    fail("bad arguments")
handlers = [urllib.request.ProxyHandler({})]
if scheme == "https":
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    handlers.append(urllib.request.HTTPSHandler(context=ctx))
opener = urllib.request.build_opener(*handlers)
try:
    with opener.open("%s://127.0.0.1:%d%s" % (scheme, port, path), timeout=%(timeout)s) as r:
        body = r.read(%(cap)d + 1)
except Exception as e:
    fail("GET failed: " + type(e).__name__)
if len(body) > %(cap)d:
    fail("body over the 1 MiB cap")
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    fail("prometheus_client is not importable in the container")
sums = {n: 0.0 for n in names}; seen = set(); bad = set()
try:
    for family in text_string_to_metric_families(body.decode("utf-8")):
        for s in family.samples:
            if s.name in sums:
                seen.add(s.name)
                v = float(s.value)
                if math.isnan(v) or math.isinf(v) or v < 0:
                    bad.add(s.name)
                else:
                    sums[s.name] += v
except Exception as e:
    fail("malformed metrics: " + type(e).__name__)
for n in names:
    print(n + "\t" + ("invalid" if n in bad else repr(sums[n]) if n in seen else "missing"))
print("#end")
""".replace("%(timeout)s", repr(HTTP_TIMEOUT_S)).replace("%(cap)d", str(BODY_CAP))


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


def command(*, port: int, scheme: str, path: str, names: tuple[str, ...]) -> list[str]:
    """The exec command (an argv, never a shell line)."""
    return ["python3", "-c", SCRIPT, str(port), scheme, path, *names]
