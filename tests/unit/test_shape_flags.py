"""The parallelism reader (``retirement.shape.read_flags`` and the wiring built on it) reads
an engine's command line as that engine's own parser does: every spelling of one option is
that option, the last occurrence wins, and a token the engine would refuse, or that could be
several options, makes the shape undecidable with the reason.  Property tests over generated
argument lists check it against the rules it claims (spellings, order, argparse itself), and
that nothing crashes it or reads a supported multi-member shape out of garbage."""

from __future__ import annotations

import argparse
import random
import re
from collections.abc import Sequence
from typing import NoReturn

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kube.deployment import MalformedDeployment, parse_deployment
from kube.objects import EnvVar, Pod
from retirement.shape import (
    _TABLES,
    Shape,
    _Flag,
    _Kind,
    declared_wiring,
    disagreement,
    read_flags,
    read_shape,
    read_wiring,
    rendered_wiring,
    shape_of,
)

SUPPORTED = (Shape.SINGLE, Shape.LEADER_SERVED, Shape.EXTERNAL_DP)


def vllm(size: int, *args: str, env: Sequence[tuple[str, str | None]] = ()) -> Shape:
    reading = read_shape(
        engine="vLLM", role_kind="Server", size=size, extra_args=list(args), command=None, env=env
    )
    assert reading.supported or reading.reason
    return reading.shape


# ---------------------------------------------------------------- spellings, by example


@pytest.mark.parametrize(
    "args",
    [
        ["--data-parallel-external-lb"],
        ["--data_parallel_external_lb"],
        ["-dpe"],
        ["--data-parallel-ext"],  # a unique prefix
        ["--no-data-parallel-external-lb", "--data-parallel-external-lb"],  # the last wins
        ["--data-parallel-rank", "1"],
        ["--data-parallel-rank=$(GPUSTACK_MEMBER_INDEX)"],
        ["-dpn", "0"],
        ["-dpn=1"],
        ["--data_parallel_rank", "2"],
    ],
)
def test_every_vllm_spelling_of_external_lb_is_external_dp(args: list[str]) -> None:
    assert vllm(2, "--data-parallel-size", "2", *args) is Shape.EXTERNAL_DP


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--no-data-parallel-external-lb"],
        ["--data-parallel-external-lb", "--no-data-parallel-external-lb"],
        ["--no_data_parallel_external_lb"],
        ["--headless", "--data-parallel-start-rank", "1"],  # an engines-only rank
    ],
)
def test_vllm_without_an_external_balancer_is_leader_served(args: list[str]) -> None:
    assert vllm(2, "-dp", "2", *args) is Shape.LEADER_SERVED


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--data-parallel-external-lb=true"], "takes no value"),
        (["-dpe=1"], "takes no value"),
        (["--data-parallel-external-lb", "false"], "read as a separate argument"),
        (["--data-parallel-si", "2"], "ambiguous abbreviation"),
        (["--data-parallel-size 2"], "is one argument"),
        (["-dp2"], "glued"),
        (["-t=2"], "only from Python 3.12"),
        (["--data-parallel-size"], "has no value"),
        (["--data-parallel-size", "--enforce-eager"], "has no value"),
        (["--data-parallel-size", "two"], "not an integer"),
        (["--data-parallel-size", "-2"], "below 1"),
        (["--tensor-parallel-size=0"], "below 1"),
        (["--tp-size", "2"], "SGLang spelling"),
        (["--no-headless"], "has no --no- form"),
        (["--config", "serve.yaml"], "more arguments from a file"),
        (["--data-parallel-multi-port-external-lb"], "its own port"),
        (["-dpm"], "its own port"),
        (["--data-parallel-start-rank", "1"], "hybrid"),
        (["--data-parallel-rank", "1", "--data-parallel-start-rank", "1"], "more than one"),
        (["-dpe", "-dph"], "more than one"),
        (["-dpm", "-dph"], "more than one"),
    ],
)
def test_a_vllm_spelling_the_engine_refuses_or_cannot_be_read_is_refused(
    args: list[str], reason: str
) -> None:
    reading = read_shape(engine="vLLM", role_kind="Server", size=2, extra_args=args, command=None)
    assert not reading.supported
    assert reason in reading.reason


