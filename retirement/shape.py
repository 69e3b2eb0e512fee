"""A role's shape, read from its command line, and which members answer for it.

The command line is read as the engine's own parser reads it (``read_flags``): every
spelling of one option is that option, the last occurrence wins, and a token the engine
would refuse, or that could be several options, is a problem that makes the shape
undecidable, never a guess.  The same reader reads a role's declared ``extraArgs`` and
``env`` (``declared_wiring``) and what a Pod's ``main`` container runs (``rendered_wiring``);
``disagreement`` says where the two differ.

The shape decides which members are measured during a drain and which members are
eligible to serve (SPEC section 5): every member of an External-DP replica, the leader only
of a leader-served replica, the one member at size one.  Anything that cannot be decided
is a refusal naming the shape.

The rule itself is ``answers`` (a member's shape and member index in, whether it answers
out); ``select_members`` applies it to a whole replica, once the group is known to be well
formed, and ``select_surplus`` to the surplus members of one (SPEC section 3), each read as
what its own index makes it: a duplicate or extra member of a single-member or External-DP
replica answers, and of a leader-served one only a duplicate leader (index 0) does.  Its
eligibility label plays no part: a member without it may still have requests in flight.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from retirement.names import LABEL_MEMBER_INDEX
from retirement.text import is_decimal
from retirement.versions import at_least


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

_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's own test
_BOOL_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


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
    spellings = _ours(table)
    long_names = [s for s in spellings if s.startswith("--")]
    short_names = [s for s in spellings if not s.startswith("--")]
    short_all = short_names + (list(_VLLM_SHORT_OTHERS) if engine == "vLLM" else [])
    mine_short = [n for n in short_names if spellings[n][0].ours]
    foreign = _foreign(engine)
    values: dict[str, str] = {}
    problems: list[str] = []
    tokens = [str(t) for t in args]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            break  # everything after is positional
        if not token.startswith("-") or token == "-" or _NEGATIVE_NUMBER.match(token):
            continue
        key, eq, inline = token.partition("=")
        match: tuple[_Flag, bool] | None = None
        shown = key
        if token.startswith("--"):
            if engine == "vLLM":
                key = _vllm_key(key)
                if "." in key:  # --key.sub value: a JSON field of --key
                    head = key.partition(".")[0]
                    if not eq and i < len(tokens):
                        i += 1
                    if head == "--kv-transfer-config":
                        values[head] = "{…}"
                    elif head in spellings and spellings[head][0].ours:
                        problems.append(f"{token!r}: {head} takes no JSON fields")
                    continue
            match = spellings.get(key)
            if match is None:
                found = sorted(n for n in long_names if n.startswith(key) and len(key) > 2)
                mine = [n for n in found if spellings[n][0].ours]
                if len(found) > 1 and mine:
                    problems.append(
                        f"{token!r} is an ambiguous abbreviation ({', '.join(found[:4])}): "
                        f"{engine} refuses it"
                    )
                    continue
                if len(found) == 1:
                    match = spellings[found[0]]
            positive = spellings.get("--" + key[5:]) if key.startswith("--no-") else None
            if match is None and positive is not None and positive[0].ours:
                problems.append(f"{token!r}: --{key[5:]} has no --no- form; {engine} refuses it")
                continue
            dashed = key.replace("_", "-")
            if (
                match is None
                and engine == "SGLang"
                and dashed != key
                and any(n.startswith(dashed) for n in long_names)
            ):
                problems.append(
                    f"{token!r}: SGLang does not read underscores in flags and refuses it"
                )
                continue
        else:
            match = spellings.get(key)
            if match is None and " " not in token:
                if not eq and len(token) > 2 and token[:2] in spellings:
                    match, inline, eq = spellings[token[:2]], token[2:], "="  # -n2: -n "2"
                elif key in short_all:
                    pass  # an exact option of the engine's that is not read here
                else:
                    found = sorted(n for n in short_all if n.startswith(key))
                    mine = [n for n in found if n in spellings and spellings[n][0].ours]
                    if len(found) == 1 and mine:
                        if eq:
                            problems.append(
                                f"{token!r}: argparse reads the abbreviation {key}= only from "
                                f"Python 3.12; write {found[0]}"
                            )
                            continue
                        match = spellings[found[0]]
                    elif len(found) > 1 and mine:
                        problems.append(
                            f"{token!r} is an ambiguous abbreviation ({', '.join(found[:4])}): "
                            f"{engine} refuses it"
                        )
                        continue
                    else:
                        glued = [n for n in mine_short if token.startswith(n)]
                        if glued:
                            problems.append(
                                f"{token!r}: {engine} refuses a value glued to "
                                f"{max(glued, key=len)} (write it as a separate word or "
                                "after '=')"
                            )
                            continue
        if match is None and key in foreign:
            problems.append(f"{shown} is {foreign[key]} spelling: {engine} does not read it")
            continue
        if match is None:
            if " " in token:
                first = token.split()[0]
                inner = read_flags(engine, [first, "x"]) if first != token else FlagReading()
                if inner.values:
                    problems.append(
                        f"{token!r} is one argument: {engine} reads it as a positional word, "
                        "not as an option (split it into separate list items)"
                    )
            continue
        flag, negated = match
        if not flag.ours:
            continue
        name = flag.canonical
        if flag.kind is _Kind.VALUE:
            if eq:
                value = inline
            elif i < len(tokens) and _consumable(tokens[i]):
                value = tokens[i]
                i += 1
            else:
                problems.append(f"{shown} has no value: {engine} refuses it")
                continue
            values[name] = value
            continue
        if eq:
            problems.append(f"{token!r}: {shown} takes no value and {engine} refuses one")
            continue
        if i < len(tokens) and tokens[i].strip().lower() in _BOOL_WORDS:
            problems.append(
                f"{shown} takes no value: the {tokens[i]!r} after it is read as a separate "
                "argument, not as its value"
            )
            i += 1
            continue
        values[name] = "false" if negated else "true"
    return FlagReading(values=values, problems=tuple(problems))


def _env_map(env: Iterable[tuple[str, str | None]] | None) -> dict[str, str | None]:
    """A container's environment, last entry of a name winning, each literal value with
    the ``$(VAR)`` references to earlier literals expanded (None: not a literal)."""
    out: dict[str, str | None] = {}
    for name, value in env or ():
        out[str(name)] = None if value is None else expand(str(value), out)
    return out


def expand(value: str, env: Mapping[str, str | None]) -> str:
    """Kubernetes' expansion of a container's command, args and env values: ``$(VAR)`` is
    VAR's literal value when one is known, ``$$`` is ``$``, anything else stays as written."""
    out: list[str] = []
    i = 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        m = _REFERENCE.match(value, i)
        if m is not None and env.get(m.group(1)) is not None:
            out.append(str(env[m.group(1)]))
            i = m.end()
            continue
        out.append(value[i])
        i += 1
    return "".join(out)


