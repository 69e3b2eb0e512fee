"""What the watcher is configured with (``python -m watcher`` flags)."""

from __future__ import annotations

from dataclasses import dataclass, field

from retirement.budgets import Budgets
from retirement.models import RouterlessPolicy


@dataclass(frozen=True)
class WatcherSettings:
    """What every retirement the watcher starts is given."""

    task_queue: str = "retirement"
    budgets: Budgets = field(default_factory=Budgets)
    routerless_policy: RouterlessPolicy = RouterlessPolicy.HOLD
    quiet_window_s: float = 10.0
    #: A refused intent waits this long before it is tried again, doubling up to the max.
    refusal_backoff_s: float = 30.0
    refusal_backoff_max_s: float = 600.0
