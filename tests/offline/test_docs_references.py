"""Every test and file the docs name exists: ``path``, ``path::test`` (a parametrised
id in brackets allowed) and the shorthand ``::test`` for another test of the file named
just before it, in ``README.md`` and ``docs/*.md``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.paths import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
REF = re.compile(
    r"`((?:tests|bench|docs|deploy|activities|workflows|retirement|kube|watcher|"
    r"worker|cli|connection|testbed)/[\w./-]+)?(::[\w]+(?:\[[^\]`]*\])?)?`"
)


def references(doc: Path) -> list[tuple[str, str | None]]:
    """(path, test or None) for every backticked reference in ``doc``."""
    found: list[tuple[str, str | None]] = []
    last: str | None = None
    for m in REF.finditer(doc.read_text()):
        path, test = m.group(1), m.group(2)
        if path is None and test is None:
            continue
        if path is None:
            if last is None:
                continue
            path = last
        if not path.endswith(("/", ".py", ".md", ".yaml", ".json", ".png", ".sh", ".toml")):
            continue  # a module path or a name, not a file
        last = path if path.endswith(".py") else last
        name = test[2:].split("[", 1)[0] if test else None
        found.append((path, name))
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_file_and_test_the_docs_name_exists(doc: Path) -> None:
    missing = []
    for path, test in references(doc):
        target = REPO_ROOT / path
        if not target.exists():
            missing.append(path)
        elif test is not None and not re.search(
            rf"^(async )?def {re.escape(test)}\(", target.read_text(), re.M
        ):
            missing.append(f"{path}::{test}")
    assert not missing, f"{doc.name} names what does not exist: {sorted(set(missing))}"