@pytest.mark.parametrize("args", [["-dc", "x"], ["-q", "fp8"], ["--host", "0.0.0.0"], ["-O3"]])
def test_an_exact_option_that_is_not_read_here_is_the_engines_business(args: list[str]) -> None:
    """``-dc`` is an option of vLLM's own (not an abbreviation of ``-dcp``)."""
    assert read_flags("vLLM", ["-tp", "2", *args]) == read_flags("vLLM", ["-tp", "2"])


@pytest.mark.parametrize(
    "args",
    [
        ["--tp-size", "2"],
        ["--tensor-parallel-size", "2"],
        ["--tp", "2"],  # argparse's unique prefix of --tp-size, a common spelling
        ["--tp-size=2"],
        ["--tp=2"],
        ["--tp-size", "4", "--tp", "2"],  # the last wins
    ],
)
def test_every_sglang_spelling_of_tp_reads_two(args: list[str]) -> None:
    wiring = read_wiring(engine="SGLang", args=args)
    assert wiring.problems == ()
    assert wiring.number("--tp-size") == 2


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--tp_size", "2"], "does not read underscores"),
        (["--dp_size=2"], "does not read underscores"),
        (["-tp", "2"], "vLLM spelling"),
        (["--data-parallel-external-lb"], "vLLM spelling"),
        (["--pp", "2"], "ambiguous abbreviation"),
        (["--enable-dp-attention=true"], "takes no value"),
        (["--nnodes", "$(NOT_PUBLISHED)"], "cannot be resolved"),
        (["--config", "server.yaml"], "more arguments from a file"),
    ],
)
def test_an_sglang_spelling_the_engine_refuses_is_refused(args: list[str], reason: str) -> None:
    reading = read_shape(engine="SGLang", role_kind="Server", size=2, extra_args=args, command=None)
    assert not reading.supported
    assert reason in reading.reason


def test_sglang_nnodes_may_name_the_published_replica_size() -> None:
    """``$(GPUSTACK_REPLICA_SIZE)`` is the role's size in every member above size one."""
    shape = read_shape(
        engine="SGLang",
        role_kind="Server",
        size=2,
        extra_args=["--nnodes", "$(GPUSTACK_REPLICA_SIZE)"],
        command=None,
    )
    assert shape.shape is Shape.LEADER_SERVED


# ---------------------------------------------------------------- the environment


def test_vllm_reads_data_parallel_size_from_the_environment_only_without_a_cli_size() -> None:
    assert vllm(2, env=[("VLLM_DP_SIZE", "2")]) is Shape.UNDECIDABLE
    assert vllm(1, env=[("VLLM_DP_SIZE", "2")]) is Shape.SINGLE
    # The command line drives data parallelism: the variable is never read.
    assert vllm(2, "-dp", "2", env=[("VLLM_DP_SIZE", "x")]) is Shape.LEADER_SERVED
    assert vllm(2, "-dpl", "0", env=[("VLLM_DP_SIZE", "x")]) is Shape.LEADER_SERVED
    # A later entry of a name wins, as in the container; $(VAR) expands earlier literals.
    assert vllm(2, env=[("VLLM_DP_SIZE", "4"), ("VLLM_DP_SIZE", "1")]) is Shape.LEADER_SERVED
    assert vllm(2, env=[("N", "3"), ("VLLM_DP_SIZE", "$(N)")]) is Shape.UNDECIDABLE


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ([("VLLM_DP_SIZE", "two")], "not an integer"),
        ([("VLLM_DP_SIZE", "0")], "below 1"),
        ([("VLLM_DP_SIZE", None)], "not a literal value"),
        ([("VLLM_DP_RANK", "first")], "not an integer"),
        ([("VLLM_DP_MASTER_PORT", "http")], "not an integer"),
    ],
)
def test_an_unreadable_data_parallel_variable_is_refused(
    env: list[tuple[str, str | None]], reason: str
) -> None:
    reading = read_shape(
        engine="vLLM", role_kind="Server", size=1, extra_args=[], command=None, env=env
    )
    assert reading.shape is Shape.UNDECIDABLE and reason in reading.reason


