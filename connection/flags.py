"""The Temporal connection flags, registered identically on every command of the project.

The worker, the watcher and ``retire`` accept the same flags with the same meaning, so an
operator learns them once and a profile written for the ``temporal`` CLI works for all
three. Every flag defaults to "not given" (None): only a flag the user typed overrides the
configuration file and the environment (see ``connection.settings``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_TASK_QUEUE = "retirement"


@dataclass(frozen=True, kw_only=True)
class ConnectionFlags:
    """What the user typed on the command line; None means "not given"."""

    address: str | None = None
    namespace: str | None = None
    profile: str | None = None
    config_file: str | None = None
    tls: bool | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    tls_server_name: str | None = None
    api_key: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ConnectionFlags:
        """The connection flags of a namespace parsed by a parser given ``add_connection_flags``."""
        return cls(**{name: getattr(args, _DEST_PREFIX + name) for name in _FIELDS})


_DEST_PREFIX = "temporal_"
_FIELDS = tuple(ConnectionFlags.__dataclass_fields__)


def add_connection_flags(parser: argparse.ArgumentParser, *, repeated: bool = False) -> None:
    """Register the shared connection flags in their own help group.  ``repeated``: on a
    subcommand's parser as well as the main one (``retire status x --address y``, as
    kubectl takes its flags anywhere): no defaults there, so a flag given before the
    subcommand is not reset by the subcommand's parse."""
    g = _Group(
        parser,
        "Temporal connection",
        "Resolved from, highest first: these flags, the TEMPORAL_* environment, the profile "
        "of the TOML config file (the temporal CLI's format), the legacy RETIRE_TEMPORAL_* "
        "environment, then 127.0.0.1:7233 / default.",
        repeated=repeated,
    )

    d = _DEST_PREFIX
    g.add_argument(
        "--address",
        dest=d + "address",
        metavar="HOST:PORT",
        help="server address (TEMPORAL_ADDRESS)",
    )
    g.add_argument(
        "--temporal-namespace",
        dest=d + "namespace",
        metavar="NS",
        help="Temporal namespace (TEMPORAL_NAMESPACE)",
    )
    g.add_argument(
        "--profile",
        dest=d + "profile",
        metavar="NAME",
        help="profile of the config file (TEMPORAL_PROFILE; default: default)",
    )
    g.add_argument(
        "--config-file",
        dest=d + "config_file",
        metavar="PATH",
        help="TOML config file (TEMPORAL_CONFIG_FILE; default: ~/.config/temporalio/temporal.toml)",
    )
    g.add_argument(
        "--tls",
        dest=d + "tls",
        action=argparse.BooleanOptionalAction,
        help="use TLS, or not (TEMPORAL_TLS; on by default with an API key)",
    )
    g.add_argument(
        "--tls-cert",
        dest=d + "tls_cert",
        metavar="PATH",
        help="client certificate for mTLS, PEM (TEMPORAL_TLS_CLIENT_CERT_PATH)",
    )
    g.add_argument(
        "--tls-key",
        dest=d + "tls_key",
        metavar="PATH",
        help="client private key for mTLS, PEM (TEMPORAL_TLS_CLIENT_KEY_PATH)",
    )
    g.add_argument(
        "--tls-ca",
        dest=d + "tls_ca",
        metavar="PATH",
        help="CA certificates that verify the server, PEM (TEMPORAL_TLS_SERVER_CA_CERT_PATH)",
    )
    g.add_argument(
        "--tls-server-name",
        dest=d + "tls_server_name",
        metavar="NAME",
        help="server name for SNI and verification (TEMPORAL_TLS_SERVER_NAME)",
    )
    g.add_argument(
        "--api-key",
        dest=d + "api_key",
        metavar="KEY",
        help="API key (TEMPORAL_API_KEY; prefer the variable, flags show in ps)",
    )


class _Group:
    """An argument group whose arguments have no default when ``repeated``."""

    def __init__(self, parser: argparse.ArgumentParser, title: str, text: str, *, repeated: bool):
        self._group = parser.add_argument_group(title, text)
        self._repeated = repeated

    def add_argument(self, *names: str, **kwargs: Any) -> None:
        if self._repeated:
            kwargs["default"] = argparse.SUPPRESS
        self._group.add_argument(*names, **kwargs)


def add_task_queue_flag(
    parser: argparse.ArgumentParser,
    *,
    environ: Mapping[str, str] = os.environ,
    repeated: bool = False,
) -> None:
    """``--task-queue``: where the retirement workers listen (RETIRE_TASK_QUEUE);
    ``repeated`` as for ``add_connection_flags``."""
    parser.add_argument(
        "--task-queue",
        default=argparse.SUPPRESS
        if repeated
        else environ.get("RETIRE_TASK_QUEUE", DEFAULT_TASK_QUEUE),
        help="task queue of the retirement worker (RETIRE_TASK_QUEUE; "
        f"default: {DEFAULT_TASK_QUEUE})",
    )
