"""Resolve one Temporal connection from flags, ``temporalio.envconfig`` and legacy variables.

Order, highest first:

1. the flags (``connection.flags``);
2. the standard ``TEMPORAL_*`` environment (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``,
   ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS``, ``TEMPORAL_TLS_*``, ``TEMPORAL_GRPC_META_*``);
3. the selected profile (``--profile``, ``TEMPORAL_PROFILE``, else ``default``) of the TOML
   config file (``--config-file``, ``TEMPORAL_CONFIG_FILE``, else the SDK's default path);
4. the project's older variables, kept as a fallback so existing deployments keep working:
   ``RETIRE_TEMPORAL_ADDRESS``, ``RETIRE_TEMPORAL_NAMESPACE``, ``RETIRE_TEMPORAL_API_KEY``
   and ``RETIRE_TEMPORAL_TLS`` (``1``/``true``);
5. ``127.0.0.1:7233`` and namespace ``default``.

Levels 2 and 3 are the SDK's own loader, so the project reads the same files and variables
as the ``temporal`` CLI. The file is read strictly: an unknown key is a typo, reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS, DataSource
from temporalio.service import TLSConfig

from connection.errors import ConnectionConfigError, one_line
from connection.flags import ConnectionFlags
from connection.tls import connect_tls
from retirement.text import is_decimal

DEFAULT_ADDRESS = "127.0.0.1:7233"
DEFAULT_NAMESPACE = "default"
_BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


@dataclass(frozen=True, kw_only=True, repr=False)
class ConnectionSettings:
    """Everything ``Client.connect`` needs, resolved and validated; files already read.

    Its ``repr`` (and ``str``) names the address, the namespace, how the connection is
    secured and where it came from, never a secret: not the API key, the client key, the
    certificates or the gRPC metadata (``TLSConfig``'s own repr prints the key)."""

    address: str
    namespace: str
    api_key: str | None = None
    tls: bool | TLSConfig = False
    rpc_metadata: Mapping[str, str] = field(default_factory=dict)
    origin: str = "defaults"
    """Where the profile came from, for log lines (never the secrets)."""

    def security(self) -> str:
        """``mTLS``, ``TLS`` or ``plaintext``."""
        if isinstance(self.tls, TLSConfig) and self.tls.client_cert:
            return "mTLS"
        return "TLS" if self.tls else "plaintext"

    def describe(self) -> str:
        """One log line: where, which namespace, how secured; the key is never printed."""
        key = ", API key" if self.api_key else ""
        return f"{self.address} namespace {self.namespace} ({self.security()}{key}; {self.origin})"

    def __repr__(self) -> str:
        key = "<set>" if self.api_key else None
        return (
            f"ConnectionSettings(address={self.address!r}, namespace={self.namespace!r}, "
            f"security={self.security()!r}, api_key={key!r}, origin={self.origin!r})"
        )


def _bool_env(environ: Mapping[str, str], name: str) -> bool | None:
    value = environ.get(name, "").strip().lower()
    if not value:
        return None
    if value not in _BOOLEANS:
        raise ConnectionConfigError(f"{name}={environ[name]!r}: expected true, false, 1 or 0")
    return _BOOLEANS[value]


def _valid_address(address: str) -> str:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not is_decimal(port) or not 0 < int(port) < 65536:
        raise ConnectionConfigError(f"address {address!r} must be HOST:PORT (port 1-65535)")
    return address


def _load_profile(flags: ConnectionFlags, env: dict[str, str]) -> tuple[ClientConfigProfile, str]:
    """The SDK's profile (file + TEMPORAL_* environment) and a description of its origin."""
    file = flags.config_file or env.get("TEMPORAL_CONFIG_FILE")
    source: bytes | None = None
    if file:
        # Read it here: the SDK silently treats a missing file as an empty one.
        try:
            source = Path(file).read_bytes()
        except OSError as e:
            raise ConnectionConfigError(f"cannot read config file {file}: {e.strerror}") from e
    where = f"config file {file}" if file else "default config file (TEMPORAL_CONFIG_FILE unset)"
    try:
        profile = ClientConfigProfile.load(
            flags.profile, config_source=source, config_file_strict=True, override_env_vars=env
        )
    except RuntimeError as e:  # the SDK's ConfigError: bad TOML, wrong type, unknown profile
        raise ConnectionConfigError(f"{where}: {one_line(str(e))}") from e
    name = flags.profile or env.get("TEMPORAL_PROFILE") or "default"
    return profile, f"profile {name}" + (f" of {file}" if file else "")


def _path_or(flag: str | None, current: DataSource | None) -> DataSource | None:
    return Path(flag) if flag else current


def _overlay_tls(
    base: ClientConfigTLS | None, flags: ConnectionFlags, *, legacy_tls: bool
) -> ClientConfigTLS | None:
    """The profile's TLS with the flags on top (and the legacy switch under it)."""
    detail = any((flags.tls_cert, flags.tls_key, flags.tls_ca, flags.tls_server_name))
    if flags.tls is False and detail:
        raise ConnectionConfigError(
            "--no-tls contradicts --tls-cert/--tls-key/--tls-ca/--tls-server-name"
        )
    if base is None and legacy_tls:
        base = ClientConfigTLS(disabled=False)
    if flags.tls is None and not detail:
        return base
    tls = base or ClientConfigTLS()
    return ClientConfigTLS(
        # --tls/--no-tls decide; asking for a TLS file or server name asks for TLS.
        disabled=not flags.tls if flags.tls is not None else False,
        server_name=flags.tls_server_name or tls.server_name,
        server_root_ca_cert=_path_or(flags.tls_ca, tls.server_root_ca_cert),
        client_cert=_path_or(flags.tls_cert, tls.client_cert),
        client_private_key=_path_or(flags.tls_key, tls.client_private_key),
    )


def resolve(flags: ConnectionFlags, *, environ: Mapping[str, str]) -> ConnectionSettings:
    """The connection described by ``flags`` and ``environ``; ConnectionConfigError if bad."""
    # An empty variable means unset (the SDK would read TEMPORAL_TLS="" as "TLS on").
    env = {k: v for k, v in environ.items() if v != ""}
    _bool_env(env, "TEMPORAL_TLS")  # the SDK ignores values it does not know; refuse them
    legacy_tls = _bool_env(env, "RETIRE_TEMPORAL_TLS") is True  # it could only turn TLS on
    profile, origin = _load_profile(flags, env)
    api_key = flags.api_key or profile.api_key or env.get("RETIRE_TEMPORAL_API_KEY")
    tls = _overlay_tls(profile.tls, flags, legacy_tls=legacy_tls)
    address = (
        flags.address or profile.address or env.get("RETIRE_TEMPORAL_ADDRESS") or DEFAULT_ADDRESS
    )
    namespace = (
        flags.namespace
        or profile.namespace
        or env.get("RETIRE_TEMPORAL_NAMESPACE")
        or DEFAULT_NAMESPACE
    )
    return ConnectionSettings(
        address=_valid_address(address),
        namespace=namespace,
        api_key=api_key,
        tls=connect_tls(tls, api_key=api_key),
        rpc_metadata=dict(profile.grpc_meta),
        origin=origin,
    )