# ---------------------------------------------------------------- a Pod's command line


GPUSTACK_VLLM = ["vllm", "serve", "/models"]
GPUSTACK_SGLANG = ["python3", "-m", "sglang.launch_server", "--model-path", "/models"]
BIND = ["--host", "0.0.0.0", "--port", "8000"]


def test_a_rendered_command_line_agrees_with_the_declared_one_in_other_spellings() -> None:
    declared = declared_wiring(
        engine="vLLM",
        size=2,
        extra_args=["--data-parallel-size", "2", "--data-parallel-rank", "$(IDX)", "-tp", "2"],
    )
    rendered = rendered_wiring(
        engine="vLLM",
        command=[*GPUSTACK_VLLM, "-dp=2", "-dpn", "$(IDX)", "--tensor_parallel_size", "02", *BIND],
        args=[],
        env=[("GPUSTACK_REPLICA_SIZE", "2"), ("IDX", None)],
    )
    assert disagreement(declared, rendered) == ()
    assert shape_of(engine="vLLM", role_kind="Server", size=2, wiring=rendered).shape is (
        Shape.EXTERNAL_DP
    )


def test_a_rendered_command_line_that_disagrees_names_both_sides() -> None:
    declared = declared_wiring(engine="vLLM", size=2, extra_args=["-dp", "2", "-dpe"])
    rendered = rendered_wiring(engine="vLLM", command=[*GPUSTACK_VLLM, "-dp", "4", *BIND], args=[])
    assert disagreement(declared, rendered) == (
        ("--data-parallel-size", "'2'", "'4'"),
        ("--data-parallel-external-lb", "'true'", "'false'"),
    )


def test_a_rendered_command_line_is_command_then_args() -> None:
    rendered = rendered_wiring(engine="SGLang", command=GPUSTACK_SGLANG, args=["--tp", "2"])
    assert rendered.number("--tp-size") == 2 and not rendered.unmanaged
    # No command: the image's entrypoint runs the args.
    assert rendered_wiring(engine="vLLM", command=[], args=["-dpe"]).raw(
        "--data-parallel-external-lb"
    ) == ("true")


@pytest.mark.parametrize(
    "command",
    [
        ["bash", "-c", "vllm serve /models -dpe"],
        ["/bin/sh", "-c", "exec vllm serve"],
        ["python3", "-m", "sglang.launch_server"],  # the other engine
        ["vllm", "bench"],
    ],
)
def test_a_rendered_command_line_that_is_not_the_engines_own_is_unmanaged(
    command: list[str],
) -> None:
    rendered = rendered_wiring(engine="vLLM", command=command, args=[])
    assert rendered.unmanaged
    reading = shape_of(engine="vLLM", role_kind="Server", size=1, wiring=rendered)
    assert reading.shape is Shape.UNMANAGED and not reading.supported


@pytest.mark.parametrize(
    "command",
    [
        ["vllm", "serve", "/models"],
        ["/usr/local/bin/vllm", "serve"],
        ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        ["python3.12", "-m", "vllm.entrypoints.openai.api_server"],
    ],
)
def test_the_engines_launchers_are_read(command: list[str]) -> None:
    rendered = rendered_wiring(engine="vLLM", command=[*command, "-dpe"], args=[])
    assert not rendered.unmanaged and rendered.raw("--data-parallel-external-lb") == "true"


