"""The one error type of a bad Temporal connection configuration."""

from __future__ import annotations

import re

_SNIPPET = re.compile(r"^\d*\s*\|")  # the TOML parser's source excerpt lines: "2 | x=" / "  |  ^"
_PREFIXES = ("Configuration loading error: ", "Invalid configuration: ")


class ConnectionConfigError(ValueError):
    """The connection configuration cannot be used; the message is one line for a person.

    Every caller (worker, watcher, CLI) turns it into exit code 2 and prints only the
    message: a typo in a profile must read as a typo, never as a traceback.
    """


def one_line(message: str) -> str:
    """Fold an SDK configuration message (the TOML parser's is multi-line) into one line.

    The parser's message carries a source excerpt with a caret; the position it names
    ("at line 2, column 9") and its closing reason say the same in fewer words.
    """
    kept = [ln.strip() for ln in message.splitlines() if ln.strip() and not _SNIPPET.match(ln)]
    text = ": ".join(kept)
    for prefix in _PREFIXES:
        text = text.removeprefix(prefix)
    return text
