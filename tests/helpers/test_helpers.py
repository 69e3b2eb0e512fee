"""The shared test helpers do what the tests rely on: polling returns the first accepted
value and fails with the last one seen; the manifest builder writes a valid deployment."""

from __future__ import annotations

import itertools

import pytest

from kube.deployment import parse_deployment
from tests.helpers import (
    eventually,
    eventually_async,
    eventually_in_thread,
    model_deployment,
    role,
)


def test_eventually_returns_the_first_truthy_value() -> None:
    counter = itertools.count()
    assert eventually(lambda: next(counter) >= 3 and "ready", interval=0.001) == "ready"


def test_eventually_fails_with_the_last_value_seen() -> None:
    with pytest.raises(AssertionError, match=r"pods gone: not true after 0.05 s \(last: \[1\]\)"):
        eventually(
            lambda: [1], accept=lambda v: not v, what="pods gone", timeout=0.05, interval=0.01
        )


def test_eventually_ignores_only_the_named_exceptions() -> None:
    calls = itertools.count()

    def flaky() -> int:
        if next(calls) < 2:
            raise LookupError("not yet")
        return 7

    assert eventually(flaky, ignore=(LookupError,), interval=0.001) == 7
    with pytest.raises(ZeroDivisionError):
        eventually(lambda: 1 // 0, ignore=(LookupError,))
    missing: dict[str, int] = {}
    with pytest.raises(AssertionError, match=r"last: KeyError\('k'\)"):
        eventually(lambda: missing["k"], ignore=(LookupError,), timeout=0.02, interval=0.01)


async def test_async_variants_poll_until_accepted() -> None:
    counter = itertools.count()

    async def phase() -> str:
        return "Draining" if next(counter) >= 2 else "Withdrawing"

    got = await eventually_async(phase, accept=lambda p: p == "Draining", interval=0.001)
    assert got == "Draining"
    assert await eventually_in_thread(lambda: next(counter) > 5, interval=0.001) is True
    with pytest.raises(AssertionError, match="never"):
        await eventually_async(
            phase, accept=lambda p: p == "Gone", what="never", timeout=0.02, interval=0.005
        )


def test_model_deployment_is_a_valid_deployment() -> None:
    manifest = model_deployment(
        "md",
        engine="SGLang",
        replicas=3,
        size=2,
        router="sglang-gateway",
        extra_args=["--data-parallel-size", "2"],
        extra_roles=[role("old", replicas=1)],
        namespace="ns",
        uid="u-1",
        annotations={"a": "b"},
    )
    md = parse_deployment(manifest)
    assert (md.namespace, md.name, md.uid, md.router) == ("ns", "md", "u-1", "sglang-gateway")
    assert md.engine.name == "SGLang" and md.annotations == {"a": "b"}
    server, old = md.roles
    assert (server.name, server.replicas, server.size, server.kind) == ("server", 3, 2, "Server")
    assert server.extra_args == ("--data-parallel-size", "2")
    assert (old.name, old.replicas, old.size) == ("old", 1, 1)


def test_model_deployment_defaults_match_the_bed_manifest() -> None:
    """The shape the bed tests created before the builder moved here, key for key."""
    assert model_deployment("m") == {
        "apiVersion": "worker.gpustack.ai/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m"},
        "spec": {
            "engine": {"name": "vLLM", "version": "0.29.0"},
            "roles": [
                {"name": "server", "kind": "Server", "replicas": 2, "size": 1, "extraArgs": []}
            ],
        },
    }
