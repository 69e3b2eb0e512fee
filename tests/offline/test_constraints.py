"""``constraints.txt`` pins every distribution the project's venv installs (issue 22:
dependencies pinned), and the venv the tests run in is exactly that: every pin installed
at its version, every direct dependency of ``pyproject.toml`` pinned, and nothing
installed that is not pinned (apart from the project itself and pip's own tooling)."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata

from testbed.paths import REPO_ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")
TOOLING = {"pip", "setuptools", "wheel", "llm-retire"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (REPO_ROOT / "constraints.txt").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = PIN.fullmatch(line)
        assert m, f"not a name==version pin: {line!r}"
        out[canonical(m.group(1))] = m.group(2)
    return out


def test_every_pin_is_installed_at_its_version() -> None:
    wrong = {
        name: (version, metadata.version(name))
        for name, version in pins().items()
        if metadata.version(name) != version
    }
    assert not wrong, wrong


def test_every_direct_dependency_is_pinned() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *project["optional-dependencies"]["dev"]]
    names = {canonical(re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0]) for d in declared}
    assert names - set(pins()) == set()


def test_nothing_unpinned_is_installed() -> None:
    installed = {canonical(d.metadata["Name"]) for d in metadata.distributions()}
    assert installed - set(pins()) - TOOLING == set()