# ---------------------------------------------------------------- generated spellings

# A logical assignment of options, rendered in randomly chosen spellings and orders, must
# read the same as its plainest rendering.

LONG_ABBREVIATION_FLOOR = 3


def _all_long(engine: str) -> list[str]:
    return [s for f in _TABLES[engine] for s in f.spellings() if s.startswith("--")]


def _unique_prefixes(engine: str, name: str) -> list[str]:
    """Every prefix of the long spelling ``name`` that argparse resolves to it alone."""
    others = [s for s in _all_long(engine) if s != name]
    return [
        name[:n]
        for n in range(LONG_ABBREVIATION_FLOOR, len(name))
        if not any(o.startswith(name[:n]) for o in others)
    ]


def _flag(engine: str, canonical: str) -> _Flag:
    return next(f for f in _TABLES[engine] if f.canonical == canonical)


def _underscored(name: str, rnd: random.Random) -> str:
    """A vLLM long spelling with some of its dashes written as underscores."""
    head, body = name[:2], name[2:]
    return head + "".join("_" if c == "-" and rnd.random() < 0.5 else c for c in body)


def _spell_value(engine: str, flag: _Flag, value: str, rnd: random.Random) -> list[str]:
    long = [n for n in flag.names if n.startswith("--")]
    choices = list(flag.names) + [p for n in long for p in _unique_prefixes(engine, n)]
    name = rnd.choice(choices)
    if engine == "vLLM" and name.startswith("--") and rnd.random() < 0.5:
        name = _underscored(name, rnd)
    return [f"{name}={value}"] if rnd.random() < 0.5 else [name, value]


def _spell_bool(engine: str, flag: _Flag, on: bool, rnd: random.Random) -> list[str]:
    names = list(flag.names) if on else ["--no-" + n[2:] for n in flag.names if n.startswith("--")]
    name = rnd.choice(names)
    if engine == "vLLM" and name.startswith("--") and rnd.random() < 0.5:
        name = _underscored(name, rnd)
    return [name]


VLLM_VALUES = {
    "--tensor-parallel-size": ["1", "2", "4", "02", " 8"],
    "--pipeline-parallel-size": ["1", "2"],
    "--data-parallel-size": ["1", "2", "4", "1_6"],
    "--data-parallel-size-local": ["0", "1", "2"],
    "--data-parallel-rank": ["0", "3", "$(GPUSTACK_MEMBER_INDEX)"],
    "--data-parallel-start-rank": ["0", "2"],
    "--data-parallel-address": ["10.0.0.1", "$(GPUSTACK_REPLICA_LEADER_ADDRESS)"],
    "--data-parallel-rpc-port": ["13345"],
    "--data-parallel-backend": ["mp", "ray"],
    "--nnodes": ["1", "2"],
    "--node-rank": ["0", "1", "$(GPUSTACK_MEMBER_INDEX)"],
    "--master-addr": ["leader"],
}
VLLM_BOOLS = [
    "--data-parallel-external-lb",
    "--data-parallel-hybrid-lb",
    "--data-parallel-multi-port-external-lb",
    "--enable-expert-parallel",
]
SGLANG_VALUES = {
    "--tp-size": ["1", "2", "8"],
    "--pp-size": ["1", "2"],
    "--dp-size": ["1", "2", "4"],
    "--ep-size": ["1", "8"],
    "--nnodes": ["1", "2", "$(GPUSTACK_REPLICA_SIZE)"],
    "--node-rank": ["0", "$(GPUSTACK_MEMBER_INDEX)"],
    "--dist-init-addr": ["$(GPUSTACK_REPLICA_LEADER_ADDRESS):5000"],
    "--disaggregation-mode": ["null"],
}
#: Options neither reader reads, with values that are no option of either engine.
UNRELATED = [
    ["--max-model-len", "4096"],
    ["--enforce-eager"],
    ["--served-model-name", "m"],
    ["--gpu-memory-utilization=0.9"],
    ["--trust-remote-code"],
    ["--log-level", "info"],
    ["/models"],
]


