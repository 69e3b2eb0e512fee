"""Property tests of the protocol's one decision function over arbitrary event sequences.

The sequences are not limited to what a well-behaved workflow would deliver: answers for
the wrong phase, restores nobody asked for, tokens at any time.  The invariants hold on
every prefix, on the function the workflow really runs.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.budgets import Budgets
from retirement.models import RetirementRequest, RetirementState
from retirement.phases import ORDER, Outcome, Phase, Verdict, abortable
from retirement.progress import REPORTED
from retirement.protocol import (
    ABANDON_AFTER,
    REASONS_CAP,
    RECHECK_MAX,
    AbortRequested,
    Admitted,
    Answered,
    Cancelled,
    CarryOn,
    Decision,
    Delete,
    Deleted,
    Event,
    Finish,
    Hold,
    IntentCancelled,
    NotDeleted,
    Progress,
    Refused,
    Restore,
    Restored,
    RetryOffered,
    RunPhase,
    StartAttempt,
    Started,
    Woke,
    capped,
    decide,
    freshness_bound,
    held,
    recheck_delay,
)
from retirement.reports import DeleteResult, IntentKind, MemberTarget, RestoreResult, Target

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BUDGETS = Budgets()
PHASES = [Phase.DISQUALIFIED, Phase.WITHDRAWING, Phase.DRAINING, Phase.SETTLING]


MEMBERS = ("p-1", "p-2")


def _event(
    kind: str, at: datetime, phase: Phase, verdict: Verdict, token: str, age: float
) -> Event:
    evidence = at - timedelta(seconds=age)
    table: dict[str, Event] = {
        "admitted": Admitted(at=at, restorable=MEMBERS),
        "refused": Refused(at=at, reason="no"),
        "answered": Answered(at=at, phase=phase, verdict=verdict, reason="r", evidence_at=evidence),
        "answered-undated": Answered(at=at, phase=phase, verdict=verdict, reason="r"),
        "deleted": Deleted(at=at),
        "not-deleted": NotDeleted(at=at, verdict=verdict, reason="label back"),
        "restored": Restored(at=at, restored=MEMBERS),
        "restored-timed": Restored(at=at, restored=MEMBERS, timed=True),
        "restored-empty": Restored(at=at),
        "restored-partial": Restored(at=at, restored=("p-1",)),
        "restored-gone": Restored(at=at, restored=("p-1",), gone=("p-2",)),
        "restored-held": Restored(at=at, restored=("p-2",), held=(("p-1", "PodReady is Unknown"),)),
        "woke": Woke(at=at),
        "woke-long": Woke(at=at, history_long=True),
        "abort": AbortRequested(at=at, reason="stop"),
        "intent": IntentCancelled(at=at, reason="gone"),
        "cancel": Cancelled(at=at),
        "retry": RetryOffered(at=at, token=token),
    }
    return table[kind]


steps = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "admitted",
                "refused",
                "answered",
                "answered",
                "answered",
                "answered-undated",
                "deleted",
                "not-deleted",
                "restored",
                "restored-timed",
                "restored-empty",
                "restored-partial",
                "restored-gone",
                "restored-held",
                "woke",
                "woke-long",
                "abort",
                "intent",
                "cancel",
                "retry",
            ]
        ),
        st.floats(min_value=0, max_value=1200),
        st.sampled_from(PHASES),
        st.sampled_from(list(Verdict)),
        st.sampled_from(["t1", "t2"]),
        st.floats(min_value=-5, max_value=60),
    ),
    max_size=40,
)


@settings(max_examples=1500, deadline=None)
@given(steps, st.sampled_from([None, "t1"]), st.booleans())
def test_invariants_hold_over_arbitrary_event_sequences(
    seq: list[tuple[str, float, Phase, Verdict, str, float]],
    last_token: str | None,
    guard_refreshes: bool,
) -> None:
    p = Progress(last_consumed_retry_token=last_token)
    d = decide(p, Started(at=T0), budgets=BUDGETS, guard_refreshes=guard_refreshes)
    p, now = d.progress, T0
    verified: list[Phase] = []  # VERIFIED answers accepted in this attempt, in order
    bound = freshness_bound(BUDGETS)
    for kind, dt, phase, verdict, token, age in seq:
        now = now + timedelta(seconds=dt)
        e = _event(kind, now, phase, verdict, token, age)
        before = p
        d = decide(p, e, budgets=BUDGETS, guard_refreshes=guard_refreshes)
        p = d.progress
        if isinstance(e, Answered) and e.verdict is Verdict.VERIFIED and e.phase is before.phase:
            verified.append(e.phase)
        # No Delete unless withdrawal was VERIFIED and then the drain, in this attempt...
        if isinstance(d.action, Delete):
            assert Phase.WITHDRAWING in verified and Phase.DRAINING in verified
            assert verified.index(Phase.WITHDRAWING) < verified.index(Phase.DRAINING)
            assert p.withdrawn_at is not None and p.drained_at is not None
            assert p.drained_at >= p.withdrawn_at
            # ... and no Delete on evidence older than the bound, unless the delete's
            # guard takes it again itself (and the decision says so).
            assert p.idle_read_at is not None
            if not guard_refreshes:
                assert now - p.idle_read_at <= bound
            elif now - p.idle_read_at > bound:
                assert "the delete's guard reads the engines again first" in p.reasons[-1]
        # UNKNOWN never advances.
        if isinstance(e, Answered) and e.verdict is Verdict.UNKNOWN:
            assert not isinstance(d.action, Delete)
            if p.phase in ORDER and before.phase in ORDER:
                assert ORDER.index(p.phase) <= ORDER.index(before.phase) or (
                    before.phase is Phase.SETTLING and p.outcome is Outcome.COMPLETED_UNSETTLED
                )
            if isinstance(d.action, RunPhase):
                assert d.action.phase is before.phase
        # FAILED in an abortable phase aborts now, and the next step is the restore.
        if (
            isinstance(e, Answered)
            and e.verdict is Verdict.FAILED
            and e.phase is before.phase
            and abortable(before.phase)
            and before.outcome is Outcome.RUNNING
            and not before.restoring
        ):
            assert p.phase is Phase.ABORTED and isinstance(d.action, Restore)
        # While held, only a restore, a hold, carrying on, or what ends the hold.
        if held(before) and not before.restoring:
            assert d.action is None or isinstance(
                d.action, Restore | Hold | CarryOn | Finish | StartAttempt
            )
            if isinstance(d.action, Restore):
                assert (before.unrestored or before.confirm_at) and p.outcome is Outcome.ABORTED
        if isinstance(d.action, Hold) and d.action.recheck_at is not None:
            assert p.unrestored or p.confirm_at or p.cancel_intent is not None
            assert d.action.recheck_at > e.at
            assert d.action.recheck_at - e.at <= max(RECHECK_MAX, ABANDON_AFTER)
        # An empty restore is never success: a restorable member the restore did not
        # confirm back (nor find gone) stays unrestored.
        if isinstance(e, Restored) and before.restoring:
            for name in before.restorable:
                if name not in e.restored and name not in e.gone:
                    assert name in p.unrestored
        # A hold never ends with members silently abandoned: it ends CapacityRetained only
        # once every member is back (and re-read after a confirmation by time), otherwise
        # Abandoned after the bound, naming them.
        if isinstance(d.action, Finish) and (held(before) or before.restoring):
            if d.action.outcome is Outcome.CAPACITY_RETAINED:
                assert not p.unrestored and not p.confirm_at
            else:
                assert d.action.outcome is Outcome.ABANDONED
                assert p.end_asked_at is not None and now >= p.end_asked_at + ABANDON_AFTER
                assert all(name in p.reason for name in p.unrestored)
        # A cancellation (the UI) never ends the retirement: it aborts and holds.
        if isinstance(e, Cancelled):
            assert d.action is None and p.outcome is before.outcome
        # No abort after the point of no return, but for a delete refused before any delete.
        refused = isinstance(e, NotDeleted) and before.phase is Phase.DELETING
        if before.phase in (Phase.DELETING, Phase.SETTLING, Phase.COMPLETED) and not refused:
            assert p.phase is not Phase.ABORTED
            assert not isinstance(d.action, Restore)
            assert p.phase is not Phase.DRAINING
        # Deadlines never pass the overall deadline.
        if p.phase_deadline is not None and p.deadline is not None:
            assert p.phase_deadline <= p.deadline
        # A replayed token never starts an attempt, nor is it queued.
        if isinstance(e, RetryOffered) and e.token == p.last_consumed_retry_token:
            assert p.retry_token == before.retry_token
        assert len(p.reasons) <= REASONS_CAP
        if isinstance(d.action, StartAttempt):
            assert d.action.token != p.last_consumed_retry_token
            break  # continue-as-new: a fresh Progress for the next attempt


def test_happy_path_sequence_reaches_delete_then_completed() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    d = decide(p, Admitted(at=T0), budgets=BUDGETS)
    assert d.action == RunPhase(Phase.DISQUALIFIED)
    for i, phase in enumerate([Phase.DISQUALIFIED, Phase.WITHDRAWING, Phase.DRAINING], 1):
        at = T0 + timedelta(seconds=i)
        d = decide(
            d.progress,
            Answered(at=at, phase=phase, verdict=Verdict.VERIFIED, evidence_at=at),
            budgets=BUDGETS,
        )
    assert isinstance(d.action, Delete)
    d = decide(d.progress, Deleted(at=T0 + timedelta(seconds=5)), budgets=BUDGETS)
    assert d.action == RunPhase(Phase.SETTLING)
    d = decide(
        d.progress,
        Answered(at=T0 + timedelta(seconds=6), phase=Phase.SETTLING, verdict=Verdict.VERIFIED),
        budgets=BUDGETS,
    )
    assert d.progress.outcome is Outcome.COMPLETED


def test_unknown_at_the_phase_deadline_aborts_and_restores() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    p = decide(p, Admitted(at=T0), budgets=BUDGETS).progress
    p = decide(
        p, Answered(at=T0, phase=Phase.DISQUALIFIED, verdict=Verdict.VERIFIED), budgets=BUDGETS
    ).progress
    late = T0 + timedelta(seconds=BUDGETS.withdrawal_s)
    d = decide(
        p, Answered(at=late, phase=Phase.WITHDRAWING, verdict=Verdict.UNKNOWN), budgets=BUDGETS
    )
    assert isinstance(d.action, Restore) and d.progress.phase is Phase.ABORTED
    d = decide(d.progress, Restored(at=late), budgets=BUDGETS)
    assert d.progress.outcome is Outcome.ABORTED


def test_held_members_are_rechecked_on_a_backoff_and_a_long_hold_carries_on() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    p = decide(p, Admitted(at=T0), budgets=BUDGETS).progress
    d = decide(
        p, Answered(at=T0, phase=Phase.DISQUALIFIED, verdict=Verdict.FAILED), budgets=BUDGETS
    )
    assert isinstance(d.action, Restore)
    waits = []
    now = T0
    for _ in range(8):
        d = decide(
            d.progress, Restored(at=now, held=(("p-1", "PodReady is Unknown"),)), budgets=BUDGETS
        )
        assert isinstance(d.action, Hold) and d.action.recheck_at is not None
        waits.append(d.action.recheck_at - now)
        now = d.action.recheck_at
        d = decide(d.progress, Woke(at=now), budgets=BUDGETS)
        assert isinstance(d.action, Restore) and d.progress.restoring
    assert waits == [recheck_delay(i) for i in range(8)]
    assert waits[0] == timedelta(seconds=5) and waits[-1] == RECHECK_MAX
    assert sum(r.startswith("not yet back") for r in d.progress.reasons) == 1
    d = decide(d.progress, Restored(at=now), budgets=BUDGETS)
    assert d.action == Hold() and not d.progress.unrestored
    d = decide(d.progress, Woke(at=now, history_long=True), budgets=BUDGETS)
    assert d.action == CarryOn()


def _drained(
    evidence_age_s: float, *, acted_after_s: float = 0.0, guard_refreshes: bool = False
) -> Decision:
    """An attempt whose drain VERIFIED on an idle read ``evidence_age_s`` old, decided
    ``acted_after_s`` after the drain answered (a workflow task that ran late), by a run
    whose delete guard takes stale evidence again (``guard_refreshes``) or not."""
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    d = decide(p, Admitted(at=T0, restorable=MEMBERS), budgets=BUDGETS)
    at = T0
    for phase in (Phase.DISQUALIFIED, Phase.WITHDRAWING, Phase.DRAINING):
        at += timedelta(seconds=1)
        d = decide(
            d.progress,
            Answered(
                at=at + timedelta(seconds=acted_after_s if phase is Phase.DRAINING else 0),
                phase=phase,
                verdict=Verdict.VERIFIED,
                evidence_at=at - timedelta(seconds=evidence_age_s),
            ),
            budgets=BUDGETS,
            guard_refreshes=guard_refreshes,
        )
    return d


def test_stale_drain_evidence_is_drained_again_never_deleted_on() -> None:
    fresh = _drained(0)
    assert isinstance(fresh.action, Delete)
    # The workflow task that acts on the drain's answer ran 96 s late (a lagging worker).
    late = _drained(0, acted_after_s=96)
    assert late.action == RunPhase(Phase.DRAINING) and late.progress.phase is Phase.DRAINING
    assert late.progress.drained_at is None and late.progress.idle_read_at is None
    assert "old" in late.progress.reason and "draining again" in late.progress.reason
    bound = freshness_bound(BUDGETS).total_seconds()
    assert isinstance(_drained(bound).action, Delete)
    assert _drained(bound + 1).action == RunPhase(Phase.DRAINING)


def test_stale_drain_evidence_goes_to_a_guard_that_reads_it_again() -> None:
    """A run whose delete guard takes stale evidence again: the delete, told why; the
    evidence handed on is the drain's own (the guard reads again, it does not trust it)."""
    late = _drained(0, acted_after_s=96, guard_refreshes=True)
    assert isinstance(late.action, Delete) and late.progress.phase is Phase.DELETING
    assert late.progress.idle_read_at is not None and late.progress.drained_at is not None
    [note] = [r for r in late.progress.reasons if "reads the engines again" in r]
    assert note.startswith("the drain's last idle read is 96 s old")
    fresh = _drained(0, guard_refreshes=True)
    assert isinstance(fresh.action, Delete)
    assert not any("reads the engines again" in r for r in fresh.progress.reasons)
    # A refusal of that guard (not idle again, a read that failed) drains again.
    again = decide(
        late.progress,
        NotDeleted(at=T0 + timedelta(seconds=100), verdict=Verdict.UNKNOWN, reason="not idle"),
        budgets=BUDGETS,
        guard_refreshes=True,
    )
    assert again.action == RunPhase(Phase.DRAINING) and again.progress.idle_read_at is None


