"""The watcher's memo of role shapes (``watcher.labels.role_shape``): each reading is
``read_shape``'s for that role, whichever roles were read before it; every input of
``read_shape`` is part of the memo's key (two roles that differ in one input alone, read
one after the other, each get their own reading)."""

from __future__ import annotations

import pytest

from kube.deployment import Role
from kube.objects import EnvVar
from retirement.shape import ShapeReading, read_shape
from watcher.labels import role_shape

BASE = Role(name="server", replicas=2, kind="Server", size=2)
#: Pairs of roles that differ in one input of ``read_shape`` and read differently.
PAIRS: dict[str, tuple[str, Role, str, Role]] = {
    "engine": ("vLLM", BASE, "TGI", BASE),
    "kind": ("vLLM", BASE, "vLLM", Role("server", 2, kind="Prefill", size=2)),
    "size": ("SGLang", Role("server", 2, size=1), "SGLang", Role("server", 2, size=2)),
    "extra args": (
        "vLLM",
        BASE,
        "vLLM",
        Role("server", 2, size=2, extra_args=("--data-parallel-external-lb",)),
    ),
    "command": ("vLLM", BASE, "vLLM", Role("server", 2, size=2, command=("sh",))),
    "env": (
        "vLLM",
        Role("server", 2, size=2, extra_args=("-dpe",)),
        "vLLM",
        Role("server", 2, size=2, extra_args=("-dpe",), env=(EnvVar("VLLM_DP_SIZE", "x"),)),
    ),
}


def direct(engine: str, role: Role) -> ShapeReading:
    """``read_shape`` of the role, not remembered."""
    return read_shape(
        engine=engine,
        role_kind=role.kind,
        size=role.size,
        extra_args=role.extra_args,
        command=role.command,
        env=role.env,
    )


@pytest.mark.parametrize("pair", PAIRS.values(), ids=list(PAIRS))
def test_a_remembered_shape_is_the_shape_of_that_role(pair: tuple[str, Role, str, Role]) -> None:
    e1, r1, e2, r2 = pair
    assert direct(e1, r1).shape != direct(e2, r2).shape  # the pair reads differently
    for _ in range(2):  # read, then remembered
        assert role_shape(e1, r1).shape == direct(e1, r1).shape
        assert role_shape(e2, r2).shape == direct(e2, r2).shape
    assert role_shape(e1, r1) == direct(e1, r1)
