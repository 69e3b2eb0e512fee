"""The part of Temporal's visibility query language the product sends (the watcher's
running list, ``retire list``), evaluated in memory for ``FakeTemporal``: clauses joined
by ``AND``, each ``<field> = '<value>'`` or ``<field> STARTS_WITH '<prefix>'`` over
``WorkflowType``, ``ExecutionStatus`` and the search attributes.  Anything else is refused
(``ValueError``), so a query the fake cannot judge fails the test instead of listing
everything; ``tests/workflows/test_visibility_twin.py`` runs the same queries against
the real dev server and the fake and compares what they list."""

from __future__ import annotations

import re
from collections.abc import Mapping

from temporalio.client import WorkflowExecutionStatus

_CLAUSE = re.compile(r"^\s*(\w+)\s+(=|STARTS_WITH)\s+'([^']*)'\s*$")

#: ``ExecutionStatus`` as the query language spells it.
STATUS_NAMES = {
    WorkflowExecutionStatus.RUNNING: "Running",
    WorkflowExecutionStatus.COMPLETED: "Completed",
    WorkflowExecutionStatus.FAILED: "Failed",
    WorkflowExecutionStatus.CANCELED: "Canceled",
    WorkflowExecutionStatus.TERMINATED: "Terminated",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "ContinuedAsNew",
    WorkflowExecutionStatus.TIMED_OUT: "TimedOut",
}


def parse(query: str) -> list[tuple[str, str, str]]:
    """``(field, operator, value)`` per clause; ``ValueError`` for what is not understood."""
    clauses = []
    for part in query.split(" AND "):
        m = _CLAUSE.match(part)
        if m is None:
            raise ValueError(f"the fake's visibility does not understand {part.strip()!r}")
        clauses.append((m.group(1), m.group(2), m.group(3)))
    return clauses


def matches(query: str | None, fields: Mapping[str, str]) -> bool:
    """Whether a workflow run with these ``fields`` is listed by ``query`` (None: all)."""
    if not query:
        return True
    for name, op, value in parse(query):
        have = fields.get(name)
        if have is None:
            return False
        if op == "=" and have != value:
            return False
        if op == "STARTS_WITH" and not have.startswith(value):
            return False
    return True
