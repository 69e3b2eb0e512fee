"""Alerts that lead somewhere, and counter names Prometheus's conventions expect:

- every alert in ``deploy/monitoring/alerts.yaml`` has a ``runbook_url`` naming a section
  of ``docs/runbook.md`` that exists (its GitHub anchor): the alert's own, titled by its
  name, not empty;
- every counter the product defines ends in ``_total`` as served: the watcher's
  (prometheus_client, which serves ``_total``; written with it in the code too) and the
  worker's, emitted through the Temporal SDK's meters (its exporter adds no suffix, so the
  name carries it), except the two drain counters of ``activities/metrics.py``, which
  another change renames (this test names them so that none is added).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from testbed.paths import REPO_ROOT
from watcher.metrics import WatcherMetrics

RULES = REPO_ROOT / "deploy" / "monitoring" / "alerts.yaml"
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def sections(doc: Path) -> dict[str, str]:
    """Each heading's anchor and the text under it (to the next heading of any level)."""
    out: dict[str, str] = {}
    current, lines = None, []
    for line in [*doc.read_text().splitlines(), "# end"]:
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            if current is not None:
                out[current] = "\n".join(lines)
            current, lines = anchor(m.group(1)), []
        else:
            lines.append(line)
    return out


def test_the_anchor_reader_reads_github_anchors() -> None:
    assert anchor('What "held" means') == "what-held-means"
    assert anchor("RetireWatcherNoLeader") == "retirewatchernoleader"
    assert anchor("Failure modes and what the product does") == (
        "failure-modes-and-what-the-product-does"
    )


def test_every_alert_links_to_its_runbook_section() -> None:
    doc = yaml.safe_load(RULES.read_text())
    found = sections(RUNBOOK)
    rules = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    assert rules
    for r in rules:
        url = r["annotations"].get("runbook_url", "")
        m = re.fullmatch(r"docs/runbook\.md#([\w-]+)", url)
        assert m, f"{r['alert']}: runbook_url {url!r} is not docs/runbook.md#<section>"
        assert m.group(1) in found, f"{r['alert']}: no section #{m.group(1)} in docs/runbook.md"
        assert m.group(1) == anchor(r["alert"]), f"{r['alert']}: links to another's section"
        assert found[m.group(1)].strip(), f"{r['alert']}: section #{m.group(1)} is empty"
    # Every relative link of the runbook's alert sections lands on a section too.
    for target in re.findall(r"\]\(#([\w-]+)\)", RUNBOOK.read_text()):
        assert target in found, f"docs/runbook.md links to a missing #{target}"


def test_every_counter_is_served_with_total() -> None:
    from activities.metrics import EXPORTED as ACTIVITY_METRICS
    from workflows.metrics import EXPORTED as WORKFLOW_METRICS

    registry = WatcherMetrics(registry=CollectorRegistry()).registry
    for family in registry.collect():
        if family.type == "counter":
            served = {s.name for s in family.samples if not s.name.endswith("_created")}
            assert served <= {family.name + "_total"}, served  # a labelled one may have none
    sdk = {**ACTIVITY_METRICS, **WORKFLOW_METRICS}
    counters = {name for name, kind in sdk.items() if kind == "counter"}
    assert {n for n in counters if not n.endswith("_total")} == set()
    assert {n for n in WORKFLOW_METRICS if WORKFLOW_METRICS[n] == "counter"} == {
        "retire_retirements_total",
        "retire_members_abandoned_total",
    }


def test_the_watchers_counters_carry_total_in_the_code_too() -> None:
    """Written with ``_total`` where they are defined (prometheus_client strips and re-adds
    it), so a grep for the served name finds the definition."""
    source = (REPO_ROOT / "watcher" / "metrics.py").read_text()
    for name in re.findall(r'Counter\(\s*"([a-z_]+)"', source):
        assert name.endswith("_total"), name