@st.composite
def assignments(draw: st.DrawFn, engine: str) -> dict[str, str]:
    """A logical assignment: canonical option -> value ("true"/"false" for booleans)."""
    out: dict[str, str] = {}
    values = VLLM_VALUES if engine == "vLLM" else SGLANG_VALUES
    for name in draw(st.lists(st.sampled_from(sorted(values)), unique=True, max_size=6)):
        out[name] = draw(st.sampled_from(values[name]))
    if engine == "vLLM":
        for name in draw(st.lists(st.sampled_from(VLLM_BOOLS), unique=True, max_size=2)):
            out[name] = draw(st.sampled_from(["true", "false"]))
        if draw(st.booleans()):
            out["--headless"] = "true"
    elif draw(st.booleans()):
        out["--enable-dp-attention"] = "true"
    return out


def plain(engine: str, assignment: dict[str, str]) -> list[str]:
    """The plainest rendering: canonical spellings, ``--flag value``, booleans only if on."""
    out: list[str] = []
    for name, value in assignment.items():
        flag = _flag(engine, name)
        if flag.kind is _Kind.VALUE:
            out += [name, value]
        elif value == "true":
            out.append(name)
    return out


def spelled(engine: str, assignment: dict[str, str], seed: int, decoys: bool) -> list[str]:
    """The same assignment in random spellings, with unrelated options, in random order;
    with ``decoys``, each option is preceded by an earlier occurrence the last one overrides."""
    rnd = random.Random(seed)
    groups: list[list[str]] = [list(u) for u in UNRELATED if rnd.random() < 0.5]
    for name, value in assignment.items():
        flag = _flag(engine, name)
        group: list[str] = []
        if flag.kind is _Kind.VALUE:
            if decoys:
                group += _spell_value(engine, flag, "7", rnd)
            group += _spell_value(engine, flag, value, rnd)
        else:
            on = value == "true"
            negatable = flag.kind is _Kind.BOOL
            if decoys and negatable:
                group += _spell_bool(engine, flag, not on, rnd)
            if on or (negatable and (decoys or rnd.random() < 0.5)):
                group += _spell_bool(engine, flag, on, rnd)
        groups.append(group)
    rnd.shuffle(groups)
    return [t for g in groups for t in g]


@settings(max_examples=400, deadline=None)
@given(
    engine=st.sampled_from(["vLLM", "SGLang"]),
    data=st.data(),
    size=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    decoys=st.booleans(),
)
def test_every_spelling_and_order_of_one_assignment_reads_the_same(
    engine: str, data: st.DataObject, size: int, seed: int, decoys: bool
) -> None:
    assignment = data.draw(assignments(engine))
    canonical = declared_wiring(engine=engine, size=size, extra_args=plain(engine, assignment))
    variant = declared_wiring(
        engine=engine, size=size, extra_args=spelled(engine, assignment, seed, decoys)
    )
    assert variant.problems == canonical.problems == (), (variant.problems, canonical.problems)
    assert disagreement(canonical, variant) == ()
    a = shape_of(engine=engine, role_kind="Server", size=size, wiring=canonical)
    b = shape_of(engine=engine, role_kind="Server", size=size, wiring=variant)
    assert (a.shape, a.reason) == (b.shape, b.reason)
    # And as a Pod runs it: the operator's launcher, then the arguments, then its bind.
    launcher = GPUSTACK_VLLM if engine == "vLLM" else GPUSTACK_SGLANG
    running = rendered_wiring(
        engine=engine,
        command=[*launcher, *spelled(engine, assignment, seed + 1, decoys), *BIND],
        args=[],
        env=[("GPUSTACK_REPLICA_SIZE", str(size))] if size > 1 else [],
    )
    assert disagreement(canonical, running) == ()


