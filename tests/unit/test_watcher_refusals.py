"""The watcher's memory of refused intents (``watcher.refusals``), on a fake clock: the
back-off starts at its first value and doubles up to its max while the intent recurs; an
intent is held back only while its back-off lasts and what it was refused on is the same;
intents that went away are pruned; the next look is when the earliest back-off ends."""

from __future__ import annotations

from watcher.refusals import Refusal, Refusals

NS, MD = "ns", "md"
KEY = (NS, MD, "server", 1)


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def memory(clock: Clock) -> Refusals:
    return Refusals(clock=clock, backoff_s=30.0, backoff_max_s=100.0)


def test_the_backoff_doubles_up_to_its_max() -> None:
    clock = Clock()
    refusals = memory(clock)
    backoffs = [refusals.refuse(KEY, "same", f"no {i}").backoff_s for i in range(4)]
    assert backoffs == [30.0, 60.0, 100.0, 100.0]
    assert refusals[KEY] == Refusal("no 3", "same", 100.0, until=200.0)


def test_an_intent_is_held_back_until_its_backoff_ends() -> None:
    clock = Clock()
    refusals = memory(clock)
    refusals.refuse(KEY, "same", "no")
    assert refusals.holds_back(KEY, "same")
    clock.now += 29.9
    assert refusals.holds_back(KEY, "same")
    clock.now += 0.1
    assert not refusals.holds_back(KEY, "same")
    assert KEY in refusals  # remembered still: a second refusal doubles the back-off
    assert refusals.refuse(KEY, "same", "no").backoff_s == 60.0


def test_a_change_of_what_it_depended_on_ends_the_backoff_and_the_memory() -> None:
    clock = Clock()
    refusals = memory(clock)
    refusals.refuse(KEY, "before", "no")
    assert not refusals.holds_back(KEY, "after")
    assert KEY not in refusals
    assert refusals.refuse(KEY, "after", "no").backoff_s == 30.0  # starts over


def test_an_unrefused_intent_is_not_held_back() -> None:
    assert not memory(Clock()).holds_back(KEY, "anything")


def test_prune_forgets_intents_that_went_away_and_counts_those_backing_off() -> None:
    clock = Clock()
    refusals = memory(clock)
    refusals.refuse((NS, MD, "server", 1), (), "no")
    clock.now += 20
    refusals.refuse((NS, MD, "server", 2), (), "no")
    refusals.refuse((NS, MD, "prefill", 0), (), "no")
    refusals.refuse((NS, "other", "server", 1), (), "no")
    clock.now += 15  # server:1's back-off ended, server:2's has not
    assert refusals.prune((NS, MD), [("server", 1), ("server", 2)]) == 1
    assert sorted(refusals) == [
        (NS, MD, "server", 1),
        (NS, MD, "server", 2),
        (NS, "other", "server", 1),
    ]


def test_the_next_look_is_when_the_earliest_backoff_ends() -> None:
    clock = Clock()
    refusals = memory(clock)
    assert refusals.next_wait((NS, MD)) is None
    refusals.refuse((NS, MD, "server", 1), (), "no")
    clock.now += 10
    refusals.refuse((NS, MD, "server", 2), (), "no")
    assert refusals.next_wait((NS, MD)) == 20.0
    clock.now += 25
    assert refusals.next_wait((NS, MD)) == 0.0  # ended: look now
    assert refusals.next_wait((NS, "other")) is None


def test_a_deployment_is_forgotten_whole() -> None:
    refusals = memory(Clock())
    refusals.refuse((NS, MD, "server", 1), (), "no")
    refusals.refuse((NS, MD, "server", 2), (), "no")
    refusals.refuse((NS, "other", "server", 1), (), "no")
    assert refusals.has((NS, MD))
    refusals.forget_deployment((NS, MD))
    assert not refusals.has((NS, MD))
    assert list(refusals) == [(NS, "other", "server", 1)]


def test_the_memory_reads_as_a_mapping() -> None:
    refusals = memory(Clock())
    assert refusals == {} and not refusals
    refusals.refuse(KEY, (), "no")
    assert refusals == {KEY: Refusal("no", (), 30.0, until=130.0)}
    refusals.clear()
    assert len(refusals) == 0
