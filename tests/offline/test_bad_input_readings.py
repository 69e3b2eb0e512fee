"""Bad input on the drain seams: metrics bodies (through the real one-shot), one-shot
output, the ``prometheus.io/*`` annotations, and the drain rule.  Each reads UNKNOWN or
raises ValueError with a reason; none reads idle."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activities.oneshot import command, valid_path, valid_port, valid_scheme
from retirement.drain import DrainProgress, observe_round
from retirement.phases import Verdict
from retirement.readings import SERIES, Sample, parse_oneshot_output
from tests.corpus.cases import ANNOTATIONS, METRICS_BODIES, ONESHOT_OUTPUT, params

VLLM_IDLE = (
    "vllm:num_requests_running\t0.0\nvllm:num_requests_waiting\t0.0\n"
    "vllm:prompt_tokens_total\t10.0\nvllm:generation_tokens_total\t20.0\n#end\n"
)


def test_the_reference_output_reads_complete_and_idle() -> None:
    """The corpus mutates this output; it must itself be good."""
    s = parse_oneshot_output(engine="vLLM", stdout=VLLM_IDLE)
    assert s.complete and s.idle and s.counters == (10.0, 20.0)


# ------------------------------------------------------------------ one-shot output


@pytest.mark.parametrize("case", params(ONESHOT_OUTPUT))
def test_bad_oneshot_output_reads_unknown_with_a_reason(case: tuple[str, str]) -> None:
    engine, stdout = case
    s = parse_oneshot_output(engine=engine, stdout=stdout)
    assert not s.complete and not s.idle
    assert s.verdict is Verdict.UNKNOWN
    assert s.reason and len(s.reason) < 400


_LINES = VLLM_IDLE.splitlines()


@settings(max_examples=300, deadline=None)
@given(drop=st.sets(st.integers(0, len(_LINES) - 1), min_size=1))
def test_output_missing_any_line_reads_unknown(drop: set[int]) -> None:
    stdout = "\n".join(line for i, line in enumerate(_LINES) if i not in drop) + "\n"
    assert not parse_oneshot_output(engine="vLLM", stdout=stdout).complete


@settings(max_examples=300, deadline=None)
@given(
    index=st.integers(0, 3),
    value=st.text(max_size=20).filter(lambda v: "\n" not in v and "\r" not in v),
)
def test_a_value_that_is_not_a_finite_non_negative_number_reads_unknown(
    index: int, value: str
) -> None:
    lines = list(_LINES)
    lines[index] = lines[index].split("\t")[0] + "\t" + value
    s = parse_oneshot_output(engine="vLLM", stdout="\n".join(lines) + "\n")
    # Only what the one-shot prints counts: a plain decimal number, nothing around it
    # (``float()`` alone would also take ' 0', '0\x0c', '1_0' or '٣').
    plain = re.fullmatch(r"[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?", value) is not None
    ok = plain and float(value) != float("inf")
    assert s.complete is ok, (value, s)


@settings(max_examples=300, deadline=None)
@given(
    garbage=st.lists(st.text(max_size=60), min_size=1, max_size=5), at=st.integers(0, len(_LINES))
)
def test_inserted_lines_never_make_an_output_idle(garbage: list[str], at: int) -> None:
    lines = list(_LINES)
    lines[at:at] = garbage
    s = parse_oneshot_output(engine="vLLM", stdout="\n".join(lines) + "\n")
    if s.complete:  # only blank lines (or a duplicate #end before it) can be harmless
        assert all(not g.strip() or g in _LINES for g in garbage), garbage


# ------------------------------------------------------------------ metrics bodies


class _Bodies(BaseHTTPRequestHandler):
    bodies: ClassVar[dict[str, bytes]] = {}

    def do_GET(self) -> None:
        body = self.bodies.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def metrics_server() -> Iterator[int]:
    """One loopback server serving every corpus body at ``/body/<id>``."""
    _Bodies.bodies = {f"/body/{c.id}": c.value for c in METRICS_BODIES}
    _Bodies.bodies["/body/reference"] = (
        b'vllm:num_requests_running{engine="0"} 0.0\nvllm:num_requests_waiting 0.0\n'
        b"vllm:prompt_tokens_total 10.0\nvllm:generation_tokens_total 20.0\n"
    )
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Bodies)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


#: Runs the one-shot's script (the exact text ``command`` passes to ``python3 -c``) once per
#: path in one interpreter, so the corpus pays for one start-up instead of one per body.
_DRIVER = """
import contextlib, io, json, sys
script, port, names, paths = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4:]
out = {}
for path in paths:
    buf = io.StringIO()
    sys.argv = ["-c", port, "http", path, "plain", *names]
    with contextlib.redirect_stdout(buf):
        try:
            exec(compile(script, "<oneshot>", "exec"), {"__name__": "__main__"})
        except SystemExit:
            pass
    out[path] = buf.getvalue()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def oneshot_outputs(metrics_server: int) -> dict[str, str]:
    """The real one-shot's output for every corpus body, keyed by case id."""
    names = SERIES["vLLM"].all
    argv = command(port=metrics_server, scheme="http", path="/metrics", names=names)
    script = argv[2]
    ids = ["reference", *(c.id for c in METRICS_BODIES)]
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _DRIVER,
            script,
            str(metrics_server),
            json.dumps(names),
            *(f"/body/{i}" for i in ids),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    outputs: dict[str, str] = json.loads(done.stdout)
    return {i: outputs[f"/body/{i}"] for i in ids}


