"""Entry point of ``python -m testbed.emulator`` (the bed launches the hub this way)."""

from testbed.emulator.cli import main

raise SystemExit(main())
