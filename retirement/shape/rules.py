"""The shape rules: how a replica's members serve, read from its engine, role kind, size
and wiring.  The shape decides which members are measured during a drain and which members
are eligible to serve (SPEC section 5; the rule itself is ``members.answers``).  Anything
that cannot be decided is a refusal naming the shape."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from retirement.shape.engines import _TABLES
from retirement.shape.wiring import Wiring, _on, _vllm_env_dp, declared_wiring


class Shape(StrEnum):
    """How a replica's members serve."""

    SINGLE = "Single"  # one member, it serves
    LEADER_SERVED = "LeaderServed"  # several members, the leader (member 0) serves
    EXTERNAL_DP = "ExternalDP"  # several members, each DP rank serves
    DISAGGREGATED = "Disaggregated"  # prefill/decode: not supported
    UNMANAGED = "Unmanaged"  # the role replaced its command line, or its Pods run another
    UNDECIDABLE = "Undecidable"


#: The shapes of a replica made of several members (a group): its members go back into
#: routing only after the identity probe (``retirement.eligibility``).
GROUP_SHAPES = frozenset({Shape.LEADER_SERVED.value, Shape.EXTERNAL_DP.value})


@dataclass(frozen=True)
class ShapeReading:
    """A role's shape and, where it is not a supported shape, why."""

    shape: Shape
    reason: str = ""

    @property
    def supported(self) -> bool:
        """Whether a retirement may be admitted for this shape."""
        return self.shape in (Shape.SINGLE, Shape.LEADER_SERVED, Shape.EXTERNAL_DP)


def read_shape(
    *,
    engine: str,
    role_kind: str,
    size: int,
    extra_args: Sequence[str],
    command: Sequence[str] | None,
    env: Iterable[tuple[str, str | None]] | None = None,
) -> ShapeReading:
    """Read a role's shape from its engine, kind, size, ``extraArgs`` and ``env``."""
    if command:
        return ShapeReading(
            Shape.UNMANAGED, "the role replaced its command line; its shape cannot be read"
        )
    return shape_of(
        engine=engine,
        role_kind=role_kind,
        size=size,
        wiring=declared_wiring(engine=engine, size=size, extra_args=extra_args, env=env),
    )


def shape_of(*, engine: str, role_kind: str, size: int, wiring: Wiring) -> ShapeReading:
    """The shape of a replica of ``size`` members of kind ``role_kind`` wired as ``wiring``
    (a role's declared wiring, or for a departed role what its Pods run)."""
    if wiring.unmanaged:
        return ShapeReading(Shape.UNMANAGED, f"{wiring.unmanaged}; its shape cannot be read")
    if size < 1:
        return ShapeReading(Shape.UNDECIDABLE, f"size {size} is not a member count")
    kind = role_kind or "Server"
    if kind not in ("Server", "Prefill", "Decode"):
        return ShapeReading(Shape.UNDECIDABLE, f"unknown role kind {kind!r}")
    if engine not in _TABLES:
        return ShapeReading(Shape.UNDECIDABLE, f"unknown engine {engine!r}")
    if wiring.problems:
        return ShapeReading(
            Shape.UNDECIDABLE, "the command line cannot be read: " + "; ".join(wiring.problems)
        )
    if wiring.raw("--config") is not None:
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"--config {wiring.raw('--config')!r}: {engine} reads more arguments from a file "
            "that cannot be read here",
        )
    if engine == "vLLM":
        return _read_vllm(kind, size, wiring)
    return _read_sglang(kind, size, wiring)


