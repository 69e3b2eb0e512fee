"""An argument list read as the engine's own parser reads it (``read_flags``): every
spelling of one option is that option, the last occurrence wins, and a token the engine
would refuse, or that could be several options, is a problem that makes the shape
undecidable, never a guess.  The engines' spellings are in ``engines``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from retirement.shape.engines import _TABLES, _VLLM_SHORT_OTHERS, _Flag, _Kind

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's own test
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


def parse_flags(args: Sequence[str]) -> dict[str, list[str]]:
    """``--flag value`` / ``--flag=value`` / ``--flag`` into ``{flag: [values...]}``.

    A bare flag maps to ``[""]``.  Non-flag words that follow a flag are its value; a word
    before any flag is ignored (it is not a flag this module reads).  Engine-agnostic and
    spelling-blind: the shape is never read through it but through ``read_flags``, which
    reads each engine's spellings as that engine's parser does.
    """
    flags: dict[str, list[str]] = {}
    current: str | None = None
    for raw in args:
        word = str(raw)
        if word.startswith("--"):
            name, eq, value = word.partition("=")
            flags.setdefault(name, [])
            if eq:
                flags[name].append(value)
                current = None
            else:
                current = name
        elif current is not None:
            flags[current].append(word)
            current = None
    for values in flags.values():
        if not values:
            values.append("")
    return flags


@dataclass(frozen=True)
class FlagReading:
    """An argument list as one engine's parser reads it: the last value of each option
    this module reads, by canonical spelling (booleans as "true"/"false"), and every token
    the engine would refuse or that cannot be read as one option."""

    values: Mapping[str, str] = field(default_factory=dict)
    problems: tuple[str, ...] = ()


def _vllm_key(key: str) -> str:
    """FlexibleArgumentParser's rewrite: underscores to dashes between "--" and the first "."."""
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _consumable(token: str) -> bool:
    """Whether argparse takes ``token`` as the value of the option before it."""
    return not token.startswith("-") or token == "-" or bool(_NEGATIVE_NUMBER.match(token))


def _ours(table: tuple[_Flag, ...]) -> dict[str, tuple[_Flag, bool]]:
    """Every spelling of the table -> (its option, whether it is a ``--no-`` form)."""
    out: dict[str, tuple[_Flag, bool]] = {}
    for flag in table:
        for name in flag.names:
            out[name] = (flag, False)
        for name in flag.spellings()[len(flag.names) :]:
            out[name] = (flag, True)
    return out


def _foreign(engine: str) -> dict[str, str]:
    """The spellings of the other engines' options that ``engine`` does not register, to
    the phrase naming them ("a vLLM")."""
    own = set(_ours(_TABLES[engine]))
    out: dict[str, str] = {}
    for other, table in _TABLES.items():
        if other == engine:
            continue
        for name, (flag, _) in _ours(table).items():
            if flag.ours and name not in own and flag.canonical != "--config":
                out.setdefault(name, f"a {other}")
    return out


