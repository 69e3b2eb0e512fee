"""``retire setup``: register the retirements' search attributes on a Temporal namespace.

Idempotent: attributes already registered with the right type are left alone; one
registered with another type is a conflict (exit 1, nothing changed), since the UI's
filters and ``retire list`` would read it wrongly.  The dev server registers them from
``temporal-dev.yaml``; a self-hosted cluster or Temporal Cloud needs this once per
namespace (on Temporal Cloud, with an API key allowed to manage the namespace, or with
``tcld namespace search-attributes add``)."""

from __future__ import annotations

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client

from workflows.mirror import SEARCH_ATTRIBUTES


class SetupConflict(Exception):
    """A search attribute of ours is registered with another type."""


def _type_name(value: int) -> str:
    return IndexedValueType.Name(value).removeprefix("INDEXED_VALUE_TYPE_").title()  # type: ignore[arg-type]


async def register_search_attributes(client: Client, *, namespace: str) -> list[str]:
    """Register what is missing; one line per attribute saying what was done."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    existing = dict(listed.custom_attributes)
    wanted = {k.name: int(k.indexed_value_type) for k in SEARCH_ATTRIBUTES}
    conflicts = [
        f"{name} is registered as {_type_name(existing[name])}, not {_type_name(kind)}"
        for name, kind in wanted.items()
        if name in existing and existing[name] != kind
    ]
    if conflicts:
        raise SetupConflict("; ".join(conflicts))
    missing = {name: kind for name, kind in wanted.items() if name not in existing}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(
                namespace=namespace,
                search_attributes={k: v for k, v in missing.items()},  # type: ignore[misc]
            )
        )
    return [
        f"{name} ({_type_name(kind)}): {'registered' if name in missing else 'already there'}"
        for name, kind in wanted.items()
    ]