def _canonical_int(raw: str) -> str:
    """An integer as the engine's ``int()`` reads it ("02", " 2", "2" are "2"), else as written."""
    try:
        return str(int(raw))
    except ValueError:
        return raw


#: The environment variables vLLM reads for its data-parallel wiring (vllm/envs.py), read
#: by ParallelConfig.__post_init__ only when the command line does not drive data
#: parallelism (vllm/config/parallel.py): VLLM_DP_SIZE is the degree, the others its rank
#: and master.  Integers are ``int()``-parsed at first use: a bad one stops the engine.
_VLLM_DP_ENV = (
    "VLLM_DP_SIZE",
    "VLLM_DP_RANK",
    "VLLM_DP_RANK_LOCAL",
    "VLLM_DP_MASTER_IP",
    "VLLM_DP_MASTER_PORT",
)
_VLLM_DP_ENV_INTS = ("VLLM_DP_SIZE", "VLLM_DP_RANK", "VLLM_DP_RANK_LOCAL", "VLLM_DP_MASTER_PORT")

#: The replica size the gpustack operator publishes to every member above size one
#: (a literal; ``$(GPUSTACK_REPLICA_SIZE)`` in a role's arguments is that size).
REPLICA_SIZE_ENV = "GPUSTACK_REPLICA_SIZE"