_ENV_VALUES = st.sampled_from(["1", "2", "x", "", "$(OTHER)"]) | st.none()


@settings(max_examples=300, deadline=None)
@given(
    env=st.dictionaries(
        st.sampled_from(["VLLM_DP_SIZE", "VLLM_DP_RANK", "VLLM_DP_MASTER_IP", "OTHER", "HOME"]),
        _ENV_VALUES,
    ),
    args=st.sampled_from([[], ["-dp", "2"], ["-dpl", "0"], ["-dp", "$(OTHER)"], ["-dpe"]]),
    size=st.integers(1, 3),
    seed=st.integers(0, 2**32),
)
def test_the_order_of_distinct_environment_entries_does_not_matter(
    env: dict[str, str | None], args: list[str], size: int, seed: int
) -> None:
    entries = sorted(env.items())
    shuffled = list(entries)
    random.Random(seed).shuffle(shuffled)
    # A reference resolves only to an earlier entry, as in a container: keep OTHER first.
    shuffled.sort(key=lambda e: e[0] != "OTHER")
    entries.sort(key=lambda e: e[0] != "OTHER")
    a = declared_wiring(engine="vLLM", size=size, extra_args=args, env=entries)
    b = declared_wiring(engine="vLLM", size=size, extra_args=args, env=shuffled)
    assert a.problems == b.problems and disagreement(a, b) == ()
    sa = shape_of(engine="vLLM", role_kind="Server", size=size, wiring=a)
    sb = shape_of(engine="vLLM", role_kind="Server", size=size, wiring=b)
    assert (sa.shape, sa.reason) == (sb.shape, sb.reason)


@settings(max_examples=200, deadline=None)
@given(
    engine=st.sampled_from(["vLLM", "SGLang"]),
    data=st.data(),
    seed=st.integers(0, 2**32),
)
def test_changing_one_option_is_a_disagreement_that_names_it(
    engine: str, data: st.DataObject, seed: int
) -> None:
    assignment = data.draw(assignments(engine))
    values = VLLM_VALUES if engine == "vLLM" else SGLANG_VALUES
    name = data.draw(st.sampled_from(sorted(values)))
    changed = {**assignment, name: "5" if _flag(engine, name).minimum is not None else "elsewhere"}
    declared = declared_wiring(engine=engine, size=2, extra_args=plain(engine, assignment))
    running = declared_wiring(
        engine=engine, size=2, extra_args=spelled(engine, changed, seed, decoys=False)
    )
    diff = disagreement(declared, running)
    if assignment.get(name) == changed[name]:
        assert diff == ()
    else:
        assert [what for what, _, _ in diff] == [name]


# ---------------------------------------------------------------- argparse as the oracle


