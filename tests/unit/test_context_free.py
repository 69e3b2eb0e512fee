"""``worker.context_free``: which converters qualify, and that the SDK converts with the very
same converter whether the sandbox answers the context question or the wrapper does (on the
SDK's own ``_CommandAwareDataConverter``; a retirement runs through the wrapper in every
workflow test, since ``workflow_runner`` is the product's)."""

from __future__ import annotations

from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import (
    ActivitySerializationContext,
    DataConverter,
    DefaultPayloadConverter,
    PayloadCodec,
    SerializationContext,
    WithSerializationContext,
    WorkflowSerializationContext,
)
from temporalio.converter._extstore import StorageDriverStoreContext
from temporalio.worker import WorkflowInstance
from temporalio.worker._workflow import _CommandAwareDataConverter

from worker.build import workflow_runner
from worker.context_free import ContextFreeSerialization, _ContextFreeInstance, context_free
from worker.stale_activations import StaleActivationGuard

WORKFLOW = WorkflowSerializationContext(namespace="default", workflow_id="retire-ns-md")
ACTIVITY = ActivitySerializationContext(
    namespace="default",
    activity_id="3",
    activity_type="drain",
    activity_task_queue="retirement",
    workflow_id="retire-ns-md",
    workflow_type="Retirement",
    is_local=False,
)


class _Codec(PayloadCodec):
    async def encode(self, payloads: Any) -> Any:
        return list(payloads)

    async def decode(self, payloads: Any) -> Any:
        return list(payloads)


class _ContextCodec(_Codec, WithSerializationContext):
    """A codec that reads its context (it would encrypt per workflow, say)."""

    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> _ContextCodec:
        return _ContextCodec(context)


class _Answers(WorkflowInstance):
    """An instance that answers the context question as the sandboxed one does."""

    def __init__(self, context: SerializationContext | None) -> None:
        self.context = context
        self.activated = 0

    def activate(self, act: Any) -> Any:
        self.activated += 1
        return "completion"

    def get_serialization_context(self, command_info: Any) -> SerializationContext | None:
        return self.context

    def get_external_store_context(self, command_info: Any) -> StorageDriverStoreContext:
        raise AssertionError("the wrapper answers without the inner instance")

    def get_info(self) -> Any:
        return "info"

    def get_thread_id(self) -> int | None:
        return 7


def test_the_products_converter_is_context_free() -> None:
    assert context_free(pydantic_data_converter)
    assert context_free(DataConverter(payload_converter_class=DefaultPayloadConverter))
    assert context_free(DataConverter(payload_codec=_Codec()))


def test_a_converter_that_reads_its_context_is_not() -> None:
    assert not context_free(DataConverter(payload_codec=_ContextCodec()))


def _current(instance: WorkflowInstance, dc: DataConverter) -> DataConverter:
    """The converter the SDK encodes a payload with, given ``instance``'s answer."""
    return _CommandAwareDataConverter.create(
        instance=instance,
        context_free_dc=dc,
        workflow_context_dc=dc.with_context(WORKFLOW),
        workflow_context=WORKFLOW,
    )._get_current_dc()


def test_the_sdk_converts_with_the_same_converter_whatever_the_answer() -> None:
    dc = pydantic_data_converter
    ours = _current(_ContextFreeInstance(_Answers(WORKFLOW)), dc)
    for sandbox_answer in (None, WORKFLOW, ACTIVITY):
        assert _current(_Answers(sandbox_answer), dc) is ours is dc


def test_for_a_context_reading_converter_the_answer_would_matter() -> None:
    # Why the wrapper is only used for context-free converters.
    dc = DataConverter(payload_codec=_ContextCodec())
    codec = _current(_Answers(ACTIVITY), dc).payload_codec
    assert isinstance(codec, _ContextCodec) and codec.context == ACTIVITY
    assert _current(_ContextFreeInstance(_Answers(ACTIVITY)), dc) is dc


def test_the_wrapped_instance_delegates_the_rest() -> None:
    inner = _Answers(WORKFLOW)
    wrapped = _ContextFreeInstance(inner)
    assert wrapped.get_serialization_context(None) is None
    assert wrapped.get_external_store_context(None) == StorageDriverStoreContext(target=None)
    assert wrapped.activate(object()) == "completion" and inner.activated == 1  # type: ignore[arg-type]
    assert wrapped.get_info() == "info" and wrapped.get_thread_id() == 7  # type: ignore[comparison-overlap]


def _layers(runner: Any) -> list[str]:
    names = []
    while runner is not None:
        names.append(type(runner).__name__)
        runner = getattr(runner, "_inner", None)
    return names


def test_the_product_runner_uses_it_only_for_a_context_free_converter() -> None:
    assert _layers(workflow_runner(converter=pydantic_data_converter)) == [
        StaleActivationGuard.__name__,
        ContextFreeSerialization.__name__,
        "SandboxedWorkflowRunner",
    ]
    assert _layers(workflow_runner(converter=DataConverter(payload_codec=_ContextCodec()))) == [
        StaleActivationGuard.__name__,
        "SandboxedWorkflowRunner",
    ]