@dataclass(frozen=True)
class Wiring:
    """What one engine command line and its environment say about a replica's parallelism:
    the options read (``flags``, as written, last occurrence), the environment the engine
    reads (``env``), what cannot be read (``problems``), and, for a Pod's command line, why
    it is not the engine's own (``unmanaged``)."""

    engine: str
    flags: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str | None] = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    unmanaged: str = ""
    runs: str = ""  # what an unmanaged command line runs, as shown

    def raw(self, name: str) -> str | None:
        """The option ``name`` (canonical spelling) as written, or None when absent."""
        return self.flags.get(name)

    def value(self, name: str) -> str | None:
        """The option ``name`` with ``$(VAR)`` references expanded, or None when absent."""
        raw = self.flags.get(name)
        return None if raw is None else expand(raw, self.env)

    def number(self, name: str) -> int | None:
        """The option ``name`` as the engine's ``int()`` reads it; None when absent,
        unresolved (a ``$(VAR)`` with no literal value) or not an integer."""
        v = self.value(name)
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            return None

    def facts(self) -> dict[str, str]:
        """What two readings of one replica must agree on: every option read here and the
        environment the engine reads, as written (integers canonical), absent options at
        the engine's default."""
        table = _TABLES.get(self.engine, ())
        out: dict[str, str] = {}
        for flag in table:
            if not flag.ours or flag.canonical in _NOT_SHAPE:
                continue
            raw = self.flags.get(flag.canonical, flag.default)
            out[flag.canonical] = _canonical_int(raw) if flag.minimum is not None else raw
        if self.engine == "vLLM":
            for name in _VLLM_DP_ENV:
                if name in self.env:
                    v = self.env[name]
                    out[name] = "(not a literal value)" if v is None else _canonical_int(v)
                else:
                    out[name] = ""
        return out


def _launcher(engine: str, argv: Sequence[str]) -> int | None:
    """How many leading words of ``argv`` are ``engine``'s launcher, or None if it has none."""
    for launcher in _LAUNCHERS.get(engine, ()):
        words = list(argv[: len(launcher)])
        if len(words) < len(launcher):
            continue
        first = words[0].rsplit("/", 1)[-1]
        head_ok = (
            re.fullmatch(r"python[0-9.]*", first) is not None
            if launcher[0] == "python"
            else first == launcher[0]
        )
        if head_ok and words[1:] == list(launcher[1:]):
            return len(launcher)
    return None


def read_wiring(
    *,
    engine: str,
    args: Sequence[object],
    env: Iterable[tuple[str, str | None]] | None = None,
    unmanaged: str = "",
    runs: str = "",
) -> Wiring:
    """The wiring ``args`` and ``env`` give ``engine``: the one reader every shape read
    goes through (a role's declared arguments and a Pod's rendered command line alike)."""
    flags = read_flags(engine, args)
    env_map = _env_map(env)
    problems = list(flags.problems)
    wiring = Wiring(engine=engine, flags=flags.values, env=env_map)
    table = {f.canonical: f for f in _TABLES.get(engine, ())}
    for name, raw in flags.values.items():
        flag = table[name]
        if flag.minimum is None:
            continue
        value = expand(raw, env_map)
        if _REFERENCE.search(value):
            continue  # a $(VAR) known only where the Pod runs: not judged here
        try:
            number = int(value)
        except ValueError:
            problems.append(f"{name} {raw!r} is not an integer: {engine} refuses it")
            continue
        if number < flag.minimum:
            problems.append(f"{name} {raw!r} is below {flag.minimum}: {engine} refuses it")
    if engine == "vLLM":
        problems += _vllm_env_problems(wiring)
    return Wiring(
        engine=engine,
        flags=flags.values,
        env=env_map,
        problems=tuple(problems),
        unmanaged=unmanaged,
        runs=runs,
    )


