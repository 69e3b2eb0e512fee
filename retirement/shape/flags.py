"""An argument list read as the engine's own parser reads it (``read_flags``): every
spelling of one option is that option, the last occurrence wins, and a token the engine
would refuse, or that could be several options, is a problem that makes the shape
undecidable, never a guess.  The engines' spellings are in ``engines``."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

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


class _TokenKind(Enum):
    END = "end"  # "--": every token after it is positional
    POSITIONAL = "positional"  # a word, "-" or a negative number: no option
    FIELD = "field"  # vLLM's --key.sub: a JSON field of --key
    LONG = "long"  # --key, --key=value
    SHORT = "short"  # -k, -k=value, -kvalue


@dataclass(frozen=True)
class _Token:
    """One argument as the engine's parser first sees it."""

    text: str  # as written
    kind: _TokenKind
    key: str = ""  # the option part, before any "=" (vLLM: underscores rewritten)
    shown: str = ""  # the option part as written
    eq: bool = False  # whether a value follows "="
    inline: str = ""  # that value


def _token(engine: str, text: str) -> _Token:
    """The tokenizer: what kind of argument ``text`` is to ``engine``'s parser."""
    if text == "--":
        return _Token(text, _TokenKind.END)
    if _consumable(text):  # what an option could take as its value is no option itself
        return _Token(text, _TokenKind.POSITIONAL)
    key, eq, inline = text.partition("=")
    kind, shown = _TokenKind.SHORT, key
    if text.startswith("--"):
        kind = _TokenKind.LONG
        if engine == "vLLM":
            key = _vllm_key(key)
            if "." in key:
                kind = _TokenKind.FIELD
    return _Token(text, kind, key, shown, bool(eq), inline)


@dataclass(frozen=True)
class _Match:
    """The option a token names, and its value after "=" (or glued, ``-n2``), if any."""

    flag: _Flag
    negated: bool  # a --no- form
    eq: bool
    inline: str


class _Outcome(Enum):
    UNKNOWN = "unknown"  # no option read here: only the foreign and one-word checks remain
    DONE = "done"  # read: a problem recorded, or nothing to read


