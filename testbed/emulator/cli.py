"""``python -m testbed.emulator``: run a hub until SIGTERM/SIGINT.

It prints one JSON line with the bound control address, which is how the bed learns a
port picked with ``--control-port 0``. ``--address-dev`` puts each Pod's address on an
interface of the bed's namespace before its emulator binds.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import signal
import subprocess
import threading
from collections.abc import Callable
from types import FrameType

from testbed.emulator.hub import EmulatorHub
from testbed.emulator.spec import PodEngineSpec

__all__ = ["address_adder", "main"]

_DEV_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")


def address_adder(dev: str) -> Callable[[PodEngineSpec], None]:
    """An ``on_add`` hook that puts each Pod's address on ``dev`` (``ip addr replace``).

    Loopback and unspecified addresses are left alone. No shell is involved: the address
    is parsed by :mod:`ipaddress` and the device name is checked.
    """
    if not _DEV_NAME.fullmatch(dev):
        raise ValueError(f"bad device name {dev!r}")

    def on_add(spec: PodEngineSpec) -> None:
        addr = ipaddress.ip_address(spec.serve_host)
        if addr.is_loopback or addr.is_unspecified:
            return
        prefix = 32 if addr.version == 4 else 128
        subprocess.run(
            ["ip", "addr", "replace", f"{addr}/{prefix}", "dev", dev],
            check=True,
            capture_output=True,
            timeout=10,
        )

    return on_add


def main(argv: list[str] | None = None) -> int:
    """Run a hub until SIGTERM/SIGINT. Prints one JSON line with the bound address."""
    parser = argparse.ArgumentParser(
        prog="python -m testbed.emulator", description="Run an engine emulator hub."
    )
    parser.add_argument("--control-host", default="127.0.0.1")
    parser.add_argument("--control-port", type=int, default=0)
    parser.add_argument(
        "--address-dev",
        default=None,
        help="put each Pod's serve_host on this interface before binding",
    )
    args = parser.parse_args(argv)
    on_add = address_adder(args.address_dev) if args.address_dev else None
    hub = EmulatorHub(args.control_host, args.control_port, on_add=on_add)

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=hub.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(
        json.dumps({"control_host": hub.control_host, "control_port": hub.control_port}), flush=True
    )
    hub.serve_forever()
    hub.shutdown()
    return 0
