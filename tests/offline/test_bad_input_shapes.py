"""Bad role shapes and Pod objects (``retirement/shape/``, ``retirement/intents.py``):
nothing undecidable reads as a supported shape, no member set that cannot be decided is
selected, and no malformed Pod yields a removal intent."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.intents import PodView, RoleSpec, derive_intents
from retirement.names import LABEL_MEMBER_INDEX
from retirement.shape import MemberPod, Shape, read_shape, select_members
from tests.corpus.cases import MEMBER_SETS, POD_LABELS, SHAPES, params


@pytest.mark.parametrize("case", params(SHAPES))
def test_a_bad_role_reads_an_unsupported_shape_with_a_reason(case: tuple[Any, ...]) -> None:
    engine, kind, size, extra_args, command = case
    reading = read_shape(
        engine=engine, role_kind=kind, size=size, extra_args=extra_args, command=command
    )
    assert not reading.supported and reading.reason
    members = [
        MemberPod(name=f"m-{i}", uid=f"u-{i}", labels={LABEL_MEMBER_INDEX: str(i)})
        for i in range(max(size, 0))
    ]
    selection = select_members(shape=reading, size=size, members=members)
    assert not selection.ok and not selection.measured and selection.refusal


@pytest.mark.parametrize("case", params(MEMBER_SETS))
def test_members_that_cannot_be_decided_are_refused(case: tuple[Any, ...]) -> None:
    engine, size, extra_args, indexes = case
    reading = read_shape(
        engine=engine, role_kind="Server", size=size, extra_args=extra_args, command=None
    )
    assert reading.supported, reading
    members = [
        MemberPod(
            name=f"m-{i}", uid=f"u-{i}", labels={} if idx is None else {LABEL_MEMBER_INDEX: idx}
        )
        for i, idx in enumerate(indexes)
    ]
    selection = select_members(shape=reading, size=size, members=members)
    assert not selection.ok and not selection.measured and selection.refusal


#: Role command lines an engine refuses, or that could be read as more than one option:
#: never a supported shape, always a reason (engine, size, extraArgs).
BAD_SPELLINGS = [
    ("vLLM", 2, ["--data-parallel-external-lb=1"]),
    ("vLLM", 2, ["-dpe=true"]),
    ("vLLM", 2, ["--data-parallel-external-lb", "true"]),
    ("vLLM", 2, ["-dp2", "-dpe"]),
    ("vLLM", 2, ["--data-parallel-rank"]),
    ("vLLM", 2, ["--data-parallel-rank", "--data-parallel-external-lb"]),
    ("vLLM", 2, ["--data-parallel-si", "2", "-dpe"]),
    ("vLLM", 2, ["--data-parallel-external-lb --data-parallel-size 2"]),
    ("vLLM", 2, ["--dp-size", "2", "-dpe"]),
    ("vLLM", 2, ["--no-headless"]),
    ("vLLM", 1, ["-tp", "0"]),
    ("vLLM", 1, ["-tp", "\u00b2"]),
    ("vLLM", 2, ["-dpe", "-dph"]),
    ("SGLang", 2, ["--dp_size", "2"]),
    ("SGLang", 2, ["-tp", "2"]),
    ("SGLang", 2, ["--nnodes", "2", "--enable-dp-attention=1"]),
    ("SGLang", 2, ["--nnodes", "$(UNKNOWN)"]),
]


@pytest.mark.parametrize(("engine", "size", "args"), BAD_SPELLINGS)
def test_a_spelling_the_engine_refuses_reads_an_unsupported_shape(
    engine: str, size: int, args: list[str]
) -> None:
    reading = read_shape(
        engine=engine, role_kind="Server", size=size, extra_args=args, command=None
    )
    assert not reading.supported and reading.reason
    members = [
        MemberPod(name=f"m-{i}", uid=f"u-{i}", labels={LABEL_MEMBER_INDEX: str(i)})
        for i in range(size)
    ]
    selection = select_members(shape=reading, size=size, members=members)
    assert not selection.ok and not selection.measured and selection.refusal


_FLAGS = [
    "--nnodes",
    "--dp-size",
    "--data-parallel-size",
    "--disaggregation-mode",
    "--data-parallel-external-lb",
    "--data-parallel-hybrid-lb",
    "--data-parallel-rank",
    "--kv-transfer-config",
    "--tp",
    "x",
]
_ascii = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    engine=st.sampled_from(["vLLM", "SGLang", "vllm", ""]),
    kind=st.sampled_from(["Server", "Prefill", "Decode", "", "Worker"]),
    size=st.integers(-2, 4),
    args=st.lists(
        st.sampled_from(_FLAGS)
        | _ascii
        | st.builds("{}={}".format, st.sampled_from(_FLAGS), _ascii),
        max_size=6,
    ),
    labels=st.lists(st.none() | st.sampled_from(["0", "1", "2", "3", "-1", "x", ""]), max_size=5),
)
def test_any_role_and_members_are_decided_or_refused(
    engine: str, kind: str, size: int, args: list[str], labels: list[str | None]
) -> None:
    reading = read_shape(engine=engine, role_kind=kind, size=size, extra_args=args, command=None)
    members = [
        MemberPod(
            name=f"m-{i}", uid=f"u-{i}", labels={} if idx is None else {LABEL_MEMBER_INDEX: idx}
        )
        for i, idx in enumerate(labels)
    ]
    selection = select_members(shape=reading, size=size, members=members)
    if not selection.ok:
        assert selection.refusal and not selection.measured
        return
    # A selection is made only for a supported shape with exactly `size` members...
    assert reading.supported and len(members) == size >= 1
    assert engine in ("vLLM", "SGLang") and (kind or "Server") == "Server"
    # ...and it names a leader (index 0) unless there is a single member.
    if reading.shape is not Shape.SINGLE:
        by_name = {m.name: m.labels.get(LABEL_MEMBER_INDEX) for m in members}
        assert "0" in {by_name[n] for n in selection.measured}


@pytest.mark.parametrize("labels", params(POD_LABELS))
def test_a_pod_with_malformed_labels_yields_no_intent(labels: dict[str, str]) -> None:
    pods = [PodView(name="bad", labels=labels)]
    assert derive_intents([RoleSpec(name="worker", replicas=1)], pods) == []
    assert derive_intents([], pods) == []


@pytest.mark.parametrize("size", [0, -1])
def test_a_role_with_no_valid_size_sheds_nothing(size: int) -> None:
    pods = [
        PodView(
            name=f"p-{m}",
            labels={
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": "0",
                LABEL_MEMBER_INDEX: str(m),
            },
        )
        for m in range(2)
    ]
    assert derive_intents([RoleSpec(name="worker", replicas=1, size=size)], pods) == []


def test_a_role_with_negative_replicas_trims_nothing() -> None:
    pods = [
        PodView(
            name="p-0",
            labels={
                "app.kubernetes.io/component": "worker",
                "modeldeployment.gpustack.ai/pod-ordinal": "0",
            },
        )
    ]
    assert derive_intents([RoleSpec(name="worker", replicas=-1)], pods) == []


@settings(max_examples=300, deadline=None)
@given(
    labels=st.lists(
        st.dictionaries(
            st.sampled_from(
                [
                    "app.kubernetes.io/component",
                    "modeldeployment.gpustack.ai/pod-ordinal",
                    LABEL_MEMBER_INDEX,
                    "x",
                ]
            ),
            st.sampled_from(["worker", "0", "1", "2", "-1", "", "one", " 1", "Worker"]),
            max_size=4,
        ),
        max_size=6,
    )
)
def test_intents_only_name_pods_with_a_role_and_a_numeric_ordinal(
    labels: list[dict[str, str]],
) -> None:
    pods = [PodView(name=f"p-{i}", labels=lb) for i, lb in enumerate(labels)]
    for intent in derive_intents([RoleSpec(name="worker", replicas=1, size=2)], pods):
        assert intent.ordinal >= 0
        owners = [p for p in pods if p.role == intent.role and p.ordinal == intent.ordinal]
        assert owners, intent
        assert set(intent.members) <= {p.name for p in owners}