def test_a_refused_delete_drains_again_or_aborts_and_a_kept_cancel_intent_acts() -> None:
    d = _drained(0)
    at = T0 + timedelta(seconds=5)
    again = decide(
        d.progress, NotDeleted(at=at, verdict=Verdict.UNKNOWN, reason="router"), budgets=BUDGETS
    )
    assert again.action == RunPhase(Phase.DRAINING) and again.progress.idle_read_at is None
    failed = decide(
        d.progress, NotDeleted(at=at, verdict=Verdict.FAILED, reason="label"), budgets=BUDGETS
    )
    assert isinstance(failed.action, Restore) and failed.progress.phase is Phase.ABORTED
    # A cancel-intent that arrived while Deleting ("the deletes finish") acts once the
    # delete refused before any delete: nothing was deleted, so the replica is kept.
    told = decide(d.progress, IntentCancelled(at=at, reason="spec re-declares it"), budgets=BUDGETS)
    refused = decide(
        told.progress, NotDeleted(at=at, verdict=Verdict.UNKNOWN, reason="x"), budgets=BUDGETS
    )
    assert isinstance(refused.action, Restore)
    done = decide(refused.progress, Restored(at=at, restored=MEMBERS), budgets=BUDGETS)
    assert done.action == Finish(Outcome.CAPACITY_RETAINED)


