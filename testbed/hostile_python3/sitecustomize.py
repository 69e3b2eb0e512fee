"""A hostile engine container's ``python3``, for the bed only (``tests/bed``): imported at
start-up by every ``python3`` that kwok runs for an exec into one of the hostile Pods
(``testbed.controlplane.HOSTILE_EXECS``: their ClusterExec puts this directory on
``PYTHONPATH`` and names the behaviour in ``BED_HOSTILE_PYTHON3``), before the command's own
code runs; and run as the program by the hostile ``python3`` beside it, for a command that
keeps ``sitecustomize`` out (the one-shot's ``-I -S``).  Anywhere else (the variable unset)
it does nothing.

- ``flood-stdout`` / ``flood-stderr``: write 64 KiB blocks for ever (until the reader goes
  away: a broken pipe ends the process);
- ``hang``: print nothing and never exit.
"""

import os
import sys
import time

_MODE = os.environ.get("BED_HOSTILE_PYTHON3", "")
if _MODE in ("flood-stdout", "flood-stderr"):
    _out = sys.stdout.buffer if _MODE == "flood-stdout" else sys.stderr.buffer
    _block = b"x" * 65535 + b"\n"
    try:
        while True:
            _out.write(_block)
    except (BrokenPipeError, OSError):
        os._exit(1)
elif _MODE == "hang":
    while True:
        time.sleep(3600)
