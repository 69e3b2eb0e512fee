"""The SGLang model gateway (``sglang-router`` 0.3.x) and its successor smg: ``GET
/workers``, ``DELETE /workers/{id}``, ``POST /workers``.

Wire formats, as measured on the released binaries:

- ``GET /workers`` → ``{"workers": [{"id", "url", ...}], "total", "stats"}``.  smg's items
  also carry ``status`` (``pending | ready | not_ready | failed | draining``) and
  ``labels`` (``smg.ai/pod-uid``); 0.3.x items have no ``status``.
- ``DELETE /workers/{id}`` (the id; a URL there is 400) → 202, removal queued.
- ``POST /workers`` ``{"url"}`` → 202, the addition queued (a worker that cannot be
  reached is accepted and never appears); smg answers 409 for a URL it already has,
  0.3.x 202 again.  Both calls are asynchronous: only a later ``GET /workers`` tells.

``draining`` (smg): a worker whose Pod lost the label, turned unready or is being deleted
is marked ``draining`` within about a second and dropped about 5 s later.  smg's source
(lightseekorg/smg, read at its 1.9.0 tree: ``WorkerStatus::is_routable`` is ``Ready``
only; every policy and the worker selection filter on ``is_healthy()``, which is ``status
== Ready``, and the ``x-smg-target-worker`` pin checks it too) never sends a new request to
a draining worker, and the health-state machine treats ``draining`` as terminal (the
removal workflow owns it; a re-add waits until that job is done): it is read as
*leaving*, which withdrawal accepts.  ``pending``, ``not_ready`` and ``failed`` are out of
selection now but may turn ``ready`` again (a health check, a re-registration): they still
count as held.  A status outside
those five reads UNKNOWN.
"""

from __future__ import annotations

from urllib.parse import quote

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

#: How long the restore must see smg select a re-added worker before it counts: smg
#: removes a de-labelled worker by a drain job (``draining``, then removal after
#: ``drain_settle_secs``, 5 s by default) that still fires if the worker was re-added in
#: between (on the bed: restored, then gone from smg a moment later, until its 60 s
#: reconcile).  Longer than the settle, with a margin for the job's start.
SMG_CONFIRM_S = 8.0

#: smg's worker states, and how each is read (0.3.x reports none: every worker selected).
_SELECTED, _IDLE, _LEAVING = 2, 1, 0
STATUSES = {
    "ready": _SELECTED,
    "pending": _IDLE,
    "not_ready": _IDLE,
    "failed": _IDLE,
    "draining": _LEAVING,
}


class SGLangGateway:
    """``GET /workers``, ``DELETE /workers/{id}``, ``POST /workers`` (0.3.x and smg)."""

    active = True
    port_names: tuple[str, ...] = ("http",)

    def __init__(self, kind: str = "sglang-gateway") -> None:
        self.kind = kind

    def view(self, http: httpx.Client, base: str) -> RouterView:
        try:
            body, at = get_json(http, f"{base}/workers")
            workers: dict[str, str] = {}
            state: dict[str, int] = {}
            smg = False  # whether the items carry smg's status
            for w in array(obj(body, "the answer")["workers"], "workers"):
                w = obj(w, "a worker")
                url = string(w["url"], "a worker url")
                wid = w.get("id", "")
                status = w.get("status")
                smg = smg or status is not None
                if status is None:
                    now = _SELECTED
                elif string(status, "a worker status") in STATUSES:
                    now = STATUSES[status]
                else:
                    raise ValueError(f"unknown worker status {status[:40]!r}")
                workers[url] = "" if wid is None else str(wid)
                state[url] = max(state.get(url, _LEAVING), now)  # listed twice: the more selected
        except READ_ERRORS as e:
            return failed(e)
        if why := opaque_worker(workers):
            return failed(why)
        return RouterView(
            workers=workers,
            fetched_at=at,
            idle=frozenset(u for u, s in state.items() if s == _IDLE),
            leaving=frozenset(u for u, s in state.items() if s == _LEAVING),
            confirm_s=SMG_CONFIRM_S if smg else 0.0,
        )

    def remove(self, http: httpx.Client, base: str, url: str, worker_id: str) -> None:
        sent(http, "DELETE", f"{base}/workers/{quote(worker_id or url, safe='')}")

    def add(self, http: httpx.Client, base: str, url: str) -> str:
        return sent(http, "POST", f"{base}/workers", json={"url": url})