class _Reader:
    """One engine's parser over one argument list: the position in it, the values read and
    the problems found.  ``read`` takes each token by kind, through the tokenizer."""

    def __init__(self, engine: str, table: tuple[_Flag, ...], tokens: list[str]) -> None:
        self.engine = engine
        self.spellings = _ours(table)
        self.long_names = [s for s in self.spellings if s.startswith("--")]
        short_names = [s for s in self.spellings if not s.startswith("--")]
        self.short_all = short_names + (list(_VLLM_SHORT_OTHERS) if engine == "vLLM" else [])
        self.mine_short = [n for n in short_names if self.spellings[n][0].ours]
        self.foreign = _foreign(engine)
        self.tokens = tokens
        self.at = 0  # the next token
        self.values: dict[str, str] = {}
        self.problems: list[str] = []

    def read(self) -> FlagReading:
        """Every token up to the end or to "--", by kind; the reading."""
        while self.at < len(self.tokens):
            token = _token(self.engine, self.tokens[self.at])
            self.at += 1
            if token.kind is _TokenKind.END:
                break
            if token.kind is _TokenKind.POSITIONAL:
                continue
            if token.kind is _TokenKind.FIELD:
                self._field(token)
                continue
            found = self._long(token) if token.kind is _TokenKind.LONG else self._short(token)
            if found is _Outcome.UNKNOWN:
                self._unknown(token)
            elif isinstance(found, _Match):
                self._option(token, found)
        return FlagReading(values=self.values, problems=tuple(self.problems))

    def _refuse(self, problem: str) -> _Outcome:
        self.problems.append(problem)
        return _Outcome.DONE

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _ambiguous(self, token: _Token, found: list[str]) -> _Outcome:
        return self._refuse(
            f"{token.text!r} is an ambiguous abbreviation ({', '.join(found[:4])}): "
            f"{self.engine} refuses it"
        )

    def _field(self, token: _Token) -> None:
        """vLLM's ``--key.sub value``: the next token is its value whatever it looks like."""
        head = token.key.partition(".")[0]
        if not token.eq and self.at < len(self.tokens):
            self.at += 1
        if head == "--kv-transfer-config":
            self.values[head] = "{…}"
        elif head in self.spellings and self.spellings[head][0].ours:
            self.problems.append(f"{token.text!r}: {head} takes no JSON fields")

    def _long(self, token: _Token) -> _Match | _Outcome:
        """``--key``: a spelling, a unique prefix of one, or a refusal."""
        key = token.key
        match = self.spellings.get(key)
        if match is None:
            found = sorted(n for n in self.long_names if n.startswith(key) and len(key) > 2)
            if len(found) > 1 and any(self.spellings[n][0].ours for n in found):
                return self._ambiguous(token, found)
            if len(found) == 1:
                match = self.spellings[found[0]]
        if match is not None:
            return _Match(*match, token.eq, token.inline)
        positive = self.spellings.get("--" + key[5:]) if key.startswith("--no-") else None
        if positive is not None and positive[0].ours:
            return self._refuse(
                f"{token.text!r}: --{key[5:]} has no --no- form; {self.engine} refuses it"
            )
        dashed = key.replace("_", "-")
        if (
            self.engine == "SGLang"
            and dashed != key
            and any(n.startswith(dashed) for n in self.long_names)
        ):
            return self._refuse(
                f"{token.text!r}: SGLang does not read underscores in flags and refuses it"
            )
        return _Outcome.UNKNOWN

    def _short(self, token: _Token) -> _Match | _Outcome:
        """``-k``: a spelling, one with its value glued on, a unique prefix, or a refusal."""
        text, key = token.text, token.key
        match = self.spellings.get(key)
        if match is not None:
            return _Match(*match, token.eq, token.inline)
        if " " in text:
            return _Outcome.UNKNOWN
        if not token.eq and len(text) > 2 and text[:2] in self.spellings:
            return _Match(*self.spellings[text[:2]], True, text[2:])  # -n2: -n "2"
        if key in self.short_all:
            return _Outcome.UNKNOWN  # an exact option of the engine's that is not read here
        found = sorted(n for n in self.short_all if n.startswith(key))
        mine = [n for n in found if n in self.spellings and self.spellings[n][0].ours]
        if len(found) == 1 and mine:
            if token.eq:
                return self._refuse(
                    f"{text!r}: argparse reads the abbreviation {key}= only from "
                    f"Python 3.12; write {found[0]}"
                )
            return _Match(*self.spellings[found[0]], token.eq, token.inline)
        if len(found) > 1 and mine:
            return self._ambiguous(token, found)
        glued = [n for n in self.mine_short if text.startswith(n)]
        if glued:
            return self._refuse(
                f"{text!r}: {self.engine} refuses a value glued to {max(glued, key=len)} "
                "(write it as a separate word or after '=')"
            )
        return _Outcome.UNKNOWN

    def _unknown(self, token: _Token) -> None:
        """A token naming no option read here: another engine's spelling is refused, and so
        is one argument holding an option and its value (it reads as a positional word)."""
        if token.key in self.foreign:
            self.problems.append(
                f"{token.shown} is {self.foreign[token.key]} spelling: "
                f"{self.engine} does not read it"
            )
            return
        if " " in token.text:
            first = token.text.split()[0]
            inner = read_flags(self.engine, [first, "x"]) if first != token.text else FlagReading()
            if inner.values:
                self.problems.append(
                    f"{token.text!r} is one argument: {self.engine} reads it as a positional "
                    "word, not as an option (split it into separate list items)"
                )

    def _option(self, token: _Token, match: _Match) -> None:
        """An option read here takes its value (after "=", or the next token if argparse
        would take it) or, a boolean, none: the last occurrence wins."""
        flag = match.flag
        if not flag.ours:
            return
        if flag.kind is _Kind.VALUE:
            following = self._peek()
            if match.eq:
                self.values[flag.canonical] = match.inline
            elif following is not None and _consumable(following):
                self.values[flag.canonical] = following
                self.at += 1
            else:
                self.problems.append(f"{token.shown} has no value: {self.engine} refuses it")
            return
        if match.eq:
            self.problems.append(
                f"{token.text!r}: {token.shown} takes no value and {self.engine} refuses one"
            )
            return
        following = self._peek()
        if following is not None and following.strip().lower() in _BOOL_WORDS:
            self.problems.append(
                f"{token.shown} takes no value: the {following!r} after it is read as a "
                "separate argument, not as its value"
            )
            self.at += 1
            return
        self.values[flag.canonical] = "false" if match.negated else "true"


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
    return _Reader(engine, table, [str(t) for t in args]).read()
