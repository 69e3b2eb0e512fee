"""Turn the merged TLS configuration into what ``Client.connect`` takes, reading files once.

Certificates are read here, at start-up, so that a missing file, a directory, a file that
is not PEM, or a client certificate without its key is a configuration error with the
file's name in it, instead of a connect failure that a retrying watcher would retry
forever.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.envconfig import ClientConfigTLS, DataSource
from temporalio.service import TLSConfig

from connection.errors import ConnectionConfigError

_PEM = b"-----BEGIN "


def _read_pem(source: DataSource | None, *, what: str) -> bytes | None:
    """The PEM bytes of ``source`` (a path, or inline data from the environment or TOML)."""
    if source is None:
        return None
    if isinstance(source, Path):
        try:
            data = source.read_bytes()
        except OSError as e:
            raise ConnectionConfigError(f"cannot read the {what} {source}: {e.strerror}") from e
        origin = str(source)
    else:
        data = source.encode() if isinstance(source, str) else source
        origin = "inline data"
    if _PEM not in data:
        raise ConnectionConfigError(f"the {what} ({origin}) is not PEM: no '-----BEGIN' line")
    return data


def connect_tls(tls: ClientConfigTLS | None, *, api_key: str | None) -> bool | TLSConfig:
    """The ``tls`` argument of ``Client.connect`` for this configuration.

    No TLS configuration means TLS exactly when there is an API key (the SDK's rule, and
    the worker's before this package existed); ``disabled`` wins over everything.
    """
    if tls is None:
        return api_key is not None
    if tls.disabled is True:
        return False
    cert = _read_pem(tls.client_cert, what="TLS client certificate")
    key = _read_pem(tls.client_private_key, what="TLS client key")
    ca = _read_pem(tls.server_root_ca_cert, what="TLS server CA certificate")
    if (cert is None) != (key is None):
        given, missing = ("certificate", "key") if key is None else ("key", "certificate")
        raise ConnectionConfigError(
            f"a TLS client {given} without its {missing}: mTLS needs both "
            f"(--tls-cert and --tls-key, or TEMPORAL_TLS_CLIENT_CERT_* and _KEY_*)"
        )
    if cert is None and ca is None and tls.server_name is None:
        return True
    return TLSConfig(
        server_root_ca_cert=ca, domain=tls.server_name, client_cert=cert, client_private_key=key
    )