def _vllm_cli_drives_dp(wiring: Wiring) -> bool | None:
    """Whether vLLM takes its data-parallel wiring from the command line (a size above one,
    or a local size of 0) rather than from VLLM_DP_*; None when that cannot be told."""
    dp, local = wiring.raw("--data-parallel-size"), wiring.raw("--data-parallel-size-local")
    dp_n, local_n = (
        wiring.number("--data-parallel-size"),
        wiring.number("--data-parallel-size-local"),
    )
    if (dp_n is not None and dp_n > 1) or local_n == 0:
        return True
    if (dp is not None and dp_n is None) or (local is not None and local_n is None):
        return None
    return False


def _vllm_env_problems(wiring: Wiring) -> list[str]:
    present = [n for n in _VLLM_DP_ENV if n in wiring.env]
    if not present:
        return []
    drives = _vllm_cli_drives_dp(wiring)
    if drives:
        return []  # the engine never reads them
    if drives is None:
        return [
            f"whether vLLM reads {', '.join(present)} depends on --data-parallel-size "
            f"{wiring.raw('--data-parallel-size')!r}, which cannot be resolved here"
        ]
    out: list[str] = []
    for name in present:
        v = wiring.env[name]
        if v is None:
            out.append(f"{name} is not a literal value (valueFrom): it cannot be read")
            continue
        if name not in _VLLM_DP_ENV_INTS:
            continue
        try:
            n = int(v)
        except ValueError:
            out.append(f"{name}={v!r} is not an integer: vLLM refuses it")
            continue
        if name == "VLLM_DP_SIZE" and n < 1:
            out.append(f"{name}={v!r} is below 1: vLLM refuses it")
    return out


def _vllm_env_dp(wiring: Wiring) -> int:
    """The data-parallel size vLLM takes from VLLM_DP_SIZE (1 when it does not)."""
    if _vllm_cli_drives_dp(wiring) is not False:
        return 1
    v = wiring.env.get("VLLM_DP_SIZE")
    try:
        return int(v) if v is not None else 1
    except ValueError:
        return 1


def declared_wiring(
    *,
    engine: str,
    size: int,
    extra_args: Sequence[object],
    env: Iterable[tuple[str, str | None]] | None = None,
) -> Wiring:
    """The wiring a role declares: its ``extraArgs`` and ``env``, with the replica size the
    operator publishes above size one (``$(GPUSTACK_REPLICA_SIZE)``) known."""
    published: list[tuple[str, str | None]] = [(REPLICA_SIZE_ENV, str(size))] if size > 1 else []
    return read_wiring(engine=engine, args=extra_args, env=[*published, *(env or ())])


def rendered_wiring(
    *,
    engine: str,
    command: Sequence[object],
    args: Sequence[object],
    env: Iterable[tuple[str, str | None]] | None = None,
) -> Wiring:
    """The wiring a Pod's ``main`` container runs: its ``command`` and ``args`` (the argv is
    command + args; with no command the image's entrypoint runs the args) and its ``env``.
    A command that does not start with the engine's launcher is not the engine's own
    command line (a role that replaced it, or a shell): its shape cannot be read."""
    argv = [str(a) for a in (*command, *args)]
    if not command:
        return read_wiring(engine=engine, args=argv, env=env)
    skip = _launcher(engine, argv)
    if skip is None:
        shown = repr(" ".join(argv[:3])[:80])
        return read_wiring(
            engine=engine,
            args=[],
            env=env,
            unmanaged=f"the Pod's main container runs {shown}, not {engine}'s own command line",
            runs=shown,
        )
    return read_wiring(engine=engine, args=argv[skip:], env=env)


def disagreement(first: Wiring, second: Wiring) -> tuple[tuple[str, str, str], ...]:
    """Where two readings of one replica disagree: (what, as the first says it, as the second
    says it), one per fact; empty when they agree."""
    if first.unmanaged != second.unmanaged:
        own = f"{first.engine}'s own"
        return (("the command line is", first.runs or own, second.runs or own),)
    a, b = first.facts(), second.facts()
    return tuple(
        (name, _shown(a[name]), _shown(b.get(name, ""))) for name in a if a[name] != b.get(name, "")
    )


