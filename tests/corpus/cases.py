"""Hand-picked malformed or hostile inputs, one list per seam (see the package docstring).

Every case has an ``id`` (the test id) and a ``value``.  A case whose ``bug`` is set shows a
known product bug: its test is marked ``xfail(strict=True, reason=bug)``, so the test starts
failing (and must be unmarked) the day the bug is fixed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

TARGET_IP = "198.18.1.5"  # the admitted member's address in every router case
OTHER_IP = "198.18.1.6"


@dataclass(frozen=True)
class Case:
    """One bad input."""

    id: str
    value: Any
    bug: str = ""


def params(cases: list[Case]) -> list[Any]:
    """``pytest.param``s of ``cases``, known bugs marked strict xfail."""
    return [
        pytest.param(
            c.value,
            id=c.id,
            marks=[pytest.mark.xfail(strict=True, reason=c.bug)] if c.bug else [],
        )
        for c in cases
    ]


# ------------------------------------------------------------------ one-shot output (vLLM)

_VLLM_OK = [
    "vllm:num_requests_running\t0.0",
    "vllm:num_requests_waiting\t0.0",
    "vllm:prompt_tokens_total\t10.0",
    "vllm:generation_tokens_total\t20.0",
]


def _out(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def _with_value(index: int, value: str) -> str:
    lines = list(_VLLM_OK)
    name = lines[index].split("\t")[0]
    lines[index] = f"{name}\t{value}"
    return _out(*lines, "#end")


ONESHOT_OUTPUT: list[Case] = [
    Case("empty", ("vLLM", "")),
    Case("only-newlines", ("vLLM", "\n\n\n")),
    Case("only-end", ("vLLM", "#end\n")),
    Case("no-end", ("vLLM", _out(*_VLLM_OK))),
    Case("end-twice", ("vLLM", _out(*_VLLM_OK, "#end", "#end"))),
    Case("line-after-end", ("vLLM", _out(*_VLLM_OK, "#end", "vllm:num_requests_running\t0"))),
    Case("error-line", ("vLLM", "#error\tGET failed: URLError\n")),
    Case("error-no-reason", ("vLLM", "#error\n")),
    Case("error-after-series", ("vLLM", _out(*_VLLM_OK, "#error\tboom", "#end"))),
    *[
        Case(
            f"missing-{line.split(chr(9))[0]}",
            ("vLLM", _out(*(x for x in _VLLM_OK if x != line), "#end")),
        )
        for line in _VLLM_OK
    ],
    Case("duplicate-series", ("vLLM", _out(*_VLLM_OK, _VLLM_OK[0], "#end"))),
    Case("value-nan", ("vLLM", _with_value(0, "nan"))),
    Case("value-NaN", ("vLLM", _with_value(1, "NaN"))),
    Case("value-inf", ("vLLM", _with_value(0, "inf"))),
    Case("value-minus-inf", ("vLLM", _with_value(2, "-inf"))),
    Case("value-overflow", ("vLLM", _with_value(0, "1e400"))),
    Case("value-negative", ("vLLM", _with_value(0, "-1"))),
    Case("value-negative-tiny", ("vLLM", _with_value(1, "-1e-300"))),
    Case("value-empty", ("vLLM", _with_value(0, ""))),
    Case("value-missing-marker", ("vLLM", _with_value(0, "missing"))),
    Case("value-invalid-marker", ("vLLM", _with_value(3, "invalid"))),
    Case("value-hex", ("vLLM", _with_value(0, "0x10"))),
    Case("value-bool", ("vLLM", _with_value(0, "True"))),
    Case("value-two-fields", ("vLLM", _with_value(0, "0\t1"))),
    Case("value-comment", ("vLLM", _with_value(0, "0 # idle"))),
    Case("value-nul", ("vLLM", _with_value(0, "0\x00"))),
    Case("value-huge-text", ("vLLM", _with_value(0, "9" * 5000 + "x"))),
    Case("no-tab", ("vLLM", _out("vllm:num_requests_running 0", *_VLLM_OK[1:], "#end"))),
    Case(
        "name-trailing-space",
        ("vLLM", _out("vllm:num_requests_running \t0", *_VLLM_OK[1:], "#end")),
    ),
    Case("name-upper", ("vLLM", _out("VLLM:NUM_REQUESTS_RUNNING\t0", *_VLLM_OK[1:], "#end"))),
    Case("unexpected-series", ("vLLM", _out(*_VLLM_OK, "vllm:other\t0", "#end"))),
    Case("sglang-series-for-vllm", ("vLLM", _out("sglang:num_running_reqs\t0", "#end"))),
    Case("tab-only", ("vLLM", _out("\t", "#end"))),
    Case(
        "unicode-name", ("vLLM", _out("vllm:num_requests_runn\u0456ng\t0", *_VLLM_OK[1:], "#end"))
    ),
    Case("bidi-override", ("vLLM", _out("\u202e" + _VLLM_OK[0], *_VLLM_OK[1:], "#end"))),
    Case("huge-garbage", ("vLLM", "x" * (1 << 20))),
    Case("many-lines", ("vLLM", _out(*(["vllm:num_requests_running\t0"] * 10000), "#end"))),
    Case("engine-lowercase", ("vllm", _out(*_VLLM_OK, "#end"))),
    Case("engine-empty", ("", _out(*_VLLM_OK, "#end"))),
    Case("engine-unknown", ("TGI", _out(*_VLLM_OK, "#end"))),
    Case("sglang-given-vllm-lines", ("SGLang", _out(*_VLLM_OK, "#end"))),
    Case(
        "sglang-missing-gauges",
        (
            "SGLang",
            _out(
                "sglang:num_running_reqs\t0",
                "sglang:num_requests_total\t1",
                "sglang:generation_tokens_total\t1",
                "#end",
            ),
        ),
    ),
]

# ------------------------------------------------------- metrics bodies (through the one-shot)

_PROM_OK = (
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0"} 0.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0"} 0.0\n'
    "# TYPE vllm:prompt_tokens counter\n"
    'vllm:prompt_tokens_total{engine="0"} 10.0\n'
    "# TYPE vllm:generation_tokens counter\n"
    'vllm:generation_tokens_total{engine="0"} 20.0\n'
)


def _prom(replace: str, by: str) -> bytes:
    assert replace in _PROM_OK
    return _PROM_OK.replace(replace, by, 1).encode()


METRICS_BODIES: list[Case] = [
    Case("empty", b""),
    Case("html", b"<html><body>502 Bad Gateway</body></html>\n"),
    Case("json", json.dumps({"vllm:num_requests_running": 0}).encode()),
    Case("binary", bytes(range(256)) * 4),
    Case("invalid-utf8", _PROM_OK.encode() + b"\xff\xfe\n"),
    Case("utf16", _PROM_OK.encode("utf-16")),
    Case("only-comments", b"# HELP nothing\n# TYPE nothing gauge\n"),
    Case("running-nan", _prom('running{engine="0"} 0.0', 'running{engine="0"} NaN')),
    Case("waiting-plus-inf", _prom('waiting{engine="0"} 0.0', 'waiting{engine="0"} +Inf')),
    Case(
        "prompt-negative",
        _prom('prompt_tokens_total{engine="0"} 10.0', 'prompt_tokens_total{engine="0"} -10.0'),
    ),
    Case("running-text", _prom('running{engine="0"} 0.0', 'running{engine="0"} zero')),
    Case("running-missing", _prom('vllm:num_requests_running{engine="0"} 0.0\n', "")),
    Case("counter-missing", _prom('vllm:generation_tokens_total{engine="0"} 20.0\n', "")),
    Case("broken-label", _prom('running{engine="0"} 0.0', 'running{engine="0} 0.0')),
    Case("unclosed-brace", _prom('running{engine="0"} 0.0', 'running{engine="0" 0.0')),
    Case("bad-timestamp", _prom('running{engine="0"} 0.0', 'running{engine="0"} 0.0 abc')),
    Case("nan-on-second-rank", _PROM_OK.encode() + b'vllm:num_requests_running{engine="1"} NaN\n'),
    Case(
        "negative-on-second-rank", _PROM_OK.encode() + b'vllm:num_requests_waiting{engine="1"} -1\n'
    ),
    Case("nul-byte", _prom("vllm:num_requests_running{", "vllm:num_requests_running\x00{")),
    Case("over-cap", _PROM_OK.encode() + b"# " + b"x" * (1 << 20) + b"\n"),
    Case("over-cap-by-one", _PROM_OK.encode() + b"#" * ((1 << 20) + 1 - len(_PROM_OK))),
    Case("sglang-body-for-vllm", b"sglang:num_running_reqs 0\nsglang:num_queue_reqs 0\n"),
    Case("truncated-mid-line", _PROM_OK.encode()[:-12]),
    Case("value-overflow", _prom('running{engine="0"} 0.0', 'running{engine="0"} 1e999')),
]

# ---------------------------------------------------------------- prometheus.io annotations


ANNOTATIONS: list[Case] = [
    *[
        Case(f"port-{i}", ("port", raw))
        for i, raw in enumerate(
            [
                None,
                "",
                "80a",
                "0",
                "65536",
                "-1",
                "8080 ",
                " 8080",
                "+80",
                "1e3",
                "999999",
                "0x50",
                "80.0",
                "8\u00b2",
                "\u00b2",
                "80\n",
                "http",
                "00000080",
                "8" * 1000,
            ]
        )
    ],
    *[
        Case(f"scheme-{i}", ("scheme", raw))
        for i, raw in enumerate(
            [
                "HTTP",
                "ftp",
                "file",
                "gopher",
                "http://",
                "https\n",
                " http",
                "\uff48ttp",
                "javascript",
                "unix",
                "h2c",
            ]
        )
    ],
    *[
        Case(f"path-{i}", ("path", raw))
        for i, raw in enumerate(
            [
                "metrics",
                "/metrics?x=1",
                "/metrics#frag",
                "/a b",
                "/m\u00e9trics",
                "/" + "a" * 201,
                "http://evil.example/metrics",
                "\\metrics",
                "/metrics;id",
                "/$(id)",
                "/`id`",
                "/\x00",
                "/%2e%2e/",
                "/metrics\r\nHost: x",
                " /metrics",
            ]
        )
    ],
    Case("path-trailing-newline", ("path", "/metrics\n")),
]

# ------------------------------------------------------------------ retry tokens, annotation

RETRY_TOKENS: list[Case] = [
    Case(f"token-{i}", raw)
    for i, raw in enumerate(
        [
            "",
            "-abc",
            ".abc",
            "_abc",
            "a" * 64,
            "a b",
            "a/b",
            "a:b",
            "t\u00f6k",
            "\u200babc",
            "abc\x00",
            "\uff41bc",
            "\U0001f600",
            "a" * 10000,
            " abc",
            "abc ",
            "a+b",
            "a@b",
            "${token}",
            None,
            123,
            1.5,
            ["abc"],
            {"token": "abc"},
        ]
    )
] + [Case("token-trailing-newline", "abc\n")]

RETRY_ANNOTATIONS: list[Case] = [
    Case(f"annotation-{i}", raw)
    for i, raw in enumerate(
        [
            "",
            "worker",
            "worker:1",
            "worker:1:t:x",
            "Worker:1:t",
            "WORKER:1:T",
            "worker:-1:t",
            "worker:1.0:t",
            "worker:abc:t",
            "worker:1234567:t",
            "worker::t",
            ":1:t",
            "worker:1:",
            "-worker:1:t",
            "worker-:1:t",
            "wor_ker:1:t",
            "w" * 64 + ":1:t",
            "worker: 1:t",
            "worker:1 :t",
            "worker:1:t ",
            "worker:0x1:t",
            "worker:1:-t",
            "worker:1:" + "t" * 64,
            "w\u00f6rker:1:t",
            "worker:1:t\u00f6k",
            "worker:+1:t",
            "worker:1e3:t",
            "::",
            "worker,1,t",
            "worker/1/t",
            " worker:1:t",
        ]
    )
] + [
    Case("annotation-role-newline", "worker\n:1:t"),
    Case("annotation-token-newline", "worker:1:t\n"),
    Case("annotation-ordinal-superscript", "worker:\u00b2:t"),
]

# ------------------------------------------------------------------ router answers

_T = f"http://{TARGET_IP}:8000"


def _answer(
    status: int, body: Any, content_type: str = "application/json"
) -> tuple[int, str, bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return status, content_type, raw


#: Answers that are wrong for both observers: each must read UNKNOWN (an error), never
#: "withdrawn".
ROUTER_ANSWERS_ANY: list[Case] = [
    Case("status-204", _answer(204, b"")),
    *[
        Case(f"status-{s}", _answer(s, {"urls": [], "workers": []}))
        for s in (301, 302, 400, 401, 403, 404, 429, 500, 502, 503, 504)
    ],
    Case("empty-body", _answer(200, b"")),
    Case("html", _answer(200, b"<html>ok</html>", "text/html")),
    Case("plain-text", _answer(200, b"OK", "text/plain")),
    Case("truncated-json", _answer(200, b'{"urls": ["http://198.18.1.5:8000"')),
    Case("invalid-utf8", _answer(200, b'{"urls": ["\xff\xfe"]}')),
    Case("bom-garbage", _answer(200, b"\xef\xbb\xbf\xff{")),
    Case("nul-bytes", _answer(200, b"\x00" * 64)),
    Case("json-null", _answer(200, None)),
    Case("json-number", _answer(200, 42)),
    Case("json-string", _answer(200, "workers")),
    Case("json-true", _answer(200, True)),
    Case("json-list", _answer(200, [_T])),
    Case("json-empty-object", _answer(200, {})),
    Case("unknown-keys", _answer(200, {"endpoints": [_T]})),
    Case("huge-garbage", _answer(200, b"x" * (4 << 20), "text/plain")),
    Case("deep-nesting", _answer(200, b"[" * 100000)),
    Case("deep-nesting-object", _answer(200, b'{"a":' * 100000)),
]

#: Answers wrong for the vllm-router observer (``GET /list_workers`` → ``{"urls": [...]}``).
ROUTER_ANSWERS_VLLM: list[Case] = [
    Case("urls-null", _answer(200, {"urls": None})),
    Case("urls-number", _answer(200, {"urls": 3})),
    Case("urls-string-with-target", _answer(200, {"urls": _T})),
    Case("urls-null-entry", _answer(200, {"urls": [None]})),
    Case("urls-number-entry", _answer(200, {"urls": [8000]})),
    Case("urls-object-entry", _answer(200, {"urls": [{"url": _T}]})),
    Case("urls-nan-entry", _answer(200, b'{"urls": [NaN]}')),
    Case("urls-hostname", _answer(200, {"urls": ["http://llm-0.llm.demo.svc:8000"]})),
    Case("urls-no-scheme", _answer(200, {"urls": [f"{TARGET_IP}:8000"]})),
    Case("urls-bad-ipv6", _answer(200, {"urls": ["http://[::1"]})),
    Case("sglang-shape", _answer(200, {"workers": [{"url": _T}]})),
]

#: Answers wrong for the SGLang gateway observer (``GET /workers`` → ``{"workers": [{url,id}]}``).
ROUTER_ANSWERS_SGLANG: list[Case] = [
    Case("workers-null", _answer(200, {"workers": None})),
    Case("workers-number", _answer(200, {"workers": 1})),
    Case("workers-string", _answer(200, {"workers": _T})),
    Case("workers-object", _answer(200, {"workers": {"url": _T}})),
    Case("worker-string", _answer(200, {"workers": [_T]})),
    Case("worker-list", _answer(200, {"workers": [[_T]]})),
    Case("worker-no-url", _answer(200, {"workers": [{"id": "w1"}]})),
    Case("worker-url-null", _answer(200, {"workers": [{"url": None, "id": "w1"}]})),
    Case("worker-url-number", _answer(200, {"workers": [{"url": 8000}]})),
    Case("worker-url-list", _answer(200, {"workers": [{"url": [_T]}]})),
    Case("worker-hostname", _answer(200, {"workers": [{"url": "http://llm-0:8000"}]})),
    Case("worker-bad-ipv6", _answer(200, {"workers": [{"url": "http://[fd00::5"}]})),
    Case("vllm-shape", _answer(200, {"urls": [_T]})),
]

# ------------------------------------------------------------------ Update / signal payloads

_REQ = {"namespace": "demo", "deployment": "llm", "role": "worker", "ordinal": 1}


def _req(**changes: Any) -> bytes:
    body = {**_REQ, **changes}
    return json.dumps({k: v for k, v in body.items() if v is not _DROP}).encode()


_DROP = object()

PAYLOADS: list[Case] = [
    # AbortRequest
    *[
        Case(f"abort-{i}", ("AbortRequest", raw))
        for i, raw in enumerate(
            [
                b"{}",
                b'{"reason": ""}',
                b'{"reason": "   "}',
                b'{"reason": "a\\nb"}',
                b'{"reason": "\\u0000"}',
                json.dumps({"reason": "x" * 257}).encode(),
                b'{"reason": null}',
                b'{"reason": 1}',
                b'{"reason": ["x"]}',
                b'{"reason": "x", "force": true}',
                b"[]",
                b'"stop"',
                b"null",
                b"1",
                b"true",
                b"not json",
                b"",
                b"\xff\xfe",
                b'{"reason": "\\u202e"}',
                b'{"reason": "\\ud800"}',
                b'{"REASON": "x"}',
                b"[" * 10000,
                b'{"reason": "x"',
                b'{"reason": {"text": "x"}}',
            ]
        )
    ],
    # RetryRequest
    *[
        Case(f"retry-{i}", ("RetryRequest", raw))
        for i, raw in enumerate(
            [
                b"{}",
                b'{"token": ""}',
                b'{"token": null}',
                b'{"token": 1}',
                b'{"token": "-x"}',
                b'{"token": "a b"}',
                json.dumps({"token": "a" * 64}).encode(),
                b'{"token": "x", "role": "worker"}',
                b'{"token": ["a"]}',
                b'{"token": "t\\u00f6k"}',
                b"[]",
                b'"abc"',
                b"null",
                b'{"token": true}',
            ]
        )
    ],
    Case("retry-token-newline", ("RetryRequest", b'{"token": "abc\\n"}')),
    # CancelIntent
    *[
        Case(f"cancel-{i}", ("CancelIntent", raw))
        for i, raw in enumerate(
            [
                json.dumps({"reason": "x" * 257}).encode(),
                b'{"reason": null}',
                b'{"reason": 1}',
                b'{"ordinal": 1}',
                b"[]",
                b'"cancel"',
                b"null",
                b"{",
            ]
        )
    ],
    # RetirementRequest (the workflow's input; the watcher and ``retire start`` build it)
    *[
        Case(f"request-{i}", ("RetirementRequest", raw))
        for i, raw in enumerate(
            [
                _req(namespace=""),
                _req(namespace="Default"),
                _req(namespace="a_b"),
                _req(namespace="a" * 64),
                _req(namespace=None),
                _req(namespace=1),
                _req(namespace=_DROP),
                _req(deployment="-llm"),
                _req(deployment="llm-"),
                _req(deployment="LLM"),
                _req(deployment="l" * 254),
                _req(deployment="llm/other"),
                _req(role="Worker"),
                _req(role="worker_1"),
                _req(role=""),
                _req(role="w" * 64),
                _req(role="w\u00f6rker"),
                _req(role=None),
                _req(role="worker\n"),
                _req(ordinal=-1),
                _req(ordinal=100001),
                _req(ordinal="one"),
                _req(ordinal=1.5),
                _req(ordinal=None),
                _req(ordinal=10**30),
                _req(intent="Delete"),
                _req(intent=None),
                _req(budgets={"overall_s": 0}),
                _req(budgets={"overall_s": -1}),
                _req(budgets={"drain_s": 86401}),
                _req(budgets={"poll_interval_s": 61}),
                _req(budgets={"withdrawal_s": 1, "poll_interval_s": 5}),
                _req(budgets={"overall_s": "forever"}),
                _req(budgets=None),
                _req(budgets=[]),
                _req(budgets={"skip_drain": True}),
                _req(routerless_policy="HOLD"),
                _req(routerless_policy="never"),
                _req(quiet_window_s=0),
                _req(quiet_window_s=601),
                _req(quiet_window_s=-1),
                _req(members=["p"] * 65),
                _req(members=[None]),
                _req(members="llm-0"),
                _req(attempt=0),
                _req(force=True),
                _req(history=[{}]),
                _req(history="none"),
                _req(last_consumed_retry_token=1),
                _req().replace(b'"ordinal": 1', b'"ordinal": NaN'),
                _req().replace(b'"ordinal": 1', b'"ordinal": Infinity'),
                _req(budgets={"drain_s": 1e309}),
            ]
        )
    ],
    Case("request-ordinal-true", ("RetirementRequest", _req(ordinal=True))),
]

# ------------------------------------------------------------------ CLI arguments

CLI_ARGS: list[Case] = [
    Case("no-args", []),
    Case("unknown-command", ["bogus", "demo/llm"]),
    Case("status-no-ref", ["status"]),
    Case("status-upper-ns", ["status", "Demo/llm"]),
    Case("status-bad-name", ["status", "Demo"]),
    Case("status-n-contradicts", ["status", "demo/llm", "-n", "other"]),
    Case("status-bad-n", ["status", "llm", "-n", "Bad_ns"]),
    Case("list-A-and-n", ["list", "-A", "-n", "demo"]),
    Case("list-bad-n", ["list", "-n", "x/y"]),
    Case("status-empty-md", ["status", "demo/"]),
    Case("status-empty-ns", ["status", "/llm"]),
    Case("status-extra-part", ["status", "demo/llm/x"]),
    Case("status-long-ns", ["status", "a" * 64 + "/llm"]),
    Case("status-unicode", ["status", "d\u00e9mo/llm"]),
    Case("status-space", ["status", "demo/ llm"]),
    Case("status-trailing-newline", ["status", "demo/llm\n"]),
    Case("status-two-refs", ["status", "demo/llm", "demo/other"]),
    Case("abort-no-reason", ["abort", "demo/llm"]),
    Case("abort-empty-reason", ["abort", "demo/llm", "--reason", ""]),
    Case("abort-blank-reason", ["abort", "demo/llm", "--reason", "   "]),
    Case("abort-nul-reason", ["abort", "demo/llm", "--reason", "stop\x01"]),
    Case("abort-newline-reason", ["abort", "demo/llm", "--reason", "a\nb"]),
    Case("abort-long-reason", ["abort", "demo/llm", "--reason", "x" * 257]),
    Case("retry-empty-token", ["retry", "demo/llm", "--token", ""]),
    Case("retry-dash-token", ["retry", "demo/llm", "--token=-x"]),
    Case("retry-space-token", ["retry", "demo/llm", "--token", "a b"]),
    Case("retry-long-token", ["retry", "demo/llm", "--token", "a" * 64]),
    Case("retry-unicode-token", ["retry", "demo/llm", "--token", "t\u00f6k"]),
    Case("start-no-role", ["start", "demo/llm", "--ordinal", "1"]),
    Case("start-no-ordinal", ["start", "demo/llm", "--role", "worker"]),
    Case("start-role-Worker", ["start", "demo/llm", "--role", "Worker", "--ordinal", "1"]),
    Case("start-role-underscore", ["start", "demo/llm", "--role", "w_1", "--ordinal", "1"]),
    Case("start-ordinal-negative", ["start", "demo/llm", "--role", "worker", "--ordinal=-1"]),
    Case("start-ordinal-text", ["start", "demo/llm", "--role", "worker", "--ordinal", "one"]),
    Case("start-ordinal-float", ["start", "demo/llm", "--role", "worker", "--ordinal", "1.5"]),
    Case("start-ordinal-huge", ["start", "demo/llm", "--role", "worker", "--ordinal", "100001"]),
    *[
        Case(
            f"start-budgets-{i}",
            ["start", "demo/llm", "--role", "worker", "--ordinal", "1", "--budgets", raw],
        )
        for i, raw in enumerate(
            [
                "not json",
                "[]",
                "null",
                '"300"',
                '{"overall_s": 0}',
                '{"x": 1}',
                '{"drain_s": NaN}',
                '{"overall_s": 1e999}',
                '{"poll_interval_s": 61}',
                "{",
                '{"overall_s": "300s"}',
            ]
        )
    ],
    Case(
        "start-budgets-deep",
        ["start", "demo/llm", "--role", "worker", "--ordinal", "1", "--budgets", "[" * 100000],
    ),
    Case(
        "start-policy",
        ["start", "demo/llm", "--role", "worker", "--ordinal", "1", "--routerless-policy", "never"],
    ),
    Case("cancel-no-ref", ["cancel-intent"]),
    Case("cancel-bad-ref", ["cancel-intent", "demo_x"]),
]

# ------------------------------------------------------------------ configuration

_CONFIG_OK: dict[str, Any] = {
    "address": "127.0.0.1:7233",
    "http_port": 7243,
    "ui_port": 8233,
    "metrics_port": 7253,
    "namespace": "default",
    "task_queue": "retirement",
    "db_filename": ".bed/temporal.sqlite",
    "search_attributes": {"RetirementDeployment": "Keyword", "RetirementOrdinal": "Int"},
    "dynamic_config": {"frontend.enableUpdateWorkflowExecution": True},
}


def _config(**changes: Any) -> str:
    body = {k: v for k, v in {**_CONFIG_OK, **changes}.items() if v is not _DROP}
    return yaml.safe_dump(body)


DEV_CONFIGS: list[Case] = [
    Case("empty-file", ""),
    Case("list", "- address\n- http_port\n"),
    Case("scalar", "127.0.0.1:7233\n"),
    Case("yaml-syntax", "address: [127.0.0.1\n"),
    Case("yaml-tab-indent", "address:\n\t- x\n"),
    Case("yaml-python-tag", "address: !!python/object/apply:os.system ['true']\n"),
    *[
        Case(f"missing-{k}", _config(**{k: _DROP}))
        for k in (
            "address",
            "http_port",
            "ui_port",
            "metrics_port",
            "namespace",
            "task_queue",
            "db_filename",
            "search_attributes",
        )
    ],
    Case("http-port-text", _config(http_port="http")),
    Case("http-port-null", _config(http_port=None)),
    Case("ui-port-list", _config(ui_port=[8233])),
    Case("metrics-port-map", _config(metrics_port={"port": 1})),
    Case("search-attributes-null", _config(search_attributes=None)),
    Case("search-attributes-list", _config(search_attributes=["RetirementRole"])),
    Case("search-attribute-kind", _config(search_attributes={"RetirementRole": "Text"})),
    Case("dynamic-config-list", _config(dynamic_config=["a"])),
    Case("dynamic-config-text", _config(dynamic_config="abc")),
    Case("address-no-port", _config(address="127.0.0.1")),
    Case("address-port-text", _config(address="127.0.0.1:grpc")),
    Case("http-port-negative", _config(http_port=-1)),
    Case("ui-port-too-big", _config(ui_port=70000)),
]

BUDGETS: list[Case] = [
    Case(f"budgets-{i}", raw)
    for i, raw in enumerate(
        [
            {"overall_s": 0},
            {"overall_s": -1},
            {"overall_s": 86401},
            {"overall_s": "x"},
            {"overall_s": None},
            {"overall_s": float("nan")},
            {"overall_s": float("inf")},
            {"withdrawal_s": 0},
            {"drain_s": -0.001},
            {"settle_s": 1e12},
            {"poll_interval_s": 0},
            {"poll_interval_s": 61},
            {"poll_interval_s": 40, "withdrawal_s": 30},
            {"poll_interval_s": 31, "settle_s": 30},
            {"unknown": 1},
            {"overall_s": [300]},
            {"overall_s": {"s": 300}},
            [],
            "300",
            None,
            300,
            {"drain_s": "240s"},
            {"overall_s": True, "withdrawal_s": False},
        ]
    )
]

# ------------------------------------------------------------------ role shapes, Pods


#: ``read_shape`` inputs that must not read as a supported shape.
SHAPES: list[Case] = [
    Case("size-0", ("vLLM", "Server", 0, [], None)),
    Case("size-negative", ("SGLang", "Server", -3, [], None)),
    Case("kind-Worker", ("vLLM", "Worker", 1, [], None)),
    Case("kind-lowercase", ("vLLM", "server", 1, [], None)),
    Case("kind-unicode", ("vLLM", "S\u0435rver", 1, [], None)),
    Case("engine-lowercase", ("vllm", "Server", 1, [], None)),
    Case("engine-empty", ("", "Server", 1, [], None)),
    Case("engine-unknown", ("TGI", "Server", 1, [], None)),
    Case("command-replaced", ("vLLM", "Server", 1, [], ["sh", "-c", "serve"])),
    Case("vllm-prefill", ("vLLM", "Prefill", 1, [], None)),
    Case("vllm-decode", ("vLLM", "Decode", 2, [], None)),
    Case("vllm-kv-transfer", ("vLLM", "Server", 1, ["--kv-transfer-config", "{}"], None)),
    Case(
        "vllm-external-and-hybrid",
        ("vLLM", "Server", 2, ["--data-parallel-external-lb", "--data-parallel-hybrid-lb"], None),
    ),
    Case("vllm-hybrid-multi", ("vLLM", "Server", 2, ["--data-parallel-hybrid-lb"], None)),
    Case("sglang-nnodes-text", ("SGLang", "Server", 2, ["--nnodes", "two"], None)),
    Case("sglang-nnodes-zero", ("SGLang", "Server", 1, ["--nnodes", "0"], None)),
    Case("sglang-nnodes-mismatch", ("SGLang", "Server", 1, ["--nnodes", "2"], None)),
    Case("sglang-nnodes-empty", ("SGLang", "Server", 1, ["--nnodes"], None)),
    Case("sglang-nnodes-negative", ("SGLang", "Server", 1, ["--nnodes=-1"], None)),
    Case(
        "sglang-nnodes-superscript",
        ("SGLang", "Server", 2, ["--nnodes", "\u00b2"], None),
    ),
    Case("sglang-dp-text", ("SGLang", "Server", 1, ["--dp-size", "x"], None)),
    Case("sglang-dp-zero", ("SGLang", "Server", 1, ["--data-parallel-size", "0"], None)),
    Case(
        "sglang-dp-superscript",
        ("SGLang", "Server", 1, ["--dp-size", "\u00b2"], None),
    ),
    Case(
        "sglang-prefill-server", ("SGLang", "Server", 1, ["--disaggregation-mode", "prefill"], None)
    ),
    Case("sglang-decode", ("SGLang", "Decode", 1, ["--disaggregation-mode", "decode"], None)),
    Case("sglang-mode-unknown", ("SGLang", "Server", 1, ["--disaggregation-mode", "both"], None)),
    Case("sglang-prefill-no-mode", ("SGLang", "Prefill", 1, [], None)),
]

#: (engine, size, extraArgs, member-index label of each member Pod; None = no label): a
#: supported shape whose members cannot be decided.
MEMBER_SETS: list[Case] = [
    Case("fewer-members", ("vLLM", 2, [], ["0"])),
    Case("more-members", ("vLLM", 2, [], ["0", "1", "2"])),
    Case("no-members-size-1", ("vLLM", 1, [], [])),
    Case("leader-missing", ("vLLM", 2, [], ["1", "1"])),
    Case("leader-duplicated", ("vLLM", 2, [], ["0", "0"])),
    Case("index-absent", ("vLLM", 2, [], ["0", None])),
    Case("index-text", ("vLLM", 2, [], ["0", "one"])),
    Case("index-negative", ("vLLM", 2, [], ["0", "-1"])),
    Case("index-beyond-size", ("vLLM", 2, [], ["0", "2"])),
    Case("index-padded", ("vLLM", 2, [], ["0", " 1"])),
    Case("index-duplicated-dp", ("vLLM", 3, ["--data-parallel-external-lb"], ["0", "1", "1"])),
    Case("index-empty", ("SGLang", 2, [], ["0", ""])),
    Case("index-superscript", ("vLLM", 2, [], ["0", "\u00b2"])),
]

#: Pod label sets that must not yield a removal intent (role ``worker``, replicas 1, size 1).
POD_LABELS: list[Case] = [
    Case(f"pod-{i}", labels)
    for i, labels in enumerate(
        [
            {},
            {"app.kubernetes.io/component": "worker"},
            {"modeldeployment.gpustack.ai/pod-ordinal": "1"},
            {
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": "",
            },
            {
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": "-1",
            },
            {
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": "one",
            },
            {
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": "1.0",
            },
            {
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": " 1",
            },
            {"app.kubernetes.io/component": "", "modeldeployment.gpustack.ai/pod-ordinal": "1"},
        ]
    )
]

#: Role names a hostile Pod label may carry: an intent derived from one must be refused by
#: the request model with a validation error.
ROLE_NAMES: list[Case] = [
    Case(f"role-{i}", name)
    for i, name in enumerate(
        [
            "Worker",
            "WORKER",
            "worker_1",
            "-worker",
            "worker-",
            "w" * 64,
            "w\u00f6rker",
            "worker.x" * 10,
            "wor ker",
            "\u0445\u0435worker",
        ]
    )
]

#: Every seam's hand-picked list, for the count.
SEAMS: dict[str, list[Case]] = {
    "one-shot output": ONESHOT_OUTPUT,
    "metrics bodies": METRICS_BODIES,
    "prometheus annotations": ANNOTATIONS,
    "retry tokens": RETRY_TOKENS,
    "retry annotations": RETRY_ANNOTATIONS,
    "router answers": ROUTER_ANSWERS_ANY + ROUTER_ANSWERS_VLLM + ROUTER_ANSWERS_SGLANG,
    "update/signal/request payloads": PAYLOADS,
    "CLI arguments": CLI_ARGS,
    "temporal-dev.yaml": DEV_CONFIGS,
    "budgets": BUDGETS,
    "role shapes": SHAPES,
    "member sets": MEMBER_SETS,
    "Pod labels": POD_LABELS,
    "role names": ROLE_NAMES,
}