def _aborted() -> Decision:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    p = decide(p, Admitted(at=T0, restorable=MEMBERS), budgets=BUDGETS).progress
    d = decide(p, AbortRequested(at=T0, reason="stop"), budgets=BUDGETS)
    d = decide(d.progress, Woke(at=T0), budgets=BUDGETS)
    assert isinstance(d.action, Restore)
    return d


def test_an_empty_restore_is_never_read_as_every_member_back() -> None:
    # A restore attempt that started after its deadline and did nothing reports nothing.
    d = decide(_aborted().progress, Restored(at=T0), budgets=BUDGETS)
    assert d.progress.unrestored.keys() == set(MEMBERS)
    assert isinstance(d.action, Hold) and d.action.recheck_at is not None
    # One confirmed, one gone (nothing to put back): nothing left.
    d = decide(
        _aborted().progress, Restored(at=T0, restored=("p-1",), gone=("p-2",)), budgets=BUDGETS
    )
    assert not d.progress.unrestored and d.action == Hold()


def test_a_cancel_intent_ends_a_hold_only_once_every_member_is_back() -> None:
    d = decide(_aborted().progress, Restored(at=T0, restored=("p-2",)), budgets=BUDGETS)
    assert set(d.progress.unrestored) == {"p-1"}
    d = decide(d.progress, IntentCancelled(at=T0, reason="keep it"), budgets=BUDGETS)
    assert d.action is None and d.progress.outcome is Outcome.ABORTED
    now = T0
    while True:  # the hold keeps putting p-1 back until it is, or the bound passes
        d = decide(d.progress, Woke(at=now), budgets=BUDGETS)
        if isinstance(d.action, Hold):
            assert d.action.recheck_at is not None
            now = d.action.recheck_at
            continue
        assert isinstance(d.action, Restore)
        if now < T0 + timedelta(minutes=3):
            d = decide(d.progress, Restored(at=now, restored=("p-2",)), budgets=BUDGETS)
            assert isinstance(d.action, Hold)
            now = d.action.recheck_at or now
            continue
        break
    back = decide(d.progress, Restored(at=now, restored=MEMBERS), budgets=BUDGETS)
    assert back.action == Finish(Outcome.CAPACITY_RETAINED)


