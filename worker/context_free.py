"""Answer the SDK's per-payload serialization-context question without entering the sandbox,
for a worker whose data converter reads no context.

Temporal's Python SDK (1.35) asks the workflow instance, for every payload of every
activation and completion it encodes or decodes, which serialization context and which
external-store context apply (``_CommandAwareDataConverter._get_current_dc`` and
``_external_store_payload_sequence`` in ``temporalio/worker/_workflow.py``).  The sandboxed
instance answers each question by compiling and running a string of code inside the
sandbox (``_Instance.get_serialization_context`` in ``workflow_sandbox/_runner.py``), on the
worker's event loop.  In the worker benchmark (N = 50, py-spy sampling the thread holding
the GIL) those calls were 17 % of the worker's Python time.

The answer only matters to a converter that uses it.  When the data converter has no
external storage and ``with_context`` returns the converter itself for every kind of
context (``DataConverter.with_context`` does so when no component implements
``WithSerializationContext``: the product's pydantic converter), the SDK converts with
that same converter whatever the context, so answering "no context" (the SDK then uses the
worker's context-free converter, the same object) and "no store target" changes no byte.
``ContextFreeSerialization`` answers so without the sandbox; ``context_free`` says whether a
converter qualifies, and ``worker.build`` uses the wrapper only when it does.
"""

from __future__ import annotations

from typing import Any

from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    SerializationContext,
    WorkflowSerializationContext,
)
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import WorkflowInstance

from worker.delegating import DelegatingInstance, WrappingRunner

#: Contexts of each kind the SDK hands a converter in a workflow worker.
_PROBES: tuple[SerializationContext, ...] = (
    WorkflowSerializationContext(namespace="probe", workflow_id="probe"),
    ActivitySerializationContext(
        namespace="probe",
        activity_id="1",
        activity_type="probe",
        activity_task_queue="probe",
        workflow_id="probe",
        workflow_type="probe",
        is_local=False,
    ),
)


def context_free(converter: DataConverter) -> bool:
    """Whether ``converter`` converts the same under every context: no external storage, and
    ``with_context`` gives back the converter itself for a workflow's and an activity's."""
    return converter.external_storage is None and all(
        converter.with_context(probe) is converter for probe in _PROBES
    )


class _ContextFreeInstance(DelegatingInstance):
    """A workflow instance that answers the context questions itself."""

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        return None  # the context-free converter: the one every context gives back

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        return StorageDriverStoreContext(target=None)  # no external storage to address


class ContextFreeSerialization(WrappingRunner):
    """``inner`` (the SDK's sandboxed runner), its instances answering the serialization
    and store context questions without the sandbox.  Only for a worker whose data
    converter is ``context_free``."""

    def wrap(self, instance: WorkflowInstance) -> WorkflowInstance:
        return _ContextFreeInstance(instance)
