"""A JSON-over-HTTP call that never uses a proxy (the bed's control APIs)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def call(
    url: str, method: str = "GET", body: dict[str, Any] | None = None, *, timeout: float = 10.0
) -> Any:
    """``method url`` with a JSON body; returns the decoded JSON answer (None if empty)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")
