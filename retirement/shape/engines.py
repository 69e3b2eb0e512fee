"""The engines' own option tables: every spelling each engine's parser registers for the
parallelism and wiring options read here, and their neighbours (options that share a
prefix with them), read from the engines' sources (below); and the launchers the operator
renders before an engine's arguments."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

# ---------------------------------------------------------------- the engines' spellings
#
# One table per engine, built from the engine's own parser, and one reader (``read_flags``)
# that resolves every token the way that parser would.  What the parsers do, and where it
# was read:
#
# vLLM (vllm/engine/arg_utils.py ``EngineArgs.add_cli_args``; vllm/utils/argparse_utils.py
# ``FlexibleArgumentParser``; vllm/entrypoints/cli/serve.py):
#   - every underscore of a ``--`` key up to its first "." becomes a dash, before argparse
#     sees it (``--data_parallel_size`` is ``--data-parallel-size``); single-dash keys are
#     left alone;
#   - ``--key.sub value`` is folded into ``--key '{"sub": value}'``: the next token is its
#     value whatever it looks like;
#   - ``--config FILE`` pulls more arguments from a YAML file;
#   - the parser is a stock ``argparse.ArgumentParser`` (``allow_abbrev`` left True), so a
#     unique prefix of a long option is that option, ``-X=v`` and ``-Xv`` (one letter) carry
#     a value, the last occurrence wins;
#   - booleans of the config dataclasses are ``argparse.BooleanOptionalAction``: ``--flag``
#     and ``--no-flag``, no value (``--flag=true`` is an error).
# SGLang (python/sglang/srt/server_args.py ``prepare_server_args``, the parallelism group
# python/sglang/srt/arg_groups/fields/parallel.py): a stock ``argparse.ArgumentParser``
# (abbreviations allowed, ``--tp`` is ``--tp-size``), no underscore rewrite
# (``--tp_size`` is refused), ``--config FILE`` merged from a file, ``store_true`` switches.


class _Kind(StrEnum):
    VALUE = "value"  # takes one value
    BOOL = "bool"  # BooleanOptionalAction: --flag / --no-flag, no value
    SWITCH = "switch"  # store_true: --flag, no value


@dataclass(frozen=True)
class _Flag:
    """One option: every spelling the engine registers (the canonical long one first)."""

    names: tuple[str, ...]
    kind: _Kind = _Kind.VALUE
    minimum: int | None = None  # an integer option: the least value the engine accepts
    default: str = ""  # the engine's value when the flag is absent ("" when unset)
    ours: bool = True  # False: a neighbour, registered by the engine but not read here

    @property
    def canonical(self) -> str:
        return self.names[0]

    def spellings(self) -> tuple[str, ...]:
        negated = tuple(
            "--no-" + n[2:] for n in self.names if self.kind is _Kind.BOOL and n.startswith("--")
        )
        return self.names + negated


_B, _S = _Kind.BOOL, _Kind.SWITCH

#: vLLM's parallelism and wiring options (arg_utils.py, the ParallelConfig group, and
#: serve's ``--headless``), and a few neighbours that share their prefixes.
_VLLM: tuple[_Flag, ...] = (
    _Flag(("--tensor-parallel-size", "-tp"), minimum=1, default="1"),
    _Flag(("--pipeline-parallel-size", "-pp"), minimum=1, default="1"),
    _Flag(("--data-parallel-size", "-dp"), minimum=1, default="1"),
    _Flag(("--data-parallel-size-local", "-dpl"), minimum=0),
    _Flag(("--data-parallel-rank", "-dpn"), minimum=0),
    _Flag(("--data-parallel-start-rank", "-dpr"), minimum=0),
    _Flag(("--data-parallel-address", "-dpa")),
    _Flag(("--data-parallel-rpc-port", "-dpp")),
    _Flag(("--data-parallel-backend", "-dpb"), default="mp"),
    _Flag(("--data-parallel-hybrid-lb", "-dph"), _B, default="false"),
    _Flag(("--data-parallel-external-lb", "-dpe"), _B, default="false"),
    _Flag(("--data-parallel-multi-port-external-lb", "-dpm"), _B, default="false"),
    _Flag(("--headless",), _S, default="false"),
    _Flag(("--nnodes", "-n"), minimum=1, default="1"),
    _Flag(("--node-rank", "-r"), minimum=0, default="0"),
    _Flag(("--master-addr",)),
    _Flag(("--master-port",)),
    _Flag(("--decode-context-parallel-size", "-dcp"), minimum=1, default="1"),
    _Flag(("--prefill-context-parallel-size", "-pcp"), minimum=1, default="1"),
    _Flag(("--enable-expert-parallel", "-ep"), _B, default="false"),
    _Flag(("--kv-transfer-config",)),
    _Flag(("--config",)),
    # Read for the drain (``exact_load``), not for the shape (``_NOT_SHAPE``).
    _Flag(("--enable-server-load-tracking",), _B, default="false"),
    _Flag(("--api-server-count", "-asc"), minimum=0),
    # Neighbours: registered by vLLM, not read here, listed so that a prefix shared with
    # them reads as ambiguous, as argparse reads it.
    _Flag(("--data-parallel-supervisor-port",), ours=False),
    _Flag(("--dcp-kv-cache-interleave-size",), ours=False),
    _Flag(("--distributed-executor-backend",), ours=False),
    _Flag(("--max-parallel-loading-workers",), ours=False),
    _Flag(("--host",), ours=False),
    _Flag(("--help", "-h"), ours=False),
    _Flag(("--config-format",), ours=False),
    _Flag(("--kv-cache-dtype",), ours=False),
    _Flag(("--kv-events-config",), ours=False),
    _Flag(("--quantization", "-q"), ours=False),
)

#: SGLang's parallelism and wiring options (arg_groups/fields/parallel.py, server_args.py)
#: and the neighbours that share their prefixes.
_SGLANG: tuple[_Flag, ...] = (
    _Flag(("--tp-size", "--tensor-parallel-size"), minimum=1, default="1"),
    _Flag(("--pp-size", "--pipeline-parallel-size"), minimum=1, default="1"),
    _Flag(("--dp-size", "--data-parallel-size"), minimum=1, default="1"),
    _Flag(("--ep-size", "--expert-parallel-size", "--ep"), minimum=1, default="1"),
    _Flag(("--attn-cp-size", "--attention-context-parallel-size"), minimum=1, default="1"),
    _Flag(("--moe-dp-size", "--moe-data-parallel-size"), minimum=1, default="1"),
    _Flag(("--nnodes",), minimum=1, default="1"),
    _Flag(("--node-rank",), minimum=0, default="0"),
    _Flag(("--dist-init-addr", "--nccl-init-addr")),
    _Flag(("--enable-dp-attention",), _S, default="false"),
    _Flag(("--disaggregation-mode",), default="null"),
    _Flag(("--config",)),
    _Flag(("--pp-max-micro-batch-size",), ours=False),
    _Flag(("--pp-async-batch-depth",), ours=False),
    _Flag(("--nccl-port",), ours=False),
    _Flag(("--dist-timeout",), ours=False),
    _Flag(("--disaggregation-transfer-backend",), ours=False),
    _Flag(("--disaggregation-bootstrap-port",), ours=False),
    _Flag(("--device",), ours=False),
    _Flag(("--help", "-h"), ours=False),
)

_TABLES: Mapping[str, tuple[_Flag, ...]] = {"vLLM": _VLLM, "SGLang": _SGLANG}

#: Options read but no fact of the replica's shape: --config refuses on its own, the
#: operator owns --kv-transfer-config, and the drain's own two say how the engine counts
#: its requests, which a declared and a running command line may differ on.
_NOT_SHAPE = frozenset(
    {"--config", "--kv-transfer-config", "--enable-server-load-tracking", "--api-server-count"}
)

#: vLLM's other single-dash option strings (arg_utils.py; -O is rewritten by
#: FlexibleArgumentParser): a single-dash prefix is resolved against all of them and the
#: table's, as argparse resolves it.
_VLLM_SHORT_OTHERS = ("-O", "-sc", "-dc", "-cc", "-ac")

#: The launchers the operator renders ("vllm serve <model>", "python3 -m
#: sglang.launch_server --model-path <model>") and their older spellings: an argv that
#: starts with anything else is not the engine's own command line.
_LAUNCHERS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "vLLM": (("vllm", "serve"), ("python", "-m", "vllm.entrypoints.openai.api_server")),
    "SGLang": (("python", "-m", "sglang.launch_server"), ("sglang", "serve")),
}