def read_flags(engine: str, args: Sequence[object]) -> FlagReading:
    """Read ``args`` as ``engine``'s parser reads them: every spelling of one option is that
    option (vLLM's underscores, ``--flag=value`` and ``--flag value``, short aliases,
    ``--no-`` booleans, unique prefixes), and the last occurrence wins.  A token the engine
    would refuse or that could be several options is a problem, with the reason; a token
    that is not one of the options read here is left alone, as the engine's business.
    An engine with no table reads nothing."""
    table = _TABLES.get(engine)
    if table is None:
        return FlagReading()
    spellings = _ours(table)
    long_names = [s for s in spellings if s.startswith("--")]
    short_names = [s for s in spellings if not s.startswith("--")]
    short_all = short_names + (list(_VLLM_SHORT_OTHERS) if engine == "vLLM" else [])
    mine_short = [n for n in short_names if spellings[n][0].ours]
    foreign = _foreign(engine)
    values: dict[str, str] = {}
    problems: list[str] = []
    tokens = [str(t) for t in args]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            break  # everything after is positional
        if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
            continue
        key, eq, inline = token.partition("=")
        match: tuple[_Flag, bool] | None = None
        shown = key
        if token.startswith("--"):
            if engine == "vLLM":
                key = _vllm_key(key)
                if "." in key:  # --key.sub value: a JSON field of --key
                    head = key.partition(".")[0]
                    if not eq and i < len(tokens):
                        i += 1
                    if head == "--kv-transfer-config":
                        values[head] = "{…}"
                    elif head in spellings and spellings[head][0].ours:
                        problems.append(f"{token!r}: {head} takes no JSON fields")
                    continue
            match = spellings.get(key)
            if match is None:
                found = sorted(n for n in long_names if n.startswith(key) and len(key) > 2)
                mine = [n for n in found if spellings[n][0].ours]
                if len(found) > 1 and mine:
                    problems.append(
                        f"{token!r} is an ambiguous abbreviation ({', '.join(found[:4])}): "
                        f"{engine} refuses it"
                    )
                    continue
                if len(found) == 1:
                    match = spellings[found[0]]
            positive = spellings.get("--" + key[5:]) if key.startswith("--no-") else None
            if match is None and positive is not None and positive[0].ours:
                problems.append(f"{token!r}: --{key[5:]} has no --no- form; {engine} refuses it")
                continue
            dashed = key.replace("_", "-")
            if (
                match is None
                and engine == "SGLang"
                and dashed != key
                and any(n.startswith(dashed) for n in long_names)
            ):
                problems.append(
                    f"{token!r}: SGLang does not read underscores in flags and refuses it"
                )
                continue
        else:
            match = spellings.get(key)
            if match is None and " " not in token:
                if not eq and len(token) > 2 and token[:2] in spellings:
                    match, inline, eq = spellings[token[:2]], token[2:], "="  # -n2: -n "2"
                elif key in short_all:
                    pass  # an exact option of the engine's that is not read here
                else:
                    found = sorted(n for n in short_all if n.startswith(key))
                    mine = [n for n in found if n in spellings and spellings[n][0].ours]
                    if len(found) == 1 and mine:
                        if eq:
                            problems.append(
                                f"{token!r}: argparse reads the abbreviation {key}= only from "
                                f"Python 3.12; write {found[0]}"
                            )
                            continue
                        match = spellings[found[0]]
                    elif len(found) > 1 and mine:
                        problems.append(
                            f"{token!r} is an ambiguous abbreviation ({', '.join(found[:4])}): "
                            f"{engine} refuses it"
                        )
                        continue
                    else:
                        glued = [n for n in mine_short if token.startswith(n)]
                        if glued:
                            problems.append(
                                f"{token!r}: {engine} refuses a value glued to "
                                f"{max(glued, key=len)} (write it as a separate word or "
                                "after '=')"
                            )
                            continue
        if match is None and key in foreign:
            problems.append(f"{shown} is {foreign[key]} spelling: {engine} does not read it")
            continue
        if match is None:
            if " " in token:
                first = token.split()[0]
                inner = read_flags(engine, [first, "x"]) if first != token else FlagReading()
                if inner.values:
                    problems.append(
                        f"{token!r} is one argument: {engine} reads it as a positional word, "
                        "not as an option (split it into separate list items)"
                    )
            continue
        flag, negated = match
        if not flag.ours:
            continue
        name = flag.canonical
        if flag.kind is _Kind.VALUE:
            if eq:
                value = inline
            elif i < len(tokens) and _consumable(tokens[i]):
                value = tokens[i]
                i += 1
            else:
                problems.append(f"{shown} has no value: {engine} refuses it")
                continue
            values[name] = value
            continue
        if eq:
            problems.append(f"{token!r}: {shown} takes no value and {engine} refuses one")
            continue
        if i < len(tokens) and tokens[i].strip().lower() in _BOOL_WORDS:
            problems.append(
                f"{shown} takes no value: the {tokens[i]!r} after it is read as a separate "
                "argument, not as its value"
            )
            i += 1
            continue
        values[name] = "false" if negated else "true"
    return FlagReading(values=values, problems=tuple(problems))
