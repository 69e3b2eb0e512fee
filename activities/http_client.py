"""The HTTP client of the router calls and identity probes: one TLS context per process.

``httpx.Client()`` builds a new ``ssl.SSLContext`` each time and loads the CA bundle into
it (``httpx._config.create_ssl_context``: ``ssl.create_default_context(cafile=
certifi.where())``), whether or not the client ever speaks TLS.  Every withdrawal, drain
and delete opens a client, so with hundreds of retirements at once that load was an
eighth of the worker's CPU (py-spy, the worker benchmark at N = 200).  The context is the
same each time (the certifi bundle, ``trust_env=False``: no ``SSL_CERT_FILE``), and an
``SSLContext`` may be shared by connections on many threads, so it is built once.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's TLS context for router and engine endpoints (built on first use)."""
    return httpx.create_ssl_context(trust_env=False)


def http_client(*, timeout: float, transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """A client that ignores the environment's proxies and certificates and verifies TLS
    with the shared context; ``transport`` replaces the network (offline tests)."""
    return httpx.Client(trust_env=False, timeout=timeout, verify=tls_context(), transport=transport)
