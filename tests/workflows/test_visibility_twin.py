"""``FakeTemporal``'s visibility and the real dev server's, side by side (issue 21: every
strictness of a fake has its twin against the real server).  The same retirements are
started on both, one is terminated on both, and then each query the product sends (the
watcher's running list, ``retire list`` in one namespace, with and without closed runs,
and across namespaces) lists the same workflows on both; a namespace whose name merely
begins like the one asked for is not in it (``STARTS_WITH 'ns/'``)."""

from __future__ import annotations

import uuid

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment

from cli.main import list_query
from retirement.models import RetirementRequest, workflow_id_for
from tests.helpers import eventually_async
from tests.helpers.fake_temporal import FakeTemporal
from watcher.running import QUERY as RUNNING
from workflows.mirror import initial_search_attributes
from workflows.retirement import RetirementWorkflow


async def listed(client: Client, query: str, mine: set[str]) -> set[str]:
    """The IDs of this test's workflows that ``query`` lists."""
    return {wf.id async for wf in client.list_workflows(query)} & mine


async def test_the_fake_lists_what_the_server_lists(dev_env: WorkflowEnvironment) -> None:
    server, fake = dev_env.client, FakeTemporal()
    ns = f"twin-{uuid.uuid4().hex[:6]}"
    queue = f"nobody-{uuid.uuid4().hex[:8]}"  # no worker: the retirements just stay running
    requests = [
        RetirementRequest(namespace=namespace, deployment=name, role="server", ordinal=1)
        for namespace, name in ((ns, "a"), (ns, "b"), (ns, "c"), (f"{ns}x", "a"))
    ]
    handles = {}
    for req in requests:
        wid = workflow_id_for(namespace=req.namespace, deployment=req.deployment)
        for client in (server, fake.client()):
            handle = await client.start_workflow(
                RetirementWorkflow.run,
                req,
                id=wid,
                task_queue=queue,
                search_attributes=initial_search_attributes(req),
            )
        handles[wid] = handle
    closed = workflow_id_for(namespace=ns, deployment="b")
    await server.get_workflow_handle(closed).terminate("twin over")
    fake.close(closed, WorkflowExecutionStatus.TERMINATED)
    mine = set(handles)
    try:
        queries = {
            RUNNING: mine - {closed},
            list_query(everything=False, scope=ns): {
                workflow_id_for(namespace=ns, deployment=d) for d in ("a", "c")
            },
            list_query(everything=True, scope=ns): {
                workflow_id_for(namespace=ns, deployment=d) for d in ("a", "b", "c")
            },
            list_query(everything=True): mine,
        }
        for query, expected in queries.items():
            assert await listed(fake.client(), query, mine) == expected, query
            await eventually_async(
                lambda q=query: listed(server, q, mine),
                accept=lambda ids, want=expected: ids == want,
                what=f"the server lists what the fake lists for {query!r}",
            )
    finally:
        for wid in mine - {closed}:
            await server.get_workflow_handle(wid).terminate("twin over")
