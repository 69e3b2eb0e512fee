"""``python -m bench [idle|watcher|worker|scale-down|all] [flags]``: one benchmark, or all.

Each benchmark starts its own bed, prints progress lines and its table, writes a picture to
``bench/results/`` and stops by itself; ``python -m bench NAME --help`` lists its flags.
``all`` (the default) runs every benchmark with its defaults, one after the other.
``python -m bench watcher-profile`` takes the watcher's CPU per event apart offline (no
bed; not part of ``all``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from bench import idle, scale_down, watcher_fleet, worker_fleet

BENCHMARKS: dict[str, Callable[[list[str] | None], int]] = {
    "idle": idle.main,
    "scale-down": scale_down.main,
    "watcher": watcher_fleet.main,
    "worker": worker_fleet.main,
}


def _watcher_profile(argv: list[str] | None) -> int:
    from bench import watcher_profile  # imports the tests' fakes: only when asked for

    return watcher_profile.main(argv)


#: Offline tools, run by name only.
TOOLS: dict[str, Callable[[list[str] | None], int]] = {"watcher-profile": _watcher_profile}


def main(argv: list[str]) -> int:
    """Dispatch on the first argument."""
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    name, rest = (argv[0], argv[1:]) if argv else ("all", [])
    if name == "all" and not rest:
        return max(fn([]) for fn in BENCHMARKS.values())
    known = {**BENCHMARKS, **TOOLS}
    if name not in known:
        print(f"unknown benchmark {name!r}; one of: all, {', '.join(known)}", file=sys.stderr)
        return 2
    return known[name](rest)


raise SystemExit(main(sys.argv[1:]))
