"""What the worker and the watcher processes share beyond the connection: usage errors on
one line, the log levels of ``--log-level`` (and ``RETIRE_LOG_LEVEL``), and a log format
that names each line's level."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import NoReturn

#: The log levels of ``--log-level`` (and ``RETIRE_LOG_LEVEL``), least severe first.
LOG_LEVELS = ("debug", "info", "warning", "error")
DEFAULT_LOG_LEVEL = "info"
LOG_LEVEL_ENV = "RETIRE_LOG_LEVEL"
#: Every log line names its level: an operator greps for WARNING and ERROR.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr (exit 2, as argparse's): a
    daemon's log is read line by line, and the usage block would bury the reason."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {text} (see --help)\n")


def error_line(error: BaseException, limit: int = 400) -> str:
    """An exception's message on one line (YAML, SDK and pydantic messages span several)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def kubeconfig_error(kubeconfig: str | None, error: BaseException) -> str:
    """Why the Kubernetes configuration cannot be loaded, naming where it was looked for."""
    if kubeconfig:
        return f"--kubeconfig (or KUBECONFIG) {kubeconfig}: cannot load it: {error_line(error)}"
    return f"no --kubeconfig (or KUBECONFIG) and no in-cluster configuration: {error_line(error)}"


def fail(prog: str, code: int, message: str) -> int:
    """Say ``message`` on one stderr line; returns ``code``."""
    print(f"{prog}: {message}", file=sys.stderr, flush=True)
    return code


def end_process(code: int) -> NoReturn:
    """End the process with ``code`` without the interpreter's finalization.

    The Temporal SDK completes its calls from its own (Rust, Tokio) threads: a failed
    ``Client.connect`` sets the Python future's result through ``call_soon_threadsafe``,
    whose write to the loop's socket releases the GIL.  The main thread then sees the
    error, returns, and the interpreter finalizes while that thread still has to take the
    GIL back; during finalization it cannot, and ``PyGILState_Release`` aborts the process
    (SIGABRT, exit 134) or it segfaults.  Reproduced in about one run in three against a
    closed port, in a ten-line script with only ``Client.connect``; the same holds for a
    visibility query still completing when the watcher gets SIGTERM.  Nothing of the
    worker's or the watcher's needs finalization once it has stopped serving, so the
    process flushes its output and leaves with ``os._exit``.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(code)