def test_a_hold_asked_to_end_abandons_members_not_back_after_the_bound_naming_them() -> None:
    d = decide(_aborted().progress, Restored(at=T0, restored=("p-2",)), budgets=BUDGETS)
    d = decide(d.progress, IntentCancelled(at=T0, reason="keep it"), budgets=BUDGETS)
    now = T0
    for _ in range(100):
        d = decide(d.progress, Woke(at=now), budgets=BUDGETS)
        if isinstance(d.action, Hold):
            assert d.action.recheck_at is not None
            assert d.action.recheck_at <= T0 + ABANDON_AFTER  # the bound is a wake-up
            now = d.action.recheck_at
            continue
        held_again = (("p-1", "PodReady is False"),)
        d = decide(
            d.progress, Restored(at=now, restored=("p-2",), held=held_again), budgets=BUDGETS
        )
        if isinstance(d.action, Finish):
            break
        assert isinstance(d.action, Hold) and d.action.recheck_at is not None
        now = d.action.recheck_at
    assert d.action == Finish(Outcome.ABANDONED, clear=False)
    assert now >= T0 + ABANDON_AFTER
    assert "p-1" in d.progress.reason and "p-2" not in d.progress.reason


def test_a_restore_confirmed_by_time_reads_the_routers_again_twice() -> None:
    d = decide(_aborted().progress, Restored(at=T0, restored=MEMBERS, timed=True), budgets=BUDGETS)
    assert d.progress.confirm_at == [T0 + timedelta(seconds=30), T0 + timedelta(seconds=120)]
    seen = []
    for _ in range(2):
        assert isinstance(d.action, Hold) and d.action.recheck_at is not None
        now = d.action.recheck_at
        seen.append(now - T0)
        d = decide(d.progress, Woke(at=now), budgets=BUDGETS)
        assert isinstance(d.action, Restore)
        # smg confirms by time again on each re-read: not planned anew while it holds
        d = decide(d.progress, Restored(at=now, restored=MEMBERS, timed=True), budgets=BUDGETS)
    assert seen == [timedelta(seconds=30), timedelta(seconds=120)]
    assert d.action == Hold() and not d.progress.confirm_at
    # A cancel-intent during the re-reads waits for them; after them it ends the hold.
    d2 = decide(_aborted().progress, Restored(at=T0, restored=MEMBERS, timed=True), budgets=BUDGETS)
    d2 = decide(d2.progress, IntentCancelled(at=T0, reason="keep"), budgets=BUDGETS)
    assert d2.action is None
    d2 = decide(d2.progress, Woke(at=T0), budgets=BUDGETS)
    assert isinstance(d2.action, Hold)