def _shown(value: str) -> str:
    return repr(value[:60]) if value else "(unset)"


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


def _on(wiring: Wiring, name: str) -> bool:
    return wiring.raw(name) == "true"


def _read_vllm(kind: str, size: int, wiring: Wiring) -> ShapeReading:
    if kind != "Server":
        return ShapeReading(
            Shape.DISAGGREGATED, f"role kind {kind} is a prefill/decode (disaggregated) member"
        )
    # The load-balancing mode, as `vllm serve` derives it (cli/serve.py): external from
    # --data-parallel-external-lb or a --data-parallel-rank; multi-port from its flag;
    # hybrid from --data-parallel-hybrid-lb, or a --data-parallel-start-rank when neither
    # of the two explicit flags is set.  More than one is refused by the engine.
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
    if external and (multi or hybrid):
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"{' and '.join(modes)} disagree: vLLM refuses more than one data-parallel "
            "load-balancing mode",
        )
    if multi and hybrid_flag:
        return ShapeReading(
            Shape.UNDECIDABLE,
            f"{' and '.join(modes)} disagree: vLLM refuses more than one data-parallel "
            "load-balancing mode",
        )
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


@dataclass(frozen=True)
class MemberPod:
    """What member selection needs to know of one Pod of a replica."""

    name: str
    uid: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Selection:
    """The members that answer for a replica, or why none can be chosen."""

    measured: tuple[str, ...] = ()  # Pod names
    refusal: str = ""

    @property
    def ok(self) -> bool:
        """Whether a selection was made."""
        return not self.refusal


def member_index(pod: MemberPod) -> int | None:
    """The ``member-index`` label as a number, or None if absent or not a number."""
    raw = pod.labels.get(LABEL_MEMBER_INDEX)
    if raw is None or not is_decimal(raw):
        return None
    return int(raw)


def answers(shape: Shape, index: int | None) -> bool | None:
    """Whether a member with member index ``index`` answers for a replica of ``shape``: the
    one member at size one, every member (each DP rank) of an External-DP replica, the
    leader (index 0) only of a leader-served one.  None when it cannot be decided: a
    leader-served member with no valid index may be the leader; an unsupported shape has
    no member that answers by this rule."""
    if shape in (Shape.SINGLE, Shape.EXTERNAL_DP):
        return True
    if shape is Shape.LEADER_SERVED:
        return None if index is None else index == 0
    return None


def select_members(*, shape: ShapeReading, size: int, members: Sequence[MemberPod]) -> Selection:
    """Which members of one replica answer (are measured, are eligible), per its shape."""
    if not shape.supported:
        return Selection(refusal=f"shape {shape.shape}: {shape.reason}")
    if len(members) != size:
        return Selection(refusal=f"declared size {size} != {len(members)} member Pods")
    if shape.shape is Shape.SINGLE:
        return Selection(measured=(members[0].name,))
    indexes: dict[int, list[str]] = {}
    for pod in members:
        idx = member_index(pod)
        if idx is None:
            return Selection(refusal=f"member {pod.name} has no valid {LABEL_MEMBER_INDEX} label")
        if idx >= size:
            return Selection(refusal=f"member {pod.name} has index {idx} beyond size {size}")
        indexes.setdefault(idx, []).append(pod.name)
    leaders = indexes.get(0, [])
    if not leaders:
        return Selection(refusal="leadership missing: no member has index 0")
    if len(leaders) > 1:
        return Selection(refusal=f"leadership duplicated: {', '.join(sorted(leaders))}")
    duplicated = sorted(i for i, names in indexes.items() if len(names) > 1)
    if duplicated:
        return Selection(refusal=f"member index duplicated: {duplicated}")
    return Selection(
        measured=tuple(indexes[i][0] for i in sorted(indexes) if answers(shape.shape, i))
    )


