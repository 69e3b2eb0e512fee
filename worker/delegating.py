"""A workflow runner that wraps each instance the SDK's runner creates, and an instance that
hands every call to the one it wraps: the base of the worker's two runner wrappers
(``worker.stale_activations``, ``worker.context_free``), each overriding only what it
changes.  The SDK's own runner and instance types are what is wrapped; their interface is
``temporalio.worker.WorkflowRunner`` and ``WorkflowInstance``."""

from __future__ import annotations

from typing import Any

from temporalio.bridge.proto.workflow_activation import WorkflowActivation
from temporalio.bridge.proto.workflow_completion import WorkflowActivationCompletion
from temporalio.worker import (
    WorkflowInstance,
    WorkflowInstanceDetails,
    WorkflowRunner,
)
from temporalio.workflow import Info, _Definition


class DelegatingInstance(WorkflowInstance):
    """Every call goes to ``inner``, unchanged."""

    def __init__(self, inner: WorkflowInstance) -> None:
        self._inner = inner

    def activate(self, act: WorkflowActivation) -> WorkflowActivationCompletion:
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: Any) -> Any:
        return self._inner.get_serialization_context(command_info)

    def get_external_store_context(self, command_info: Any) -> Any:
        return self._inner.get_external_store_context(command_info)

    def get_info(self) -> Info:
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class WrappingRunner(WorkflowRunner):
    """``inner``, each instance it creates wrapped by ``wrap``."""

    def __init__(self, inner: WorkflowRunner) -> None:
        self._inner = inner

    def wrap(self, instance: WorkflowInstance) -> WorkflowInstance:
        """The instance the worker is given for ``instance`` (override)."""
        raise NotImplementedError

    def prepare_workflow(self, defn: _Definition) -> None:
        self._inner.prepare_workflow(defn)

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return self.wrap(self._inner.create_instance(det))

    def set_worker_level_failure_exception_types(self, types: Any) -> None:
        self._inner.set_worker_level_failure_exception_types(types)
