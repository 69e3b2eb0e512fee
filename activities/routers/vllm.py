"""vllm-router (0.1.17 measured): ``GET /list_workers``, ``POST /remove_worker?url=``,
``POST /add_worker?url=``.

- ``GET /list_workers`` → ``{"urls": [...]}``: every registered worker, healthy or not
  (all read as selected: an unhealthy worker comes back on its next health check).
- ``POST /remove_worker?url=`` → 200, also for a URL it does not have: only a later
  ``GET /list_workers`` tells.
- ``POST /add_worker?url=`` → 200 once the worker answers its health check, which the
  router waits for (``--worker-startup-timeout-secs``, 600 s by default), 400 for a URL it
  already has or a worker that stayed unhealthy.  The URL is kept verbatim (a trailing
  ``/`` is another worker), so the restore adds the exact URL the router listed before.

The router forwards a GET of a path it does not know to one of its workers, so a wrong
path gets an engine's answer: the shape is checked strictly (``urls`` a list of strings).
"""

from __future__ import annotations

import httpx

from activities.routers.common import (
    READ_ERRORS,
    array,
    failed,
    get_json,
    obj,
    opaque_worker,
    sent,
    string,
)
from activities.routers.view import RouterView


class VllmRouter:
    """vllm-router's admin API (always on, unauthenticated)."""

    kind = "vllm-router"
    active = True
    port_names: tuple[str, ...] = ("http",)

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            body, at = get_json(http, f"{base}/list_workers")
            urls = array(obj(body, "the answer")["urls"], "urls")
            workers = {string(u, "a worker url"): "" for u in urls}
        except READ_ERRORS as e:
            return failed(e)
        if why := opaque_worker(workers):
            return failed(why)
        return RouterView(workers=workers, fetched_at=at)

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        sent(http, "POST", f"{base}/remove_worker", params={"url": url})

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        # The router answers only once the worker is healthy (or its startup timeout
        # passed): a timeout here is normal, and the router keeps trying.
        return sent(http, "POST", f"{base}/add_worker", params={"url": url})
