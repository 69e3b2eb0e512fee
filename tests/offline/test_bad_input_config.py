"""Bad configuration: ``temporal-dev.yaml`` (``testbed/temporal_dev.py``) and the budgets.
A bad file raises ValueError naming the file; bad budgets raise a validation error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from retirement.budgets import Budgets
from testbed.temporal_dev import (
    CONFIG_PATH,
    dev_server_args,
    load_config,
    search_attribute_keys,
)
from tests.corpus.cases import BUDGETS, DEV_CONFIGS, params


def test_the_shipped_configuration_loads() -> None:
    cfg = load_config(CONFIG_PATH)
    assert cfg.port == 7233 and search_attribute_keys(cfg)


@pytest.mark.parametrize("text", params(DEV_CONFIGS))
def test_a_bad_dev_server_configuration_is_a_value_error(text: str, tmp_path: Path) -> None:
    """Refused when loaded, or at the latest when the dev server's arguments are built."""
    path = tmp_path / "temporal-dev.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"\S"):
        load_and_use(path)


def load_and_use(path: Path) -> None:
    """Everything the bed does with the file before the dev server starts."""
    cfg = load_config(path)
    search_attribute_keys(cfg)
    dev_server_args(cfg)
    ports = (cfg.port, cfg.http_port, cfg.ui_port, cfg.metrics_port)
    assert all(0 < p < 65536 for p in ports), f"accepted ports the server cannot bind: {ports}"


def test_a_missing_configuration_file_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        load_config(tmp_path / "absent.yaml")


@pytest.mark.parametrize("raw", params(BUDGETS))
def test_bad_budgets_are_a_validation_error(raw: Any) -> None:
    with pytest.raises(ValidationError) as err:
        Budgets.model_validate(raw)
    assert err.value.errors()
