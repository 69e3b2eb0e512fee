"""Property tests of the protocol's one decision function over arbitrary event sequences.

The sequences are not limited to what a well-behaved workflow would deliver: answers for
the wrong phase, restores nobody asked for, tokens at any time.  The invariants hold on
every prefix, on the function the workflow really runs.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from retirement.budgets import Budgets
from retirement.phases import ORDER, Outcome, Phase, Verdict, abortable
from retirement.protocol import (
    RECHECK_MAX,
    AbortRequested,
    Admitted,
    Answered,
    Cancelled,
    CarryOn,
    Delete,
    Deleted,
    Event,
    Finish,
    Hold,
    IntentCancelled,
    Progress,
    Refused,
    Restore,
    Restored,
    RetryOffered,
    RunPhase,
    StartAttempt,
    Started,
    Woke,
    decide,
    held,
    recheck_delay,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
BUDGETS = Budgets()
PHASES = [Phase.DISQUALIFIED, Phase.WITHDRAWING, Phase.DRAINING, Phase.SETTLING]


def _event(kind: str, at: datetime, phase: Phase, verdict: Verdict, token: str) -> Event:
    table: dict[str, Event] = {
        "admitted": Admitted(at=at),
        "refused": Refused(at=at, reason="no"),
        "answered": Answered(at=at, phase=phase, verdict=verdict, reason="r"),
        "deleted": Deleted(at=at),
        "restored": Restored(at=at),
        "restored-held": Restored(at=at, held=(("p-1", "PodReady is Unknown"),)),
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
                "deleted",
                "restored",
                "restored-held",
                "woke",
                "woke-long",
                "abort",
                "intent",
                "cancel",
                "retry",
            ]
        ),
        st.floats(min_value=0, max_value=200),
        st.sampled_from(PHASES),
        st.sampled_from(list(Verdict)),
        st.sampled_from(["t1", "t2"]),
    ),
    max_size=40,
)


@settings(max_examples=600, deadline=None)
@given(steps, st.sampled_from([None, "t1"]))
def test_invariants_hold_over_arbitrary_event_sequences(
    seq: list[tuple[str, float, Phase, Verdict, str]], last_token: str | None
) -> None:
    p = Progress(last_consumed_retry_token=last_token)
    d = decide(p, Started(at=T0), budgets=BUDGETS)
    p, now = d.progress, T0
    verified: list[Phase] = []  # VERIFIED answers accepted in this attempt, in order
    for kind, dt, phase, verdict, token in seq:
        now = now + timedelta(seconds=dt)
        e = _event(kind, now, phase, verdict, token)
        before = p
        d = decide(p, e, budgets=BUDGETS)
        p = d.progress
        if isinstance(e, Answered) and e.verdict is Verdict.VERIFIED and e.phase is before.phase:
            verified.append(e.phase)
        # No Delete unless withdrawal was VERIFIED and then the drain, in this attempt.
        if isinstance(d.action, Delete):
            assert Phase.WITHDRAWING in verified and Phase.DRAINING in verified
            assert verified.index(Phase.WITHDRAWING) < verified.index(Phase.DRAINING)
            assert p.withdrawn_at is not None and p.drained_at is not None
            assert p.drained_at >= p.withdrawn_at
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
                assert before.unrestored and p.outcome is Outcome.ABORTED
        if isinstance(d.action, Hold) and d.action.recheck_at is not None:
            assert p.unrestored and d.action.recheck_at > e.at
            assert d.action.recheck_at - e.at <= RECHECK_MAX
        # No abort after the point of no return.
        if before.phase in (Phase.DELETING, Phase.SETTLING, Phase.COMPLETED):
            assert p.phase is not Phase.ABORTED
            assert not isinstance(d.action, Restore)
        # Deadlines never pass the overall deadline.
        if p.phase_deadline is not None and p.deadline is not None:
            assert p.phase_deadline <= p.deadline
        # A replayed token never starts an attempt, nor is it queued.
        if isinstance(e, RetryOffered) and e.token == p.last_consumed_retry_token:
            assert p.retry_token == before.retry_token
        if isinstance(d.action, StartAttempt):
            assert d.action.token != p.last_consumed_retry_token
            break  # continue-as-new: a fresh Progress for the next attempt


def test_happy_path_sequence_reaches_delete_then_completed() -> None:
    p = decide(Progress(), Started(at=T0), budgets=BUDGETS).progress
    d = decide(p, Admitted(at=T0), budgets=BUDGETS)
    assert d.action == RunPhase(Phase.DISQUALIFIED)
    for i, phase in enumerate([Phase.DISQUALIFIED, Phase.WITHDRAWING, Phase.DRAINING], 1):
        d = decide(
            d.progress,
            Answered(at=T0 + timedelta(seconds=i), phase=phase, verdict=Verdict.VERIFIED),
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
