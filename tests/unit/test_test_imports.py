"""No test module imports another test module (issue 21): what tests share lives in modules
that are not tests, ``tests/helpers/`` (shared across directories), a directory's
``support.py`` (``tests/bed/support.py``) or its ``conftest.py``, so a test module can be
run, changed, moved or deleted without breaking another, and its helpers are found where
their name says.

Every ``tests/**/test_*.py`` is read with ``ast``, imports inside functions included, in
every form: ``import tests.a.test_b``, ``from tests.a.test_b import x``, ``from tests.a
import test_b``, the relative ``from .test_b import x`` and ``from . import test_b``, and
``importlib.import_module("tests.a.test_b")`` / ``__import__`` of a literal name.  A test
module is a module of this repository whose file name starts with ``test_``.  The modules
that are not tests (helpers, ``support.py``, ``conftest.py``) import no test module either:
otherwise a test could still reach another through them.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Calls that import the module named by their first argument.
IMPORT_CALLS = {"import_module", "__import__"}


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at ``path`` (a file, not a package)."""
    return ".".join(path.relative_to(root).with_suffix("").parts)


def imported_names(source: str, name: str) -> set[str]:
    """Every dotted name the source of module ``name`` may load, anywhere in its body:
    ``from a import b`` gives ``a`` and ``a.b`` (``b`` may be a module)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")[: -node.level]
                base = ".".join([*package, base] if base else package)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names if a.name != "*")
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in IMPORT_CALLS and isinstance(first, ast.Constant):
                found.add(str(first.value))
    found.discard(name)
    return found


def is_test_module(dotted: str, root: Path) -> bool:
    """Whether ``dotted`` names a module of the repository whose file name starts with
    ``test_``."""
    parts = dotted.split(".")
    return parts[-1].startswith("test_") and (root.joinpath(*parts).with_suffix(".py")).is_file()


def imported_test_modules(path: Path, root: Path) -> list[str]:
    """The test modules the module at ``path`` imports, sorted."""
    name = module_name(path, root)
    return sorted(n for n in imported_names(path.read_text(), name) if is_test_module(n, root))


def offenders(paths: list[Path], root: Path) -> list[str]:
    """``file: the test modules it imports`` for each of ``paths`` that imports any."""
    found = []
    for path in paths:
        imported = imported_test_modules(path, root)
        if imported:
            found.append(f"{path.relative_to(root)}: {', '.join(imported)}")
    return found


HOW = (
    "move what they share into tests/helpers/ (shared across directories), the "
    "directory's support.py, or its conftest.py (fixtures), and import it from there"
)


def test_no_test_module_imports_another_test_module() -> None:
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    assert len(tests) > 100  # the walk found the suite
    found = offenders(tests, ROOT)
    assert not found, "test modules import other test modules (" + HOW + "):\n" + "\n".join(found)


def test_no_helper_support_or_conftest_module_imports_a_test_module() -> None:
    others = sorted(p for p in (ROOT / "tests").rglob("*.py") if not p.name.startswith("test_"))
    assert any(p.name == "support.py" for p in others)
    assert any(p.name == "conftest.py" for p in others)
    found = offenders(others, ROOT)
    assert not found, "modules that are not tests import test modules:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import tests.a.test_b", ["tests.a.test_b"]),
        ("import tests.a.test_b as b", ["tests.a.test_b"]),
        ("from tests.a.test_b import helper", ["tests.a.test_b"]),
        ("from tests.a.test_b import (\n    helper,\n    other,\n)", ["tests.a.test_b"]),
        ("from tests.a import test_b", ["tests.a.test_b"]),
        ("from tests.a import test_b as b", ["tests.a.test_b"]),
        ("from .test_b import helper", ["tests.a.test_b"]),
        ("from . import test_b", ["tests.a.test_b"]),
        ("from ..test_top import helper", ["tests.test_top"]),
        ("def f():\n    from tests.a.test_b import helper", ["tests.a.test_b"]),
        ("import importlib\nimportlib.import_module('tests.a.test_b')", ["tests.a.test_b"]),
        ("__import__('tests.test_top')", ["tests.test_top"]),
        ("from tests.test_top import helper", ["tests.test_top"]),
        # What tests may import: helpers, a directory's support module, conftest, itself.
        ("from tests.a.support import helper", []),
        ("from tests.a.conftest import Ctx", []),
        ("from . import conftest, support", []),
        ("from tests.helpers.shared import helper", []),
        ("from tests.helpers import shared", []),
        ("from tests.a.test_this import helper", []),
        # A name that only looks like a test module: no such file.
        ("from tests.a.support import test_like_name", []),
        # A module outside the repository (an installed package) is no test module here.
        ("import test_installed", []),
    ],
)
def test_every_form_of_import_of_a_test_module_is_seen(
    tmp_path: Path, source: str, expected: list[str]
) -> None:
    for relative in (
        "tests/__init__.py",
        "tests/test_top.py",
        "tests/a/__init__.py",
        "tests/a/conftest.py",
        "tests/a/support.py",
        "tests/a/test_b.py",
        "tests/helpers/__init__.py",
        "tests/helpers/shared.py",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text("")
    module = tmp_path / "tests" / "a" / "test_this.py"
    module.write_text(source + "\n")
    assert imported_test_modules(module, tmp_path) == expected