def test_a_router_dropping_the_member_at_a_re_read_makes_it_unrestored_again() -> None:
    d = decide(_aborted().progress, Restored(at=T0, restored=MEMBERS, timed=True), budgets=BUDGETS)
    now = T0 + timedelta(seconds=30)
    d = decide(d.progress, Woke(at=now), budgets=BUDGETS)
    dropped = (("p-1", "label back; router smg-0 does not select it yet"),)
    d = decide(d.progress, Restored(at=now, restored=("p-2",), held=dropped), budgets=BUDGETS)
    assert set(d.progress.unrestored) == {"p-1"} and not d.progress.confirm_at
    assert isinstance(d.action, Hold) and d.action.recheck_at is not None


def test_a_ui_cancel_aborts_and_holds_and_drops_a_retry_not_yet_started() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    p = decide(p, Admitted(at=T0, restorable=MEMBERS), budgets=BUDGETS).progress
    d = decide(p, Cancelled(at=T0), budgets=BUDGETS)
    assert d.action is None and d.progress.abort_requested == "workflow cancelled"
    d = decide(d.progress, Woke(at=T0), budgets=BUDGETS)
    assert isinstance(d.action, Restore)
    d = decide(d.progress, Restored(at=T0, restored=MEMBERS), budgets=BUDGETS)
    assert d.action == Hold() and d.progress.outcome is Outcome.ABORTED  # not an end
    # While held: a retry is accepted, then a cancellation arrives before it started.
    d = decide(d.progress, RetryOffered(at=T0, token="t9"), budgets=BUDGETS)
    assert d.progress.retry_token == "t9"
    p2 = d.progress.model_copy(update={"cancelled": False})  # a new run after carrying on
    d = decide(p2, Cancelled(at=T0), budgets=BUDGETS)
    assert d.progress.retry_token is None and "dropped" in d.progress.reason
    assert decide(d.progress, Woke(at=T0), budgets=BUDGETS).action == Hold()


