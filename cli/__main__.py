"""``python -m cli``."""

from cli.main import entry

entry()
