"""What an emulated engine reads from its Pod's rendered command line.

The emulator is told the ``main`` container's command line (``PodEngineSpec.args``: the
container's ``command`` then its ``args``, as the stand-in operator renders them) and reads
from it only the settings that change what the drain can observe, the way each engine's own
argument parser reads them. Everything else on the line is ignored (the emulator does not
know every flag and does not refuse what it does not know).

vLLM (0.29.0; the same in 0.25.1 for these flags), ``FlexibleArgumentParser``
(vllm/utils/argparse_utils.py, ``parse_args``) turns ``_`` into ``-`` in an option's name,
so ``--enable_server_load_tracking`` is ``--enable-server-load-tracking``:

- ``--enable-server-load-tracking`` (``BaseFrontendArgs.enable_server_load_tracking``,
  vllm/entrypoints/launchers/cli_args.py; 0.25.1: vllm/entrypoints/openai/cli_args.py):
  a ``bool`` field, so ``get_kwargs`` (vllm/engine/arg_utils.py, ``_compute_kwargs``)
  makes it ``argparse.BooleanOptionalAction``: ``--no-enable-server-load-tracking``
  exists too, the last one given wins, and neither takes a value (``--x=1`` is an error:
  the engine does not start). Default off.
- how many API server processes serve HTTP (vllm/entrypoints/cli/serve.py,
  ``ServeSubcommand.cmd``): ``--api-server-count``/``-asc`` when given; otherwise 1 with
  ``--data-parallel-multi-port-external-lb``/``-dpm``, with an external load balancer
  (``--data-parallel-external-lb``/``-dpe`` or ``--data-parallel-rank``/``-dpn``), the
  local DP size (``--data-parallel-size-local``/``-dpl``, else 1) in hybrid mode
  (``--data-parallel-hybrid-lb``/``-dph`` or ``--data-parallel-start-rank``/``-dpr``),
  and the DP size (``--data-parallel-size``/``-dp``) with the internal load balancer, the
  default. ``--headless`` runs none. Each process has its own ``app.state``, so its own
  ``server_load_metrics`` (see :mod:`testbed.emulator.engine`). (``VLLM_USE_RUST_FRONTEND``,
  an environment variable, is not read.)

SGLang (0.5.21), plain ``argparse`` built from its ``ServerArgs`` fields
(sglang/srt/arg_groups/arg_utils.py, ``add_cli_args_from_dataclass``: ``--`` + the field
name with ``-`` for ``_``; no ``_`` spelling; ``bool`` fields are ``store_true``):

- ``--decode-log-interval`` (int, default 40; sglang/srt/arg_groups/fields/observability.py):
  the decode batches between two scheduler metric reports;
- ``--load-snapshot-publish-interval`` (int, default 15; same file): the decode batches
  between two load snapshots (``ShmLoadSnapshotWriter`` takes ``max(1, N)``);
- ``--skip-server-warmup`` (sglang/srt/arg_groups/fields/serving.py): no warmup request at
  start (``_execute_server_warmup``, sglang/srt/entrypoints/http_server.py);
- ``--disable-overlap-schedule`` (sglang/srt/arg_groups/fields/schedule.py): the normal
  event loop instead of the overlapping one (``Scheduler.event_loop_normal`` /
  ``event_loop_overlap``, sglang/srt/managers/scheduler.py), which changes what a load
  snapshot published at a prefill shows (:mod:`testbed.emulator.sglang_scheduler`).

Not emulated: argparse's unambiguous prefixes (``--decode-log`` for
``--decode-log-interval``), ``--`` ending the options, vLLM's ``--config`` file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SglangArgs", "VllmArgs", "sglang_args", "vllm_args"]


@dataclass(frozen=True)
class VllmArgs:
    """What the emulated vLLM reads from its command line."""

    server_load_tracking: bool = False
    api_server_count: int = 1


@dataclass(frozen=True)
class SglangArgs:
    """What the emulated SGLang reads from its command line."""

    decode_log_interval: int = 40
    load_snapshot_publish_interval: int = 15
    skip_server_warmup: bool = False
    overlap_schedule: bool = True


def _vllm_name(token: str) -> tuple[str, str | None]:
    """An option token as vLLM's parser sees it: its name with ``_`` made ``-`` (only
    for ``--`` options, as ``FlexibleArgumentParser.parse_args`` does) and its ``=value``."""
    name, eq, value = token.partition("=")
    if name.startswith("--"):
        name = "--" + name[2:].replace("_", "-")
    return name, (value if eq else None)


class _Options:
    """The options of one command line, scanned the way argparse consumes them: a flag
    alone, or an option and its value (the next token, or ``=value``)."""

    def __init__(self, tokens: Sequence[str], *, valued: set[str], normalise: bool) -> None:
        self.seen: list[tuple[str, str | None]] = []
        index = 0
        while index < len(tokens):
            token = tokens[index]
            index += 1
            if not isinstance(token, str):
                raise ValueError("the command line must be strings")
            if not token.startswith("-") or token == "-":
                continue
            name, value = _vllm_name(token) if normalise else _split(token)
            if name in valued and value is None:
                if index >= len(tokens):
                    raise ValueError(f"argument {name}: expected one argument")
                value = tokens[index]
                index += 1
            self.seen.append((name, value))

    def last(self, *names: str) -> tuple[str, str | None] | None:
        """The last occurrence of any of ``names`` (argparse keeps the last)."""
        hits = [(n, v) for n, v in self.seen if n in names]
        return hits[-1] if hits else None


def _split(token: str) -> tuple[str, str | None]:
    name, eq, value = token.partition("=")
    return name, (value if eq else None)


def _int(name: str, value: str | None, *, minimum: int | None = None) -> int:
    """argparse's ``type=int`` (``int(text)``), then the engine's own bound when it has one."""
    try:
        number = int(value if value is not None else "")
    except ValueError:
        raise ValueError(f"argument {name}: invalid int value: {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"argument {name}: must be at least {minimum}, got {number}")
    return number


def _flag(name: str, value: str | None) -> bool:
    """A flag that takes no value (``store_true``, ``BooleanOptionalAction``)."""
    if value is not None:
        raise ValueError(f"argument {name}: ignored explicit argument {value!r}")
    return True


_LOAD = "--enable-server-load-tracking"
_NO_LOAD = "--no-enable-server-load-tracking"
_VLLM_VALUED = {
    "--api-server-count",
    "-asc",
    "--data-parallel-size",
    "-dp",
    "--data-parallel-size-local",
    "-dpl",
    "--data-parallel-rank",
    "-dpn",
    "--data-parallel-start-rank",
    "-dpr",
}


def vllm_args(tokens: Sequence[str], *, dp_ranks: int) -> VllmArgs:
    """Read a vLLM command line (see the module docstring). ``dp_ranks`` is the
    emulated engine's DP size, used when the line does not give ``--data-parallel-size``.
    Raises ``ValueError`` where vLLM's parser would refuse to start."""
    opts = _Options(tokens, valued=_VLLM_VALUED, normalise=True)
    tracking = False
    hit = opts.last(_LOAD, _NO_LOAD)
    if hit is not None:
        _flag(*hit)
        tracking = hit[0] == _LOAD

    def number(*names: str, minimum: int | None = None) -> int | None:
        found = opts.last(*names)
        return None if found is None else _int(found[0], found[1], minimum=minimum)

    def switch(long: str, short: str) -> bool:
        found = opts.last(long, short, "--no-" + long[2:])
        return found is not None and _flag(*found) and found[0] != "--no-" + long[2:]

    count = number("--api-server-count", "-asc")
    dp_size = number("--data-parallel-size", "-dp", minimum=1) or dp_ranks
    local = number("--data-parallel-size-local", "-dpl")
    rank = number("--data-parallel-rank", "-dpn")
    start_rank = number("--data-parallel-start-rank", "-dpr")
    headless = opts.last("--headless")
    multi_port_hit = opts.last("--data-parallel-multi-port-external-lb", "-dpm")
    multi_port = multi_port_hit is not None and _flag(*multi_port_hit)
    external = switch("--data-parallel-external-lb", "-dpe") or rank is not None
    hybrid = switch("--data-parallel-hybrid-lb", "-dph")
    if not hybrid and not multi_port:
        hybrid = start_rank is not None
    if sum([multi_port, external, hybrid]) > 1:
        raise ValueError("Cannot use more than one data parallel load balancing mode.")
    if headless is not None and _flag(*headless):
        if count is not None and count > 0:
            raise ValueError(f"--api-server-count={count} cannot be used with --headless")
        count = 0
    if count is None:
        if multi_port or external:
            count = 1
        elif hybrid:
            count = local or 1
        else:
            count = dp_size
    return VllmArgs(server_load_tracking=tracking, api_server_count=count)


_SGLANG_VALUED = {"--decode-log-interval", "--load-snapshot-publish-interval"}


def sglang_args(tokens: Sequence[str]) -> SglangArgs:
    """Read an SGLang command line (see the module docstring). Raises ``ValueError``
    where SGLang's parser would refuse to start, or for an interval below 1 (the
    scheduler divides by ``decode_log_interval``)."""
    opts = _Options(tokens, valued=_SGLANG_VALUED, normalise=False)
    out = SglangArgs()
    interval = opts.last("--decode-log-interval")
    publish = opts.last("--load-snapshot-publish-interval")
    warmup = opts.last("--skip-server-warmup")
    overlap = opts.last("--disable-overlap-schedule")
    return SglangArgs(
        decode_log_interval=(
            out.decode_log_interval if interval is None else _int(*interval, minimum=1)
        ),
        # ShmLoadSnapshotWriter: ``self.publish_interval = max(1, publish_interval)``.
        load_snapshot_publish_interval=(
            out.load_snapshot_publish_interval if publish is None else max(1, _int(*publish))
        ),
        skip_server_warmup=warmup is not None and _flag(*warmup),
        overlap_schedule=not (overlap is not None and _flag(*overlap)),
    )