def test_reasons_are_capped_keeping_the_first_and_the_latest() -> None:
    reasons = [f"r{i}" for i in range(1000)]
    out = capped(reasons)
    assert len(out) == REASONS_CAP
    assert out[:20] == reasons[:20] and out[-1] == "r999"
    assert out[20].startswith("... ") and "reasons omitted" in out[20]
    again = capped([*out, "r1000", "r1001"])
    assert len(again) == REASONS_CAP and again[:20] == reasons[:20]
    assert again[-1] == "r1001"
    omitted = int(again[20].split()[1])
    assert omitted + REASONS_CAP - 1 == 1002


# ----------------------------------------------------------------------------- the record
# What an activity reported travels inside its event; ``decide`` records it in the
# progress (the workflow never writes its state itself).


def _target() -> Target:
    members = [
        MemberTarget(pod=name, uid=f"uid-{name}", container_id=f"c-{name}", ip="10.0.0.1")
        for name in MEMBERS
    ]
    return Target(
        namespace="ns",
        deployment="llm",
        role="decode",
        ordinal=1,
        intent=IntentKind.COUNT_TRIM,
        engine="vllm",
        shape="single",
        members=members,
    )


def test_admitted_records_the_target_admission_bound() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    assert p.target is None
    target = _target()
    d = decide(p, Admitted(at=T0, restorable=MEMBERS, target=target), budgets=BUDGETS)
    assert d.progress.target == target and d.progress.restorable == list(MEMBERS)
    assert d.action == RunPhase(Phase.DISQUALIFIED)
    # An Admitted without a target (as most tests send) records none.
    assert decide(p, Admitted(at=T0), budgets=BUDGETS).progress.target is None


def test_an_answer_records_its_readings_and_each_router_removal_once() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    p = decide(p, Admitted(at=T0, restorable=MEMBERS), budgets=BUDGETS).progress
    readings = (("p-1", "running 0 waiting 0"), ("p-2", "running 2 waiting 0"))
    d = decide(
        p,
        Answered(at=T0, phase=Phase.DISQUALIFIED, verdict=Verdict.VERIFIED, readings=readings),
        budgets=BUDGETS,
    )
    assert d.progress.last_readings == dict(readings)
    assert list(d.progress.last_readings) == ["p-1", "p-2"]  # in the order reported
    # An UNKNOWN withdrawal asked two routers; its rerun asked one of them again and a third.
    first = ("uid-a|http://10.0.0.1:8000", "uid-b|http://10.0.0.1:8000")
    d = decide(
        d.progress,
        Answered(at=T0, phase=Phase.WITHDRAWING, verdict=Verdict.UNKNOWN, router_removals=first),
        budgets=BUDGETS,
    )
    assert d.progress.router_removals == list(first)
    assert d.progress.last_readings == dict(readings)  # no readings: the earlier ones stay
    again = ("uid-b|http://10.0.0.1:8000", "uid-c|http://10.0.0.1:8000")
    d = decide(
        d.progress,
        Answered(
            at=T0,
            phase=Phase.WITHDRAWING,
            verdict=Verdict.VERIFIED,
            router_removals=again,
            readings=(("p-1", "withdrawn"),),
        ),
        budgets=BUDGETS,
    )
    assert d.progress.router_removals == [*first, again[1]]
    assert d.progress.last_readings == {"p-1": "withdrawn"}  # replaced, not merged
    # Recorded whatever is decided on the answer, as the workflow did: a stale answer's
    # removals were still asked for, and the restore puts them back.
    stale = decide(
        d.progress,
        Answered(
            at=T0, phase=Phase.DISQUALIFIED, verdict=Verdict.VERIFIED, router_removals=("x|y",)
        ),
        budgets=BUDGETS,
    )
    assert not stale.accepted and stale.progress.router_removals[-1] == "x|y"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["r1|u", "r2|u", "r3|u", "r1|v"]), max_size=4)))
