"""The pure decision core: phases, budgets, shapes, member selection, readings, the drain
rule, retry tokens — example tests and hypothesis property tests of the invariants."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.budgets import Budgets, overall_deadline, phase_deadline
from retirement.drain import DrainProgress, observe_round
from retirement.names import LABEL_MEMBER_INDEX
from retirement.phases import ORDER, Phase, Verdict, abortable
from retirement.readings import SERIES, Sample, parse_oneshot_output
from retirement.retry import (
    RetryDecision,
    decide_retry,
    parse_retry_annotation,
    validate_token,
)
from retirement.shape import MemberPod, Shape, parse_flags, read_shape, select_members

T0 = datetime(2026, 1, 1, tzinfo=UTC)


# ---------------------------------------------------------------- phases and verdicts


def test_phase_order_and_point_of_no_return() -> None:
    assert [p.value for p in ORDER] == [
        "Admitted",
        "Disqualified",
        "Withdrawing",
        "Draining",
        "Deleting",
        "Settling",
        "Completed",
    ]
    assert abortable(Phase.DRAINING) and not abortable(Phase.DELETING)
    assert not abortable(Phase.SETTLING) and not abortable(Phase.ABORTED)


# ---------------------------------------------------------------- budgets


def test_default_budgets() -> None:
    b = Budgets()
    assert (b.overall_s, b.withdrawal_s, b.drain_s, b.settle_s) == (300, 30, 240, 30)


def test_bad_budgets_are_rejected() -> None:
    with pytest.raises(ValueError):
        Budgets(overall_s=0)
    with pytest.raises(ValueError):
        Budgets(poll_interval_s=40)  # longer than the 30 s withdrawal budget


@given(
    st.floats(0, 400),
    st.sampled_from(list(Phase)),
    st.builds(
        Budgets,
        overall_s=st.floats(1, 600),
        withdrawal_s=st.floats(1, 100),
        drain_s=st.floats(1, 400),
        settle_s=st.floats(1, 100),
        poll_interval_s=st.just(0.5),
    ),
)
def test_deadlines_never_extend_past_overall(offset: float, phase: Phase, b: Budgets) -> None:
    overall = overall_deadline(admitted_at=T0, budgets=b)
    started = T0 + timedelta(seconds=offset)
    d = phase_deadline(phase=phase, phase_started_at=started, overall=overall, budgets=b)
    assert d <= overall
    own = b.for_phase(phase)
    if own is not None:
        assert d <= started + timedelta(seconds=own)
        assert d == min(overall, started + timedelta(seconds=own))


# ---------------------------------------------------------------- shapes


@pytest.mark.parametrize(
    ("engine", "kind", "size", "args", "shape"),
    [
        ("vLLM", "Server", 1, [], Shape.SINGLE),
        (
            "vLLM",
            "Server",
            2,
            ["--data-parallel-size", "2", "--data-parallel-address", "x"],
            Shape.LEADER_SERVED,
        ),
        (
            "vLLM",
            "Server",
            2,
            ["--data-parallel-external-lb", "--data-parallel-size=2"],
            Shape.EXTERNAL_DP,
        ),
        ("vLLM", "Server", 2, ["--data-parallel-rank", "1"], Shape.EXTERNAL_DP),
        (
            "vLLM",
            "Server",
            2,
            ["--data-parallel-external-lb", "--data-parallel-hybrid-lb"],
            Shape.UNDECIDABLE,
        ),
        ("vLLM", "Prefill", 1, [], Shape.DISAGGREGATED),
        ("SGLang", "Server", 1, ["--dp-size", "4"], Shape.SINGLE),
        ("SGLang", "Server", 2, ["--nnodes", "2", "--node-rank", "0"], Shape.LEADER_SERVED),
        ("SGLang", "Server", 2, ["--nnodes", "3"], Shape.UNDECIDABLE),
        ("SGLang", "Decode", 1, ["--disaggregation-mode", "decode"], Shape.DISAGGREGATED),
        ("SGLang", "Server", 1, ["--disaggregation-mode=prefill"], Shape.UNDECIDABLE),
        ("SGLang", "Prefill", 1, [], Shape.UNDECIDABLE),
        ("SGLang", "Server", 1, ["--dp-size", "x"], Shape.UNDECIDABLE),
        ("TGI", "Server", 1, [], Shape.UNDECIDABLE),
    ],
)
def test_read_shape(engine: str, kind: str, size: int, args: list[str], shape: Shape) -> None:
    r = read_shape(engine=engine, role_kind=kind, size=size, extra_args=args, command=None)
    assert r.shape is shape, r.reason
    assert r.supported == (shape in (Shape.SINGLE, Shape.LEADER_SERVED, Shape.EXTERNAL_DP))
    assert r.supported or r.reason


@pytest.mark.parametrize(
    ("engine", "size", "args", "shape"),
    [
        # vLLM's short aliases and underscore spellings are the same options.
        ("vLLM", 2, ["-dp", "2", "-dpe"], Shape.EXTERNAL_DP),
        ("vLLM", 2, ["--data_parallel_size=2", "--data_parallel_external_lb"], Shape.EXTERNAL_DP),
        ("vLLM", 2, ["-dpn", "1"], Shape.EXTERNAL_DP),
        ("vLLM", 2, ["--data-parallel-ext"], Shape.EXTERNAL_DP),  # a unique prefix
        # The last occurrence wins, and --no- turns a boolean off.
        ("vLLM", 2, ["-dpe", "--no-data-parallel-external-lb"], Shape.LEADER_SERVED),
        # Every rank of a multi-port or hybrid group serves on its own: not leader-served.
        ("vLLM", 2, ["--data-parallel-multi-port-external-lb"], Shape.UNDECIDABLE),
        ("vLLM", 1, ["-dpm"], Shape.UNDECIDABLE),
        ("vLLM", 2, ["-dpl", "1", "--data-parallel-start-rank", "1"], Shape.UNDECIDABLE),
        ("vLLM", 2, ["--headless", "--data-parallel-start-rank", "1"], Shape.LEADER_SERVED),
        # Spellings the engine refuses, or that could be several options.
        ("vLLM", 1, ["--data-parallel-size", "two"], Shape.UNDECIDABLE),
        ("vLLM", 2, ["--data-parallel-external-lb=true"], Shape.UNDECIDABLE),
        ("vLLM", 2, ["--data-parallel-size 2"], Shape.UNDECIDABLE),
        ("vLLM", 2, ["--data-parallel-r", "1"], Shape.UNDECIDABLE),
        ("vLLM", 2, ["--config", "serve.yaml"], Shape.UNDECIDABLE),
        ("SGLang", 2, ["--tp", "2", "--nnodes", "2"], Shape.LEADER_SERVED),
        ("SGLang", 1, ["--tp_size", "2"], Shape.UNDECIDABLE),
        ("SGLang", 2, ["--nnodes=2", "--nnodes", "3"], Shape.UNDECIDABLE),  # the last wins
    ],
)
def test_read_shape_reads_every_spelling_as_the_engine_does(
    engine: str, size: int, args: list[str], shape: Shape
) -> None:
    r = read_shape(engine=engine, role_kind="Server", size=size, extra_args=args, command=None)
    assert r.shape is shape, r.reason
    assert r.supported or r.reason


def test_replaced_command_line_is_unmanaged() -> None:
    r = read_shape(
        engine="vLLM", role_kind="Server", size=1, extra_args=[], command=["bash", "-c", "serve"]
    )
    assert r.shape is Shape.UNMANAGED and not r.supported


def test_parse_flags() -> None:
    assert parse_flags(["pos", "--a", "1", "--b", "--c=3", "--a", "2"]) == {
        "--a": ["1", "2"],
        "--b": [""],
        "--c": ["3"],
    }


def pods(*indexes: str | None) -> list[MemberPod]:
    return [
        MemberPod(
            name=f"p{i}", uid=f"u{i}", labels={} if idx is None else {LABEL_MEMBER_INDEX: idx}
        )
        for i, idx in enumerate(indexes)
    ]


def test_member_selection() -> None:
    lead = read_shape(engine="vLLM", role_kind="Server", size=3, extra_args=[], command=None)
    ext = read_shape(
        engine="vLLM",
        role_kind="Server",
        size=3,
        extra_args=["--data-parallel-external-lb"],
        command=None,
    )
    single = read_shape(engine="vLLM", role_kind="Server", size=1, extra_args=[], command=None)
    assert select_members(shape=lead, size=3, members=pods("1", "0", "2")).measured == ("p1",)
    assert select_members(shape=ext, size=3, members=pods("2", "0", "1")).measured == (
        "p1",
        "p2",
        "p0",
    )
    assert select_members(shape=single, size=1, members=pods(None)).measured == ("p0",)
    assert (
        "leadership missing"
        in select_members(shape=lead, size=3, members=pods("1", "2", "2")).refusal
    )
    assert (
        "leadership duplicated"
        in select_members(shape=lead, size=3, members=pods("0", "0", "1")).refusal
    )
    assert (
        "declared size 3 != 2" in select_members(shape=lead, size=3, members=pods("0", "1")).refusal
    )
    assert "no valid" in select_members(shape=lead, size=2, members=pods("0", None)).refusal
    assert "beyond size" in select_members(shape=lead, size=2, members=pods("0", "5")).refusal


@given(
    st.integers(1, 6),
    st.lists(st.one_of(st.none(), st.integers(0, 7).map(str), st.text(max_size=3)), max_size=8),
    st.booleans(),
)
def test_member_selection_never_guesses(
    size: int, indexes: list[str | None], external: bool
) -> None:
    shape = read_shape(
        engine="vLLM",
        role_kind="Server",
        size=size,
        extra_args=["--data-parallel-external-lb"] if external else [],
        command=None,
    )
    sel = select_members(shape=shape, size=size, members=pods(*indexes))
    if sel.ok:
        assert len(indexes) == size
        names = {f"p{i}" for i in range(len(indexes))}
        assert set(sel.measured) <= names and sel.measured
        if size > 1 and not external:
            (leader,) = sel.measured
            assert indexes[int(leader[1:])] == "0"
    else:
        assert sel.refusal


# ---------------------------------------------------------------- readings


def out(values: dict[str, str], end: bool = True) -> str:
    return "".join(f"{k}\t{v}\n" for k, v in values.items()) + ("#end\n" if end else "")


VLLM = {n: "0.0" for n in SERIES["vLLM"].all}


def test_parse_complete_and_idle() -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=out({**VLLM, "vllm:prompt_tokens_total": "7"}))
    assert s.complete and s.idle and s.counters == (7.0, 0.0)
    busy = parse_oneshot_output(
        engine="vLLM", stdout=out({**VLLM, "vllm:num_requests_waiting": "2"})
    )
    assert busy.complete and not busy.idle and busy.in_flight == 2


@pytest.mark.parametrize(
    ("stdout", "why"),
    [
        (out({k: v for k, v in VLLM.items() if k != "vllm:num_requests_running"}), "missing"),
        (out({**VLLM, "vllm:num_requests_running": "nan"}), "invalid value"),
        (out({**VLLM, "vllm:num_requests_running": "-1"}), "invalid value"),
        (out({**VLLM, "vllm:num_requests_running": "idle"}), "invalid value"),
        (out({**VLLM, "vllm:num_requests_running": "missing"}), "invalid value"),
        (out(VLLM, end=False), "no #end"),
        ("#error\tbody over the 1 MiB cap\n", "1 MiB"),
        ("", "no #end"),
        (out(VLLM) + "extra\t1\n", "after #end"),
        (out({**VLLM, "other:series": "1"}), "unexpected series"),
        ("garbage\n#end\n", "malformed"),
    ],
)
def test_bad_output_reads_unknown_never_idle(stdout: str, why: str) -> None:
    s = parse_oneshot_output(engine="vLLM", stdout=stdout)
    assert not s.complete and not s.idle and s.verdict is Verdict.UNKNOWN
    assert why in s.reason


@given(st.text(max_size=300))
def test_arbitrary_output_never_crashes_and_is_idle_only_when_complete(stdout: str) -> None:
    for engine in ("vLLM", "SGLang", "nope"):
        s = parse_oneshot_output(engine=engine, stdout=stdout)
        assert not s.idle or s.complete
        if s.complete:
            assert all(math.isfinite(c) and c >= 0 for c in s.counters)


# ---------------------------------------------------------------- the drain rule


def idle(c: float = 0.0) -> Sample:
    return Sample(complete=True, in_flight=0, counters=(c, c))


def test_drain_needs_two_idle_reads_with_unchanged_counters() -> None:
    p = DrainProgress()
    p, v, _ = observe_round(p, measured=("a",), samples={"a": idle(5)})
    assert v is Verdict.UNKNOWN
    p, v, why = observe_round(p, measured=("a",), samples={"a": idle(6)})
    assert v is Verdict.UNKNOWN and "counters moved" in why
    p, v, _ = observe_round(p, measured=("a",), samples={"a": idle(6)})
    assert v is Verdict.VERIFIED and p.rounds == 3


SAMPLES = st.one_of(
    st.builds(
        lambda c: Sample(complete=True, in_flight=0, counters=(c, 0.0)),
        st.integers(0, 3).map(float),
    ),
    st.builds(
        lambda n: Sample(complete=True, in_flight=n, counters=(0.0, 0.0)),
        st.integers(1, 3).map(float),
    ),
    st.just(Sample(complete=False, reason="timeout")),
)


@settings(max_examples=300)
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["a", "b"]), SAMPLES, min_size=0, max_size=2),
        min_size=1,
        max_size=12,
    )
)
def test_drain_verifies_only_on_two_consecutive_complete_idle_equal_rounds(
    rounds: list[dict[str, Sample]],
) -> None:
    measured = ("a", "b")
    p = DrainProgress()
    prev: dict[str, Sample] | None = None
    for samples in rounds:
        p, v, _ = observe_round(p, measured=measured, samples=samples)
        complete_idle = set(samples) == set(measured) and all(s.idle for s in samples.values())
        if v is Verdict.VERIFIED:
            assert complete_idle and prev is not None
            assert all(prev[m].counters == samples[m].counters for m in measured)
        assert v is not Verdict.FAILED
        prev = dict(samples) if complete_idle else None


# ---------------------------------------------------------------- retry tokens


def test_replay_check_comes_before_the_aborted_check() -> None:
    assert decide_retry(token="t1", last_consumed="t1", aborted=False) is RetryDecision.REPLAY
    assert decide_retry(token="t1", last_consumed="t1", aborted=True) is RetryDecision.REPLAY
    assert decide_retry(token="t2", last_consumed="t1", aborted=False) is RetryDecision.NOT_ABORTED
    assert decide_retry(token="t2", last_consumed="t1", aborted=True) is RetryDecision.ACCEPT
    assert decide_retry(token="t2", last_consumed=None, aborted=True) is RetryDecision.ACCEPT


def test_retry_annotation() -> None:
    a = parse_retry_annotation("server:1:tok-2")
    assert (a.role, a.ordinal, a.token) == ("server", 1, "tok-2")
    for bad in [
        "server:1",
        "Server:1:t",
        "server:-1:t",
        "server:1:",
        "server:1:a b",
        "server:x:t",
        "a:1:t:u",
        "",
    ]:
        with pytest.raises(ValueError):
            parse_retry_annotation(bad)
    with pytest.raises(ValueError):
        validate_token("x" * 64)


@given(st.text(max_size=80))
def test_annotation_parsing_never_crashes(value: str) -> None:
    try:
        parse_retry_annotation(value)
    except ValueError as e:
        assert str(e)
