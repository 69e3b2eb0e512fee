"""llm-d's endpoint picker (EPP), read through its authorised ``/metrics``: passive only.

The picker drops a Pod from its datastore at once when the Pod is not Ready, terminating,
or no longer selected by its pool, and its per-endpoint series are computed from that
live datastore when scraped:

- ``inference_pool_per_pod_queue_size{model_server_pod="<pod>[-rank-<n>]", name=<pool>}``
- ``llm_d_epp_per_endpoint_queue_size{model_server_endpoint="<pod>[-rank-<n>]", ...}``

(one endpoint per target port: ``<pod>-rank-<n>``).  The endpoints named by either series
are the ones the picker may pick; a target is withdrawn from it when no endpoint of a
target Pod is named.  A failed scrape, an unauthorised one (401/403), one that names no
endpoint at all, or a series without its endpoint label reads UNKNOWN: never withdrawn.
The picker reports no clock or generation of its own, so freshness is the time of the
answer.

The metrics endpoint wants a bearer token (``--metrics-endpoint-auth``, on by default:
controller-runtime's ``filters.WithAuthenticationAndAuthorization``, which the picker
installs on its metrics server, asks the API server for a TokenReview, then a
SubjectAccessReview of ``get`` on the non-resource URL ``/metrics``).  The token is sent to
whatever Pod a tenant labels as the deployment's router, so it must be one that can do
nothing else: a dedicated ServiceAccount's (``deploy/``: ``retire-llmd-metrics``, bound only
to ``get`` on ``/metrics``), read at every scrape (rotation is followed) from the file
``RETIRE_LLMD_TOKEN_FILE`` names.  There is no default: without the variable nothing is
sent and the picker reads UNKNOWN, saying so.  The worker's own ServiceAccount token (it
may exec into, label and delete Pods) is never sent: a configured token that is the file
Kubernetes mounts for the worker (``OWN_TOKEN_FILE``), the same token, or a token of the
same subject (its JWT ``sub`` claim) is refused, and the picker reads UNKNOWN.  The token
goes only to the router Pod's own address: the base URL must name an IP address, redirects
are not followed, and a client that would use proxy settings is refused.

The picker has no call to remove or add an endpoint: withdrawal waits for it to drop the
member (it does once the label is gone), and the restore for it to pick the member up.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping

import httpx
from temporalio.exceptions import CancelledError

from activities.routers.common import READ_ERRORS, failed, get_body
from activities.routers.view import RouterView, worker_host

TOKEN_FILE_ENV = "RETIRE_LLMD_TOKEN_FILE"
#: Where Kubernetes mounts the worker's own ServiceAccount token: never sent.
OWN_TOKEN_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/token"
#: Per-endpoint series, and the label naming the endpoint in each.
SERIES = {
    "inference_pool_per_pod_queue_size": "model_server_pod",
    "llm_d_epp_per_endpoint_queue_size": "model_server_endpoint",
}
_ACCEPT = "text/plain;version=0.0.4"


def token_file(environ: Mapping[str, str] | None = None) -> str | None:
    """Where the scrape's bearer token is read from (``RETIRE_LLMD_TOKEN_FILE``; None when
    unset: there is no default)."""
    env = os.environ if environ is None else environ
    return env.get(TOKEN_FILE_ENV) or None


class NoToken(ValueError):
    """No token may be sent: none configured, unreadable, or the worker's own."""


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read(64 << 10).strip()
    except (OSError, UnicodeDecodeError) as e:
        why = f"the metrics token cannot be read from {path}: {type(e).__name__}"
        raise NoToken(why) from None
    if not token or any(c.isspace() or not c.isprintable() for c in token):
        raise NoToken(f"the metrics token in {path} is empty or not one line")
    return token


def subject(token: str) -> str | None:
    """The ``sub`` claim of a JWT (not verified: used only to refuse), or None."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    try:
        payload = base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4))
        sub = json.loads(payload).get("sub")
    except (binascii.Error, ValueError, AttributeError, RecursionError):
        return None
    return sub if isinstance(sub, str) and sub else None


def dedicated_token(path: str | None, own_path: str) -> str:
    """The token in ``path``, when it may be sent: ``NoToken`` saying why not when no file
    is configured, it cannot be read, or it is the worker's own (``own_path``: the same
    file, the same token, or a token of the same subject)."""
    if not path:
        raise NoToken(
            f"no metrics token configured ({TOKEN_FILE_ENV} unset): the worker's own "
            "ServiceAccount token is never sent"
        )
    token = _read_token(path)
    try:
        same_file = os.path.samefile(path, own_path)
        own: str | None = _read_token(own_path)
    except (OSError, NoToken):
        same_file, own = False, None  # not in a Pod, or no token mounted for it
    own_sub = subject(own) if own is not None else None
    if own is not None and (
        same_file or token == own or (own_sub is not None and subject(token) == own_sub)
    ):
        raise NoToken(
            f"the metrics token in {path[:60]} is the worker's own ({own_sub or own_path}): "
            f"not sent ({TOKEN_FILE_ENV} must name a /metrics-only token)"
        )
    return token


def endpoints(text: str) -> frozenset[str]:
    """The endpoints the per-endpoint series name (raises on a wrong exposition)."""
    from prometheus_client.parser import text_string_to_metric_families

    named: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            label = SERIES.get(sample.name)
            if label is None:
                continue
            value = sample.labels.get(label, "")
            if not value:
                raise ValueError(f"a {sample.name} series has no {label} label")
            named.add(value)
    return frozenset(named)


class LlmdPicker:
    """llm-d's endpoint picker: its per-endpoint ``/metrics`` series (passive only)."""

    active = False
    port_names: tuple[str, ...] = ("metrics",)

    def __init__(
        self, kind: str = "llm-d", token_path: str | None = None, own_path: str | None = None
    ) -> None:
        self.kind = kind
        self.token_path = token_path  # None: ``token_file()`` at each scrape
        self.own_path = own_path  # None: ``OWN_TOKEN_FILE``

    def _token(self) -> str:
        path = self.token_path or token_file()
        return dedicated_token(path, self.own_path or OWN_TOKEN_FILE)

    def view(self, http: httpx.Client, base: str) -> RouterView:
        if worker_host(base) is None:
            return failed(f"the picker's address {base[:80]!r} is not an IP address")
        if http.trust_env:
            return failed("the HTTP client would use proxy settings: the token is not sent")
        try:
            token = self._token()
        except NoToken as e:
            return failed(str(e))
        try:
            headers = {"Authorization": f"Bearer {token}", "Accept": _ACCEPT}
            body, at = get_body(http, f"{base}/metrics", headers=headers)
            named = endpoints(body.decode("utf-8"))
        except httpx.HTTPStatusError as e:
            code = e.response.status_code
            if code in (401, 403):
                return failed(f"unauthorised scrape of the picker's metrics: HTTP {code}")
            return failed(e)
        except READ_ERRORS as e:
            return failed(e)
        except CancelledError:
            raise  # the activity was cancelled: it stops, it does not read UNKNOWN
        except Exception as e:  # the exposition parser's own errors: never a crash
            return failed(e)
        if not named:
            return failed("empty scrape: no per-endpoint series (never read as withdrawn)")
        return RouterView(workers={}, endpoints=named, fetched_at=at)

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        """No removal call exists: withdrawal waits for the picker to drop the member."""

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        return "not asked: llm-d's picker has no add call; waiting for it to pick the member up"
