"""The one-shot's own exposition-format parser (``activities.oneshot.PARSER``): on every
well-formed body its sums equal ``prometheus_client``'s; any malformed line fails the whole
read; and the whole one-shot runs on the standard library alone (``python3 -I -S``: no
``site``, so no ``prometheus_client``), which is what makes a drain read cheap."""

from __future__ import annotations

import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from activities.oneshot import PARSER, command
from retirement.readings import SERIES, parse_oneshot_output
from testbed.emulator import EngineEmulator

NAMES = SERIES["vLLM"].all


def _load() -> Callable[[str, tuple[str, ...]], tuple[dict[str, float], set[str], set[str]]]:
    scope: dict[str, Any] = {}
    exec(compile(PARSER, "<oneshot parser>", "exec"), scope)
    parse: Callable[[str, tuple[str, ...]], tuple[dict[str, float], set[str], set[str]]]
    parse = scope["parse"]
    return parse


parse = _load()


def reference(text: str, names: tuple[str, ...]) -> tuple[dict[str, float], set[str], set[str]]:
    """The same sums through prometheus_client's parser."""
    sums = dict.fromkeys(names, 0.0)
    seen: set[str] = set()
    bad: set[str] = set()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in sums:
                seen.add(s.name)
                v = float(s.value)
                if math.isnan(v) or math.isinf(v) or v < 0:
                    bad.add(s.name)
                else:
                    sums[s.name] += v
    return sums, seen, bad


_label_value = st.text(
    alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\n"), max_size=12
).map(lambda v: v.replace("\\", "\\\\").replace('"', '\\"'))
_labels = st.dictionaries(
    # Label names as the exposition format allows them: a leading "__" is reserved (the
    # reference parser refuses it; no engine emits one).
    st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,8}", fullmatch=True).filter(
        lambda name: not name.startswith("__")
    ),
    _label_value,
    max_size=3,
)
_value = st.one_of(
    st.floats(min_value=0, max_value=1e12, allow_nan=False).map(repr),
    st.integers(min_value=0, max_value=10**9).map(str),
    st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "-0.5", "1e3", "0"]),
)
_name = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(["vllm:other_total", "process_cpu_seconds_total", "up"]),
)


@st.composite
def bodies(draw: st.DrawFn) -> str:
    lines: list[str] = []
    for _ in range(draw(st.integers(min_value=0, max_value=12))):
        kind = draw(st.sampled_from(["sample", "sample", "sample", "help", "blank"]))
        name = draw(_name)
        if kind == "help":
            lines.append(f"# HELP {name} something")
            continue
        if kind == "blank":
            lines.append("")
            continue
        labels = draw(_labels)
        label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        braces = f"{{{label_text}}}" if labels or draw(st.booleans()) else ""
        stamp = f" {draw(st.integers(min_value=0, max_value=2**40))}" if draw(st.booleans()) else ""
        lines.append(f"{name}{braces} {draw(_value)}{stamp}")
    return "\n".join(lines) + "\n"


@settings(max_examples=400, deadline=None)
@given(body=bodies())
def test_sums_equal_prometheus_clients_on_well_formed_bodies(body: str) -> None:
    sums, seen, bad = parse(body, NAMES)
    ref_sums, ref_seen, ref_bad = reference(body, NAMES)
    assert seen == ref_seen and bad == ref_bad
    for n in NAMES:
        assert sums[n] == pytest.approx(ref_sums[n], rel=1e-12, abs=0.0)


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{engine="0"} zero',
        'vllm:num_requests_running{engine="0} 0',
        'vllm:num_requests_running{engine="0" 0',
        "vllm:num_requests_running 0 abc",
        "vllm:num_requests_running\x00 0",
        "vllm:num_requests_running",
        '{engine="0"} 0',
        "vllm:num_requests_running 0_0",
        "0metric 1",
        "<html>502</html>",
    ],
)
def test_a_malformed_line_of_any_series_fails_the_whole_read(line: str) -> None:
    good = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
    with pytest.raises(ValueError):
        parse(good + line + "\n", NAMES)
    with pytest.raises(ValueError):  # also when it names no expected series
        parse(good + line.replace("vllm:num_requests_running", "other_series") + "\n", NAMES)


def test_the_one_shot_runs_on_the_standard_library_alone(vllm: EngineEmulator) -> None:
    """``-I -S``, as the one-shot starts on the node: no site-packages, so
    ``prometheus_client`` cannot be imported; the one-shot reads the emulated engine
    completely all the same."""
    vllm.set_stale_gauges(2, 1)
    argv = command(port=vllm.metrics_port, scheme="http", path="/metrics", names=NAMES)
    assert argv[:2] == ["python3", "-ISc"]  # isolated, no site, then the code
    argv[0] = sys.executable
    out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout
    s = parse_oneshot_output(engine="vLLM", stdout=out)
    assert s.complete and s.in_flight == 3, out