def _flexible(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser rewrite of long keys (vllm/utils/argparse_utils.py)."""
    out = []
    for arg in argv:
        if arg.startswith("--"):
            key, eq, value = arg.partition("=")
            key = re.sub(r"(?<=--)[^\.]*", lambda m: m.group(0).replace("_", "-"), key, count=1)
            out.append(key + eq + value)
        else:
            out.append(arg)
    return out


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # raise, quietly, on every refusal
        raise argparse.ArgumentError(None, message)


def oracle(engine: str, argv: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """What a real argparse parser with the engine's options (abbreviations allowed, as both
    engines' parsers) reads from ``argv``: our options' last values and the tokens it does
    not take, or None when it refuses the list."""
    parser = _Parser(allow_abbrev=True, exit_on_error=False, add_help=False)
    dests: dict[str, str] = {}
    for i, flag in enumerate(_TABLES[engine]):
        dest = f"o{i}"
        if not flag.ours:  # a neighbour never refuses here: only its prefixes matter
            parser.add_argument(*flag.names, dest=dest, nargs="?")
            continue
        dests[dest] = flag.canonical
        if flag.kind is _Kind.VALUE:
            parser.add_argument(*flag.names, dest=dest)
        elif flag.kind is _Kind.BOOL:
            parser.add_argument(*flag.names, dest=dest, action=argparse.BooleanOptionalAction)
        else:
            parser.add_argument(*flag.names, dest=dest, action="store_true", default=None)
    if engine == "vLLM":
        for short in ("-sc", "-dc", "-cc", "-ac"):  # vLLM's other single-dash options
            parser.add_argument(short, dest=f"x{short}", nargs="?")
        argv = _flexible(argv)
    try:
        ns, extras = parser.parse_known_args(argv)
    except argparse.ArgumentError:
        return None
    values: dict[str, str] = {}
    for dest, name in dests.items():
        v = getattr(ns, dest)
        if v is not None:
            values[name] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return values, extras


def _vocabulary(engine: str, *, rare: bool = True) -> list[str]:
    """Tokens of argument lists: every spelling of the options read here, with a value after
    '=', and (``rare``) their corruptions: truncations, underscores, glued values."""
    words: list[str] = []
    for flag in _TABLES[engine]:
        if not flag.ours or flag.canonical == "--config":
            continue
        for name in flag.spellings():
            words += [name, name + "=1"]
            if not rare:
                continue
            words.append(name[: max(3, len(name) - 3)])
            if engine == "vLLM" and name.startswith("--"):
                words.append(name.replace("-", "_").replace("__", "--", 1))
            if not name.startswith("--"):
                words.append(name + "2")
    others = ["-sc", "-dc", "-q", "--enforce-eager", "--host"] if engine == "vLLM" else ["--host"]
    return [*words, *others, "1", "0", "-1", "two", "true", "false", "x y", "--"]


def _argv(engine: str) -> st.SearchStrategy[list[str]]:
    """Argument lists, three tokens in four from the plain vocabulary."""
    plain_words = st.sampled_from(_vocabulary(engine, rare=False))
    token = plain_words | plain_words | plain_words | st.sampled_from(_vocabulary(engine))
    return st.lists(token, max_size=8).map(lambda a: a[: a.index("--")] if "--" in a else a)


@settings(max_examples=1500, deadline=None)
@given(
    engine=st.sampled_from(["vLLM", "SGLang"]),
    data=st.data(),
)
def test_the_reader_agrees_with_argparse(engine: str, data: st.DataObject) -> None:
    argv = data.draw(_argv(engine))
    mine = read_flags(engine, argv)
    theirs = oracle(engine, argv)
    if theirs is None:
        assert mine.problems, argv  # the engine refuses the list: so does the reader
        return
    values, extras = theirs
    if mine.problems:
        assert extras, (argv, mine.problems)  # a token the engine would not take
    else:
        assert dict(mine.values) == values, argv


@settings(max_examples=600, deadline=None)
@given(
    engine=st.sampled_from(["vLLM", "SGLang"]),
    size=st.integers(2, 4),
    data=st.data(),
)
def test_garbage_never_reads_a_supported_multi_member_shape_by_accident(
    engine: str, size: int, data: st.DataObject
) -> None:
    """Corrupted spellings of the options that decide a shape: the shape is refused, or
    it is exactly the shape argparse's own reading of the list gives."""
    argv = data.draw(_argv(engine))
    reading = read_shape(
        engine=engine, role_kind="Server", size=size, extra_args=argv, command=None
    )
    if not reading.supported:
        assert reading.reason
        return
    theirs = oracle(engine, argv)
    assert theirs is not None, argv
    values, _ = theirs
    again = shape_of(
        engine=engine,
        role_kind="Server",
        size=size,
        wiring=read_wiring(engine=engine, args=plain(engine, values)),
    )
    assert again.shape is reading.shape, (argv, values)


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_token = (
    _text
    | st.sampled_from(_vocabulary("vLLM") + _vocabulary("SGLang"))
    | st.builds("{}={}".format, st.sampled_from(_vocabulary("vLLM")), _text)
    | st.builds("$({})".format, _text)
)


@settings(max_examples=500, deadline=None)
@given(
    engine=st.sampled_from(["vLLM", "SGLang", "TGI", ""]),
    kind=st.sampled_from(["Server", "Prefill", "Decode", ""]),
    size=st.integers(-1, 4),
    args=st.lists(_token, max_size=10),
    command=st.lists(_token, max_size=4),
    env=st.lists(
        st.tuples(_text | st.sampled_from(["VLLM_DP_SIZE", "VLLM_DP_RANK"]), st.none() | _text),
        max_size=4,
    ),
)
def test_garbage_never_crashes_the_reader(
    engine: str,
    kind: str,
    size: int,
    args: list[str],
    command: list[str],
    env: list[tuple[str, str | None]],
) -> None:
    declared = read_shape(
        engine=engine, role_kind=kind, size=size, extra_args=args, command=None, env=env
    )
    assert isinstance(declared.shape, Shape)
    assert declared.supported or declared.reason
    running = rendered_wiring(engine=engine, command=command, args=args, env=env)
    shown = shape_of(engine=engine, role_kind=kind, size=size, wiring=running)
    assert shown.supported or shown.reason
    for what, a, b in disagreement(
        declared_wiring(engine=engine, size=max(size, 1), extra_args=args, env=env), running
    ):
        assert what and a != b
    if declared.supported and size > 1:
        assert declared.shape in SUPPORTED


# ---------------------------------------------------------------- the sources' typed views


def test_a_pods_main_container_view_carries_its_command_and_env() -> None:
    pod = Pod.from_raw(
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "command": ["vllm", "serve", 7],
                        "args": ["-dpe"],
                        "env": [
                            {"name": "A", "value": "1"},
                            {"name": "B"},  # no value: the empty string
                            {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                            {"name": "D", "value": 2},  # not a string: not a literal
                            {"value": "no name"},
                            "not an entry",
                            {"name": 5, "value": "x"},
                        ],
                    },
                    {"name": "side", "env": "not a list", "command": "not a list"},
                ]
            },
        }
    )
    main, side = pod.containers
    assert main.command == ("vllm", "serve", "7") and main.args == ("-dpe",)
    assert main.env == (
        EnvVar("A", "1"),
        EnvVar("B", ""),
        EnvVar("C", None),
        EnvVar("D", None),
    )
    assert side.env == () and side.command == ()


