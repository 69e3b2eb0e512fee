"""The embedded default Temporal: a dev server started from ``temporal-dev.yaml``."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from temporalio.common import SearchAttributeKey

from testbed.paths import REPO_ROOT, venv_bin
from testbed.procs import Child, port_open, wait_until

CONFIG_PATH = REPO_ROOT / "temporal-dev.yaml"


@dataclass(frozen=True)
class TemporalDevConfig:
    """The settings of ``temporal-dev.yaml``."""

    address: str
    http_port: int
    ui_port: int
    metrics_port: int
    namespace: str
    task_queue: str
    db_filename: Path
    search_attributes: dict[str, str]
    dynamic_config: dict[str, Any]

    @property
    def host(self) -> str:
        """The frontend's host."""
        return self.address.rsplit(":", 1)[0]

    @property
    def port(self) -> int:
        """The frontend's gRPC port."""
        return int(self.address.rsplit(":", 1)[1])

    @property
    def ui_url(self) -> str:
        """The Web UI's address."""
        return f"http://{self.host}:{self.ui_port}"

    def with_ports(
        self, *, port: int, http_port: int, ui_port: int, metrics_port: int, db_filename: Path
    ) -> TemporalDevConfig:
        """The same configuration on other ports and another database (tests)."""
        return TemporalDevConfig(
            address=f"{self.host}:{port}",
            http_port=http_port,
            ui_port=ui_port,
            metrics_port=metrics_port,
            namespace=self.namespace,
            task_queue=self.task_queue,
            db_filename=db_filename,
            search_attributes=dict(self.search_attributes),
            dynamic_config=dict(self.dynamic_config),
        )


def _port(name: str, value: Any) -> int:
    """A TCP port, 1..65535: a YAML integer or a string of decimal digits."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer port, not {value!r}")
    if not 0 < value < 65536:
        raise ValueError(f"{name} must be a port in 1..65535, not {value}")
    return value


def _text(name: str, value: Any) -> str:
    """A non-empty string setting."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{name} must be a non-empty string, not {value!r}")
    return value


def _mapping(name: str, value: Any) -> dict[Any, Any]:
    """A mapping setting."""
    if not isinstance(value, dict):
        raise ValueError(f"{name} must be a mapping, not {type(value).__name__}")
    return value


def _address(value: Any) -> str:
    """``HOST:PORT`` with a non-empty host and a port in 1..65535."""
    address = _text("address", value)
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"address must be HOST:PORT, not {address!r}")
    _port("address port", port)
    return address


def load_config(path: Path = CONFIG_PATH) -> TemporalDevConfig:
    """Read and validate ``temporal-dev.yaml``; a bad file raises ``ValueError``."""
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        reason = " ".join(str(e).split())
        raise ValueError(f"{path}: not valid YAML: {reason}") from e
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    try:
        db = Path(_text("db_filename", raw["db_filename"]))
        return TemporalDevConfig(
            address=_address(raw["address"]),
            http_port=_port("http_port", raw["http_port"]),
            ui_port=_port("ui_port", raw["ui_port"]),
            metrics_port=_port("metrics_port", raw["metrics_port"]),
            namespace=_text("namespace", raw["namespace"]),
            task_queue=_text("task_queue", raw["task_queue"]),
            db_filename=db if db.is_absolute() else REPO_ROOT / db,
            search_attributes={
                str(k): str(v)
                for k, v in _mapping("search_attributes", raw["search_attributes"]).items()
            },
            dynamic_config=dict(_mapping("dynamic_config", raw.get("dynamic_config") or {})),
        )
    except KeyError as e:
        raise ValueError(f"{path}: missing setting: {e}") from e
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path}: invalid setting: {e}") from e


def search_attribute_keys(cfg: TemporalDevConfig) -> list[SearchAttributeKey[Any]]:
    """The custom search attributes of the configuration, as typed keys."""
    keys: list[SearchAttributeKey[Any]] = []
    for name, kind in cfg.search_attributes.items():
        if kind == "Int":
            keys.append(SearchAttributeKey.for_int(name))
        elif kind == "Keyword":
            keys.append(SearchAttributeKey.for_keyword(name))
        else:
            raise ValueError(f"search attribute {name}: unsupported kind {kind!r}")
    return keys


def dev_server_args(cfg: TemporalDevConfig) -> list[str]:
    """The ``temporal server start-dev`` arguments (after the executable) for ``cfg``."""
    args = [
        "server",
        "start-dev",
        "--ip",
        cfg.host,
        "--port",
        str(cfg.port),
        "--http-port",
        str(cfg.http_port),
        "--ui-port",
        str(cfg.ui_port),
        "--metrics-port",
        str(cfg.metrics_port),
        "--namespace",
        cfg.namespace,
        "--db-filename",
        str(cfg.db_filename),
        # The UI's newsfeed would reach outside the machine.
        "--ui-disable-news-fetch",
        "--log-level",
        "warn",
    ]
    for name, kind in cfg.search_attributes.items():
        args += ["--search-attribute", f"{name}={kind}"]
    for key, value in cfg.dynamic_config.items():
        rendered = str(value).lower() if isinstance(value, bool) else str(value)
        args += ["--dynamic-config-value", f"{key}={rendered}"]
    return args


def ui_ok(cfg: TemporalDevConfig) -> bool:
    """Whether the Web UI serves HTTP 200."""
    with urllib.request.urlopen(cfg.ui_url, timeout=2) as resp:
        return int(resp.status) == 200


def start_dev_server(cfg: TemporalDevConfig, *, log_dir: Path) -> Child:
    """Start the dev server and wait until its frontend and UI answer."""
    cfg.db_filename.parent.mkdir(parents=True, exist_ok=True)
    child = Child(
        name="temporal",
        argv=[str(venv_bin("temporal")), *dev_server_args(cfg)],
        log_path=log_dir / "temporal.log",
    )
    try:
        wait_until(
            "temporal frontend", lambda: port_open(cfg.host, cfg.port), timeout=60, child=child
        )
        wait_until("temporal ui", lambda: ui_ok(cfg), timeout=60, child=child)
    except BaseException:
        child.stop(timeout=5)  # never leave a process that nothing refers to
        raise
    return child
