"""What a command line and its environment wire: the one reader (``read_wiring``, through
``read_flags``) reads a role's declared ``extraArgs`` and ``env`` (``declared_wiring``) and
what a Pod's ``main`` container runs (``rendered_wiring``); ``disagreement`` says where the
two differ."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from retirement.shape.engines import _LAUNCHERS, _NOT_SHAPE, _TABLES
from retirement.shape.flags import read_flags

_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


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


def _on(wiring: Wiring, name: str) -> bool:
    return wiring.raw(name) == "true"
