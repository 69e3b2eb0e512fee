"""Pictures of the Temporal UI telling two retirements' story, on a running demo
(``make demo`` with ``--no-retire``, then ``python -m testbed.ui_story``).

Both demo deployments get an engine that never goes idle on ordinal 1 (the emulator's
stale-gauges trap), both specs are scaled 2 -> 1 so the watcher starts both retirements,
and once both drain, llama's is aborted (as on-call would) so it restores and holds while
qwen's keeps draining.  Then the UI's workflow list and both workflow pages are
photographed (``testbed/ui_pictures.py``) into ``docs/img/``.
"""

from __future__ import annotations

import asyncio
import time

import httpx
from kubernetes import client
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from retirement.models import AbortRequest, RetirementState, workflow_id_for
from retirement.names import GROUP, PLURAL, VERSION
from retirement.phases import Outcome, Phase
from testbed.netns import BedNet
from testbed.paths import REPO_ROOT
from testbed.temporal_dev import load_config
from testbed.ui_pictures import capture, list_url, workflow_url
from workflows.retirement import RetirementWorkflow

NS = "demo"
HUB = f"http://{BedNet().ns_ip}:7070"
OUT = REPO_ROOT / "docs" / "img"


def never_idle(http: httpx.Client, deployment: str) -> None:
    """The ordinal-1 engine of ``deployment`` reads one request in flight for ever."""
    pods = http.get(f"{HUB}/pods").json()["pods"]
    victim = next(p["name"] for p in pods if p["name"].startswith(f"{deployment}-server-1."))
    http.post(f"{HUB}/pods/{victim}/traps", json={"stale_gauges": [1, 0]}).raise_for_status()


async def until(client_: Client, name: str, check: object, timeout: float = 120) -> None:
    handle = client_.get_workflow_handle(workflow_id_for(namespace=NS, deployment=name))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            st: RetirementState = await handle.query(RetirementWorkflow.state)
            if callable(check) and check(st):
                return
        except Exception:
            pass
        await asyncio.sleep(1)
    raise TimeoutError(f"retirement of {name} did not reach the wanted state")


async def main() -> None:
    cfg = load_config()
    kubeconfig = REPO_ROOT / ".bed" / "demo" / "kubeconfig"
    from kubernetes import config as kconfig

    api = kconfig.new_client_from_config(config_file=str(kubeconfig))
    co = client.CustomObjectsApi(api)
    tc = await Client.connect(
        cfg.address, namespace=cfg.namespace, data_converter=pydantic_data_converter
    )
    with httpx.Client(trust_env=False, timeout=5) as http:
        for name in ("llama", "qwen"):
            never_idle(http, name)
    for name in ("llama", "qwen"):
        md = co.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name)
        roles = md["spec"]["roles"]
        roles[0]["replicas"] = 1
        co.patch_namespaced_custom_object(
            GROUP, VERSION, NS, PLURAL, name, {"spec": {"roles": roles}}
        )
    for name in ("llama", "qwen"):
        await until(tc, name, lambda st: st.phase is Phase.DRAINING)
    llama = tc.get_workflow_handle(workflow_id_for(namespace=NS, deployment="llama"))
    await llama.execute_update(
        RetirementWorkflow.abort, AbortRequest(reason="on-call: the engine never goes idle")
    )
    await until(tc, "llama", lambda st: st.outcome is Outcome.ABORTED and not st.restoring)
    await asyncio.sleep(3)  # the UI's current details follow the state
    print(capture(list_url(cfg.ui_url, "WorkflowType = 'Retirement'"), OUT / "ui-list.png"))
    for name in ("qwen", "llama"):
        wid = workflow_id_for(namespace=NS, deployment=name)
        print(capture(workflow_url(cfg.ui_url, wid), OUT / f"ui-{name}.png", height=1300))


if __name__ == "__main__":
    asyncio.run(main())