def select_surplus(*, shape: ShapeReading, surplus: Sequence[MemberPod]) -> Selection:
    """Which of the ``surplus`` members of one replica answer, by ``answers``: each is read
    as what its own member index makes it (at size one the index plays no part).

    The caller passes the members that may serve (whose engine ever started); a member
    that never ran answers nothing.  Refused, with the reason: an unsupported shape; a
    member whose answer cannot be decided (a leader-served member with no valid index may
    be the leader); members of which none answers (followers with no surplus leader: one
    may be working for the replica's kept leader, which goes on serving, so no read can
    show that it stopped)."""
    if not shape.supported:
        return Selection(refusal=f"shape {shape.shape}: {shape.reason}")
    measured: list[str] = []
    quiet: list[str] = []
    for pod in surplus:
        said = answers(shape.shape, member_index(pod))
        if said is None:
            return Selection(
                refusal=f"surplus member {pod.name} has no valid {LABEL_MEMBER_INDEX} label: "
                "whether it leads the replica cannot be decided"
            )
        (measured if said else quiet).append(pod.name)
    if quiet and not measured:
        who = "member " + quiet[0] if len(quiet) == 1 else "members " + ", ".join(quiet)
        verb = "does" if len(quiet) == 1 else "do"
        it = "it" if len(quiet) == 1 else "they"
        return Selection(
            refusal=f"surplus {who} {verb} not answer for the replica (shape {shape.shape}: only "
            "the leader, member-index 0, answers) and no surplus member that answers has "
            f"started: no read can show that {it} stopped working for the replica's leader"
        )
    return Selection(measured=tuple(measured))


#: The first vLLM release with ``--enable-server-load-tracking`` and ``GET /load``
#: (PR #13950; absent from 0.7.3).
LOAD_TRACKING_SINCE = (0, 8, 0)


def vllm_api_servers(wiring: Wiring) -> int | None:
    """How many API server processes ``vllm serve`` runs for ``wiring`` (None: cannot be
    told): ``--api-server-count``, else as vllm/entrypoints/cli/serve.py defaults it (0.25.1
    and 0.29.0 alike): 0 headless, 1 with an external or multi-port load balancer, the
    local data-parallel size with a hybrid one, the data-parallel size otherwise."""
    if wiring.raw("--api-server-count") is not None:
        return wiring.number("--api-server-count")
    if wiring.raw("--headless") == "true":
        return 0
    external = _on(wiring, "--data-parallel-external-lb") or (
        wiring.raw("--data-parallel-rank") is not None
    )
    if external or _on(wiring, "--data-parallel-multi-port-external-lb"):
        return 1
    if _on(wiring, "--data-parallel-hybrid-lb") or (
        wiring.raw("--data-parallel-start-rank") is not None
    ):
        if wiring.raw("--data-parallel-size-local") is None:
            return 1
        local = wiring.number("--data-parallel-size-local")
        return None if local is None else local or 1
    if wiring.raw("--data-parallel-size") is None:
        return _vllm_env_dp(wiring)
    return wiring.number("--data-parallel-size")


def exact_load(*, engine: str, version: str, wiring: Wiring | None) -> bool:
    """Whether a member running ``wiring`` counts its requests exactly at ``GET /load``:
    vLLM 0.8.0+ with ``--enable-server-load-tracking``, its own command line read without
    a problem, and one API server process (the count is per process: behind a shared
    port, one GET reads only one of them), not the Rust front end (not verified)."""
    if engine != "vLLM" or wiring is None or wiring.problems or wiring.unmanaged:
        return False
    if not at_least(version, LOAD_TRACKING_SINCE):
        return False
    if not _on(wiring, "--enable-server-load-tracking"):
        return False
    if "VLLM_USE_RUST_FRONTEND" in wiring.env:
        rust = wiring.env["VLLM_USE_RUST_FRONTEND"]  # None: not a literal, so unknown
        if rust is None or rust.strip().lower() not in ("", "0", "false"):
            return False
    return vllm_api_servers(wiring) == 1
