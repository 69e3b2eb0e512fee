"""``deploy/monitoring/alerts.yaml`` checked and unit-tested by Prometheus's own promtool:

- ``promtool check rules``: the file loads as Prometheus loads it (PromQL parses, templates
  compile, durations are valid);
- ``promtool test rules tests/offline/alerts/alerts_test.yaml``: each alert fires on the
  series that should fire it, once its ``for`` has passed and not before, with the labels
  and annotations written out, and does not on series that should not;
- every alert of the rule file has a test case in which it fires and one in which it must
  not.

promtool is built once from the Go module proxy by ``testbed/build.sh promtool`` into the
bed's binary cache; this module builds it when it is missing (it is never skipped).
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from testbed.paths import REPO_ROOT, cache_root

BUILD_SCRIPT = REPO_ROOT / "testbed" / "build.sh"
RULES = REPO_ROOT / "deploy" / "monitoring" / "alerts.yaml"
UNIT_TESTS = Path(__file__).parent / "alerts" / "alerts_test.yaml"


def prometheus_version() -> str:
    """The Prometheus module version ``testbed/build.sh`` builds by default."""
    m = re.search(r"^PROMETHEUS_VERSION=\$\{PROMETHEUS_VERSION:-(v[0-9.]+)\}$",
                  BUILD_SCRIPT.read_text(), re.M)  # fmt: skip
    assert m, f"no PROMETHEUS_VERSION default in {BUILD_SCRIPT}"
    return m.group(1)


@functools.cache
def promtool() -> Path:
    """The promtool binary, built by ``testbed/build.sh promtool`` if it is not cached."""
    path = cache_root() / f"promtool-{prometheus_version()}" / "bin" / "promtool"
    if os.access(path, os.X_OK):
        return path
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "promtool"], capture_output=True, text=True, timeout=3600
    )
    assert done.returncode == 0, f"{BUILD_SCRIPT} promtool failed:\n{done.stdout[-4000:]}"
    built = Path(done.stdout.strip().splitlines()[-1])
    assert built == path and os.access(built, os.X_OK), (built, path)
    return built


def run(*args: str, cwd: Path = REPO_ROOT) -> str:
    done = subprocess.run(
        [str(promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"promtool {' '.join(args)}:\n{out}"
    return out


def alert_names() -> list[str]:
    doc = yaml.safe_load(RULES.read_text())
    return [r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rule_file() -> None:
    out = run("check", "rules", str(RULES.relative_to(REPO_ROOT)))
    assert f"SUCCESS: {len(alert_names())} rules found" in out, out


def test_promtool_runs_the_alerts_unit_tests() -> None:
    out = run("test", "rules", UNIT_TESTS.name, cwd=UNIT_TESTS.parent)
    assert "SUCCESS" in out, out


def test_every_alert_has_a_case_that_fires_it_and_one_that_must_not() -> None:
    doc: dict[str, Any] = yaml.safe_load(UNIT_TESTS.read_text())
    (rule_file,) = doc["rule_files"]
    assert (UNIT_TESTS.parent / rule_file).resolve() == RULES.resolve()
    fires: set[str] = set()
    silent: set[str] = set()
    for group in doc["tests"]:
        for case in group.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case["alertname"])
            for alert in case.get("exp_alerts") or []:
                # Compared whole by promtool: every annotation is written out.
                assert set(alert["exp_annotations"]) == {"summary", "description", "runbook_url"}
    names = set(alert_names())
    assert names - fires == set(), "alerts never shown to fire"
    assert names - silent == set(), "alerts never shown to stay silent"
    assert (fires | silent) - names == set(), "cases of alerts the rule file does not have"