def _vllm_balancing(wiring: Wiring) -> tuple[list[str], bool, list[str], str]:
    """The load-balancing mode, as `vllm serve` derives it (cli/serve.py): external from
    --data-parallel-external-lb or a --data-parallel-rank; multi-port from its flag;
    hybrid from --data-parallel-hybrid-lb, or a --data-parallel-start-rank when neither
    of the two explicit flags is set.  More than one is refused by the engine.  Returned:
    the flags that make it external, whether it is multi-port, the flag that makes it
    hybrid, and why the modes conflict ("" when they do not)."""
    external = [
        n
        for n, on in (
            ("--data-parallel-external-lb", _on(wiring, "--data-parallel-external-lb")),
            ("--data-parallel-rank", wiring.raw("--data-parallel-rank") is not None),
        )
        if on
    ]
    multi = _on(wiring, "--data-parallel-multi-port-external-lb")
    hybrid_flag = _on(wiring, "--data-parallel-hybrid-lb")
    start_rank = wiring.raw("--data-parallel-start-rank") is not None
    hybrid = (
        ["--data-parallel-hybrid-lb"]
        if hybrid_flag
        else ["--data-parallel-start-rank"]
        if start_rank and not multi
        else []
    )
    modes = [*external, *(["--data-parallel-multi-port-external-lb"] if multi else []), *hybrid]
    conflict = ""
    if (external and (multi or hybrid)) or (multi and hybrid_flag):
        conflict = (
            f"{' and '.join(modes)} disagree: vLLM refuses more than one data-parallel "
            "load-balancing mode"
        )
    return external, multi, hybrid, conflict


def _read_vllm(kind: str, size: int, wiring: Wiring) -> ShapeReading:
    if kind != "Server":
        return ShapeReading(
            Shape.DISAGGREGATED, f"role kind {kind} is a prefill/decode (disaggregated) member"
        )
    external, multi, hybrid, conflict = _vllm_balancing(wiring)
    if conflict:
        return ShapeReading(Shape.UNDECIDABLE, conflict)
    if wiring.raw("--kv-transfer-config") is not None:
        return ShapeReading(
            Shape.UNDECIDABLE, "role kind Server and --kv-transfer-config (disaggregation) disagree"
        )
    if multi:
        return ShapeReading(
            Shape.UNDECIDABLE,
            "--data-parallel-multi-port-external-lb serves each rank on its own port: one "
            "metrics read cannot cover a member; not a supported shape",
        )
    if size == 1:
        return ShapeReading(Shape.SINGLE)
    env_dp = _vllm_env_dp(wiring)
    if env_dp > 1:
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"VLLM_DP_SIZE={env_dp} wires data parallelism through the environment: every "
            "member may serve on its own; not a supported shape",
        )
    if external:
        return ShapeReading(Shape.EXTERNAL_DP)
    # A headless rank runs engines only; its start rank does not make it a server.
    if hybrid and not (hybrid == ["--data-parallel-start-rank"] and _on(wiring, "--headless")):
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"{hybrid[0]} (hybrid load balancing) across members is not a supported shape",
        )
    return ShapeReading(Shape.LEADER_SERVED)


def _read_sglang(kind: str, size: int, wiring: Wiring) -> ShapeReading:
    raw_mode = wiring.raw("--disaggregation-mode")
    mode = wiring.value("--disaggregation-mode")
    if mode in ("prefill", "decode"):
        if kind == "Server":
            return ShapeReading(
                Shape.UNDECIDABLE, f"role kind Server and --disaggregation-mode {mode} disagree"
            )
        return ShapeReading(
            Shape.DISAGGREGATED,
            f"--disaggregation-mode {mode} is a prefill/decode (disaggregated) member",
        )
    if raw_mode is not None and mode != "null":
        return ShapeReading(Shape.UNDECIDABLE, f"unknown --disaggregation-mode {raw_mode!r}")
    if kind != "Server":
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"role kind {kind} and a command line without --disaggregation-mode disagree",
        )
    nnodes_raw = wiring.raw("--nnodes")
    if nnodes_raw is not None:
        nnodes = wiring.number("--nnodes")
        if nnodes is None:
            return ShapeReading(
                Shape.UNDECIDABLE, f"--nnodes {nnodes_raw!r} cannot be resolved to a count"
            )
        if nnodes != size:
            return ShapeReading(Shape.UNDECIDABLE, f"--nnodes {nnodes} and size {size} disagree")
    # SGLang's data parallelism is coordinated behind one HTTP server: leader-served.
    return ShapeReading(Shape.SINGLE if size == 1 else Shape.LEADER_SERVED)
