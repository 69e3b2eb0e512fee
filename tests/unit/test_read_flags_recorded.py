"""``read_flags`` against its own recorded answers: argument lists generated from both
engines' option tables and their corruptions (truncations, underscores, ``--no-`` forms,
glued and ``=`` values, JSON fields, words with spaces, negative numbers, ``--``), each with
the values and problems the reader gave when they were recorded.

The answers were recorded (commit bb5ea2a) from the single-function ``read_flags`` of
``retirement/shape.py``, before it became the package ``retirement/shape/`` and the reader a
tokenizer and one function per token kind: this test is the proof that the rewrite reads
every recorded list exactly as the old reader did, values and problem texts alike.  The
list exercises every line of the old reader.  Do not re-record it to make a change pass: a
change of behaviour is a change of these answers, made on purpose, case by case.
(``python -m tests.unit.test_read_flags_recorded`` prints a fresh recording, to compare
with, never to copy over blindly.)
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from retirement.shape import _TABLES, read_flags

CASES_FILE = Path(__file__).with_name("read_flags_cases.json")
ENGINES = ("vLLM", "SGLang")
SEED = 21
PER_ENGINE = 1000


def _spellings() -> list[str]:
    """Every spelling of both tables (ours and neighbours), plain and with a value."""
    return sorted(
        {w for t in _TABLES.values() for f in t for n in f.spellings() for w in (n, n + "=1")}
    )


def _vocabulary() -> list[str]:
    """Tokens: every spelling of both tables, corrupted in the ways a hand-written command
    line is, and the words around them."""
    words: list[str] = []
    for table in _TABLES.values():
        for flag in table:
            for name in flag.spellings():
                words += [name + "=", name + " 2"]
                words.append(name[: max(2, len(name) - 3)])
                words.append(name[: max(3, len(name) // 2)])
                if name.startswith("--"):
                    words.append("--" + name[2:].replace("-", "_"))
                    words.append(name + ".field")
                    words.append("--no-" + name[2:])
                else:
                    words += [name + "2", name + "=2", name[:2], name[:2] + "=1"]
    words += [
        "--kv-transfer-config.kv_role",
        "--kv_transfer_config.kv_role=kv_both",
        "--unknown.field",
        "--data_parallel_size.x=1",
        "--tp_size",
        "--tp_size=2",
        "--dp_size",
        "--no-nnodes",
        "--no-foo",
        "--ep",
        "--ep=1",
        "-O3",
        "-O",
        "-sc",
        "-dc",
        "-d",
        "-d=1",
        "-x",
        "-n2",
        "-r1",
        "-dp2",
        "-dpe1",
        "-asc=1",
        "--enforce-eager",
        "--max-model-len",
        "x y",
        "-dp 2 extra",
        "--data-parallel-size 2",
        "--host 0.0.0.0",
    ]
    return sorted(set(words))


_VALUES = [
    "1",
    "0",
    "2",
    "-1",
    "-.5",
    "-1.5",
    "-",
    "--",
    "two",
    "true",
    "false",
    "yes",
    "no",
    "on",
    "off",
    "TRUE",
    " true",
    "$(GPUSTACK_MEMBER_INDEX)",
    "/models",
]


def generate() -> list[dict[str, Any]]:
    """The recorded argument lists (inputs only), deterministic for ``SEED``."""
    rnd = random.Random(SEED)
    spellings, vocabulary = _spellings(), _vocabulary()
    cases: list[dict[str, Any]] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for engine in ENGINES:
        while sum(1 for c in cases if c["engine"] == engine) < PER_ENGINE:
            args = [
                rnd.choice((_VALUES, _VALUES, spellings, spellings, spellings, vocabulary)[i])
                for i in (rnd.randrange(6) for _ in range(rnd.randint(0, 7)))
            ]
            key = (engine, tuple(args))
            if key not in seen:
                seen.add(key)
                cases.append({"engine": engine, "args": args})
    cases.append({"engine": "TGI", "args": ["--data-parallel-size", "2"]})
    cases.append({"engine": "", "args": ["-dpe"]})
    return cases


def record() -> list[dict[str, Any]]:
    """The generated lists with the answers the current ``read_flags`` gives."""
    out = []
    for case in generate():
        reading = read_flags(case["engine"], case["args"])
        out.append({**case, "values": dict(reading.values), "problems": list(reading.problems)})
    return out


def _load() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads(CASES_FILE.read_text(encoding="utf-8"))
    return cases


def test_the_recording_is_the_generated_lists() -> None:
    """The recorded inputs are still exactly the generated ones (the generator was not
    changed under the recording)."""
    assert [{"engine": c["engine"], "args": c["args"]} for c in _load()] == generate()


@pytest.mark.parametrize("engine", [*ENGINES, "other"])
def test_read_flags_gives_the_recorded_answers(engine: str) -> None:
    wrong = []
    for case in _load():
        if (case["engine"] if case["engine"] in ENGINES else "other") != engine:
            continue
        reading = read_flags(case["engine"], case["args"])
        got = {"values": dict(reading.values), "problems": list(reading.problems)}
        want = {"values": case["values"], "problems": case["problems"]}
        # Values compared as ordered pairs too: the reader's dict order is part of its answer.
        if got != want or list(got["values"].items()) != list(want["values"].items()):
            wrong.append((case["args"], got, want))
    assert not wrong, f"{len(wrong)} lists read differently, first: {wrong[0]}"


if __name__ == "__main__":
    lines = [json.dumps(case, ensure_ascii=False) for case in record()]
    sys.stdout.write("[\n" + ",\n".join(lines) + "\n]\n")