def _md(env: object) -> dict[str, object]:
    return {
        "metadata": {"name": "md"},
        "spec": {
            "engine": {"name": "vLLM"},
            "roles": [{"name": "server", "replicas": 1, "env": env}],
        },
    }


def test_a_roles_env_is_read_with_non_literal_values_kept_as_such() -> None:
    md = parse_deployment(
        _md(
            [
                {"name": "VLLM_DP_SIZE", "value": "2"},
                {"name": "VLLM_DP_RANK", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                {"name": "EMPTY"},
                {"name": "N", "value": 3},
            ]
        )
    )
    (role,) = md.roles
    assert role.env == (
        EnvVar("VLLM_DP_SIZE", "2"),
        EnvVar("VLLM_DP_RANK", None),
        EnvVar("EMPTY", ""),
        EnvVar("N", None),
    )
    assert parse_deployment(_md(None)).roles[0].env == ()


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ("VLLM_DP_SIZE=2", "env must be a list of objects, not str"),
        (["VLLM_DP_SIZE=2"], "env[0] must be an object, not str"),
        ([{"value": "2"}], "env[0].name must be a string, not null"),
    ],
)
def test_a_malformed_role_env_is_a_malformed_deployment(env: object, reason: str) -> None:
    with pytest.raises(MalformedDeployment) as e:
        parse_deployment(_md(env))
    assert reason in e.value.reason
