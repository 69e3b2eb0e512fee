"""Supervision of the bed's child processes: start, wait for readiness, stop cleanly.

Every child runs in its own process group so that stopping it also stops anything it
spawned, and every child is stopped when the interpreter exits, so no stray process is
left behind by a test run or a Ctrl-C'd demo.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_LIVE: list[Child] = []
#: One file per live child, so a later run can reap what a killed run left behind.
PID_DIR = Path(__file__).resolve().parent.parent / ".bed" / "pids"


class Child:
    """One supervised child process with its log file."""

    def __init__(
        self,
        *,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
        )
        _LIVE.append(self)
        PID_DIR.mkdir(parents=True, exist_ok=True)
        (PID_DIR / str(self.proc.pid)).write_text(self.name)

    @property
    def pid(self) -> int:
        """The child's process ID (also its process group ID)."""
        return self.proc.pid

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the child's log, for error messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, *, timeout: float = 10.0) -> None:
        """SIGTERM the child's process group, then SIGKILL it if it lingers."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=timeout)
        # Children of the child (same group) that outlived it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._forget()

    def _forget(self) -> None:
        self._log.close()
        if self in _LIVE:
            _LIVE.remove(self)
        (PID_DIR / str(self.proc.pid)).unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL the child's whole process group at once (a crash, for fault tests)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._forget()


def reap_strays() -> list[str]:
    """Kill the process groups a killed earlier run left behind; returns their names."""
    reaped: list[str] = []
    if not PID_DIR.is_dir():
        return reaped
    for f in PID_DIR.iterdir():
        if not f.name.isdigit() or any(c.pid == int(f.name) for c in _LIVE):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(int(f.name), signal.SIGKILL)
            reaped.append(f.read_text())
        f.unlink(missing_ok=True)
    return reaped


def exit_on_sigterm() -> None:
    """Make SIGTERM a normal exit, so finalizers and atexit stop the children."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def wait_until(
    what: str,
    check: Callable[[], bool],
    *,
    timeout: float,
    child: Child | None = None,
    interval: float = 0.2,
) -> None:
    """Poll ``check`` until it is true; fail with the child's log if it dies or times out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if child is not None and not child.alive():
            raise RuntimeError(f"{what}: {child.name} exited early:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            tail = f":\n{child.log_tail()}" if child is not None else ""
            raise TimeoutError(f"{what}: not ready after {timeout:.0f} s{tail}")
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def port_open(host: str, port: int) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def stop_all() -> None:
    """Stop every live child, newest first."""
    for child in reversed(list(_LIVE)):
        with contextlib.suppress(Exception):
            child.stop(timeout=5)


atexit.register(stop_all)
