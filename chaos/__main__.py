"""``python -m chaos --seed S --minutes M --deployments D``: one fault campaign on the bed,
its report printed and saved (``--out``); exit 1 when an invariant is broken."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from chaos.campaign import MODES, campaign
from chaos.oracle import WAIT_BOUND_S
from chaos.report import save, text
from chaos.schedule import draw
from testbed.bed import Bed
from testbed.paths import REPO_ROOT
from testbed.procs import exit_on_sigterm

#: The settle period: a retirement may take the wait bound of invariant 5 to come to rest
#: once the faults end, so convergence is judged no sooner (the 24-minute run of
#: 2026-12-05 judged c07 unconverged at 240 s; it came to rest 8 s later).
SETTLE_S = WAIT_BOUND_S + 30.0
NAMESPACE = "chaos"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m chaos", description=__doc__)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--minutes", type=float, default=15.0, help="how long actions are drawn")
    p.add_argument("--deployments", type=int, default=12)
    p.add_argument("--pace", type=float, default=4.0, help="mean seconds between actions")
    p.add_argument(
        "--settle",
        type=float,
        default=SETTLE_S,
        help="seconds to converge after the faults (default: the wait bound of invariant 5, "
        "330 s, and 30 s more)",
    )
    p.add_argument("--streams", type=int, default=3, help="request streams per routed deployment")
    p.add_argument(
        "--mode",
        choices=MODES,
        default="product",
        help="product: the watcher and worker retire; baselines: plain (Pods deleted at "
        "once), prestop (Pods deleted with a 5 s preStop sleep and 30 s grace)",
    )
    p.add_argument(
        "--routerless-policy",
        choices=("quiet-window", "hold"),
        default="quiet-window",
        help="the watcher's policy for the router-less deployments",
    )
    p.add_argument("--out", type=Path, default=REPO_ROOT / "chaos" / "results")
    a = p.parse_args(argv)
    if a.minutes <= 0 or a.deployments < 1 or a.settle <= 0 or a.streams < 1 or a.pace <= 0:
        p.error("--minutes, --settle, --pace must be positive; --deployments, --streams at least 1")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    plan = draw(seed=a.seed, seconds=a.minutes * 60, deployments=a.deployments, pace=a.pace)
    exit_on_sigterm()  # a timeout's SIGTERM still stops the bed
    # One state directory per mode: a later run does not wipe the evidence of an earlier
    # one (the audit log, the routers', worker's and watcher's logs).
    bed = Bed(state_dir=REPO_ROOT / ".bed" / f"chaos-{a.mode}")
    try:
        print("starting the bed (control plane with the audit log, emulator hub)", flush=True)
        bed.start()
        bed.create_namespace(NAMESPACE)
        r = asyncio.run(
            campaign(
                plan,
                bed=bed,
                namespace=NAMESPACE,
                state_dir=bed.state_dir / "campaign",
                settle_s=a.settle,
                streams=a.streams,
                mode=a.mode,
                routerless=a.routerless_policy,
            )
        )
    finally:
        bed.stop()
    print(text(r))
    print(f"report: {save(r, a.out / f'seed-{a.seed}-{a.mode}')}")
    return 0 if r["verdict"].ok else 1


if __name__ == "__main__":
    sys.exit(main())