def test_router_removals_are_every_one_asked_for_once_in_the_order_first_asked(
    answers: list[list[str]],
) -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    for removals in answers:
        e = Answered(
            at=T0,
            phase=Phase.WITHDRAWING,
            verdict=Verdict.UNKNOWN,
            router_removals=tuple(removals),
        )
        p = decide(p, e, budgets=BUDGETS).progress
    assert p.router_removals == list(dict.fromkeys(r for rs in answers for r in rs))


def test_deleted_records_what_the_delete_did() -> None:
    d = _drained(0)
    assert isinstance(d.action, Delete) and d.progress.deleted is None
    result = DeleteResult(deleted=["p-1"], replaced=["p-2"], workload="none")
    done = decide(
        d.progress,
        Deleted(at=T0 + timedelta(seconds=5), reason="replaced, not touched: p-2", result=result),
        budgets=BUDGETS,
    )
    assert done.progress.deleted == result and done.action == RunPhase(Phase.SETTLING)
    # A delete that could not go on reports no result: nothing is recorded.
    failed = decide(d.progress, Deleted(at=T0, ok=False, reason="Invalid"), budgets=BUDGETS)
    assert failed.progress.deleted is None
    assert failed.action == Finish(Outcome.COMPLETED_UNSETTLED, clear=False)


def test_restored_records_what_the_last_restore_did() -> None:
    held_back = RestoreResult(held={"p-1": "PodReady is Unknown"}, restored=["p-2"])
    d = decide(
        _aborted().progress,
        Restored(
            at=T0,
            held=(("p-1", "PodReady is Unknown"),),
            restored=("p-2",),
            result=held_back,
        ),
        budgets=BUDGETS,
    )
    assert d.progress.restored == held_back and set(d.progress.unrestored) == {"p-1"}
    assert isinstance(d.action, Hold) and d.action.recheck_at is not None
    now = d.action.recheck_at
    d = decide(d.progress, Woke(at=now), budgets=BUDGETS)
    assert isinstance(d.action, Restore)
    back = RestoreResult(restored=list(MEMBERS))
    d = decide(d.progress, Restored(at=now, restored=MEMBERS, result=back), budgets=BUDGETS)
    assert d.progress.restored == back and not d.progress.unrestored  # the latest round's
    # A restore that failed outright is recorded as such (the workflow's ``failed["*"]``).
    failed = RestoreResult(failed={"*": "restore failed: timeout"})
    d = decide(
        _aborted().progress,
        Restored(at=T0, reason="restore failed: timeout", result=failed),
        budgets=BUDGETS,
    )
    assert d.progress.restored == failed and set(d.progress.unrestored) == set(MEMBERS)


def test_the_record_keeps_the_states_json_as_histories_hold_it() -> None:
    """``Progress`` declares what the activities reported last (``REPORTED``); the state's
    JSON keeps those keys where every earlier build wrote them: after ``request``, before
    ``history`` (``tests/workflows/test_histories.py`` checks the recorded payloads)."""
    assert tuple(Progress.model_fields)[-len(REPORTED) :] == REPORTED
    request = RetirementRequest(namespace="ns", deployment="llm", role="decode", ordinal=1)
    state = RetirementState.begin(workflow_id="w", request=request).model_copy(
        update={"target": _target(), "router_removals": ["r|u"]}
    )
    protocol = [k for k in Progress.model_fields if k not in REPORTED]
    keys = list(json.loads(state.model_dump_json()))
    assert keys == [*protocol, "workflow_id", "request", *REPORTED, "history"]
    assert list(state.model_dump()) == keys
    carried = state.carried_request()
    assert RetirementRequest.model_validate_json(carried.model_dump_json()) == carried
