"""Each real router the bed runs accepts the command line the bed gives it.

The check runs each router's own CLI with ``--help`` (nothing is started, nothing listens)
and finds every flag of the bed's command line in it.  It caught the ``smg`` executable
being sglang-router's: both wheels install an executable named ``smg``, and in a fresh
venv sglang-router's won, which rejects ``--disable-tokenizer-autoload``."""

from __future__ import annotations

import subprocess

import pytest

from testbed.bed import ROUTERS, router_argv


def _cli_and_flags(program: str) -> tuple[list[str], list[str]]:
    argv = router_argv(program, ip="198.19.0.9", namespace="ns", deployment="md")
    first = next(i for i, a in enumerate(argv) if a.startswith("--"))
    return argv[:first], [a for a in argv[first:] if a.startswith("--")]


@pytest.mark.parametrize("program", sorted(ROUTERS))
def test_the_router_knows_every_flag_the_bed_passes(program: str) -> None:
    cli, flags = _cli_and_flags(program)
    done = subprocess.run([*cli, "--help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-500:]
    missing = [f for f in flags if f not in done.stdout]
    assert not missing, f"{program} ({' '.join(cli)}) does not know {missing}"