def test_the_reference_body_reads_complete(oneshot_outputs: dict[str, str]) -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=oneshot_outputs["reference"])
    assert s.complete and s.idle, s


@pytest.mark.parametrize("case_id", [pytest.param(c.id, id=c.id) for c in METRICS_BODIES])
def test_bad_metrics_body_reads_unknown(oneshot_outputs: dict[str, str], case_id: str) -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=oneshot_outputs[case_id])
    assert not s.complete and not s.idle, (case_id, oneshot_outputs[case_id][:300])
    assert s.reason


# ------------------------------------------------------------------ annotations

_VALIDATORS = {"port": valid_port, "scheme": valid_scheme, "path": valid_path}


@pytest.mark.parametrize("case", params(ANNOTATIONS))
def test_bad_prometheus_annotation_is_refused_with_a_reason(case: tuple[str, str | None]) -> None:
    kind, raw = case
    with pytest.raises(ValueError, match=r"\S"):
        _VALIDATORS[kind](raw)


@settings(max_examples=300, deadline=None)
@given(raw=st.text(max_size=30))
def test_any_port_annotation_is_a_port_or_a_value_error(raw: str) -> None:
    try:
        port = valid_port(raw)
    except ValueError:
        return
    assert 0 < port < 65536 and raw.isdigit()


@settings(max_examples=300, deadline=None)
@given(raw=st.text(max_size=60))
def test_any_path_annotation_is_a_plain_path_or_a_value_error(raw: str) -> None:
    try:
        path = valid_path(raw)
    except ValueError:
        return
    assert path.startswith("/") and path.isascii() and path.isprintable() and " " not in path
    assert not set(path) & set("?#;$`\\'\"<>%")


# ------------------------------------------------------------------ the drain rule

IDLE = parse_oneshot_output(engine="vLLM", stdout=VLLM_IDLE)


@pytest.mark.parametrize("case", params(ONESHOT_OUTPUT))
def test_a_bad_read_between_idle_reads_never_verifies(case: tuple[str, str]) -> None:
    engine, stdout = case
    bad = parse_oneshot_output(engine=engine, stdout=stdout)
    progress, verdict, _ = observe_round(DrainProgress(), measured=("m",), samples={"m": IDLE})
    assert verdict is Verdict.UNKNOWN
    progress, verdict, reason = observe_round(progress, measured=("m",), samples={"m": bad})
    assert verdict is Verdict.UNKNOWN and reason
    assert progress.previous_idle is None
    _, verdict, _ = observe_round(progress, measured=("m",), samples={"m": IDLE})
    assert verdict is Verdict.UNKNOWN  # one idle read after a bad one is not enough


@pytest.mark.parametrize(
    ("measured", "samples"),
    [
        ((), {}),
        (("m",), {}),
        (("m",), {"other": IDLE}),
        (("m", "n"), {"m": IDLE}),
        (("m",), {"m": Sample(complete=True, in_flight=float("nan"), counters=(1.0,))}),
        (("m",), {"m": Sample(complete=True, in_flight=-1.0, counters=(1.0,))}),
        (("m",), {"m": Sample(complete=True, in_flight=float("inf"), counters=(1.0,))}),
    ],
    ids=[
        "nothing-measured",
        "no-read",
        "read-of-another-member",
        "one-of-two-read",
        "in-flight-nan",
        "in-flight-negative",
        "in-flight-inf",
    ],
)
def test_drain_rounds_that_cannot_be_judged_hold(
    measured: tuple[str, ...], samples: dict[str, Sample]
) -> None:
    progress = DrainProgress()
    for _ in range(3):
        progress, verdict, reason = observe_round(progress, measured=measured, samples=samples)
        assert verdict is Verdict.UNKNOWN and reason


def test_nan_counters_never_compare_unchanged() -> None:
    def nan() -> Sample:
        return Sample.model_validate_json('{"complete": true, "counters": [NaN, 1.0]}')

    progress, _, _ = observe_round(DrainProgress(), measured=("m",), samples={"m": nan()})
    _, verdict, reason = observe_round(progress, measured=("m",), samples={"m": nan()})
    assert verdict is Verdict.UNKNOWN and "moved" in reason


@pytest.mark.parametrize(
    "details",
    [
        {"rounds": -1, "previous_idle": None, "extra": 1},
        {"rounds": "many"},
        {"previous_idle": {"m": {"complete": "maybe"}}},
        {"previous_idle": {"m": {"complete": True, "in_flight": "zero"}}},
        {"previous_idle": [1, 2]},
        [],
        "resume",
    ],
    ids=[
        "unknown-field",
        "rounds-text",
        "sample-complete-text",
        "sample-in-flight-text",
        "previous-list",
        "list",
        "text",
    ],
)
def test_hostile_heartbeat_details_do_not_validate_as_drain_progress(details: Any) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        DrainProgress.model_validate(details)
