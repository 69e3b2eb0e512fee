"""The claim an activity attempt keeps on the world (``activities.fencing``), on a clock
the test moves: it holds while every gap between heartbeats stays under the heartbeat
timeout less the SDK's throttle and a margin, and until the attempt's other timeouts."""

from __future__ import annotations

import pytest

from activities.fencing import MARGIN_S, THROTTLE_S, Claim
from workflows.options import HEARTBEAT, HEARTBEAT_THROTTLE

TIMEOUT_S = HEARTBEAT.total_seconds()
GAP_S = TIMEOUT_S - THROTTLE_S - MARGIN_S


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_throttle_the_claim_allows_for_is_the_one_the_worker_uses() -> None:
    assert HEARTBEAT_THROTTLE.total_seconds() == THROTTLE_S


def test_a_claim_holds_while_every_gap_stays_short() -> None:
    clock = Clock()
    claim = Claim(heartbeat_timeout_s=TIMEOUT_S, clock=clock)
    for _ in range(50):  # long-lived, as long as it heartbeats
        clock.now += GAP_S - 0.1
        claim.beat()
    assert claim.refusal() == ""


def test_one_gap_too_long_loses_the_claim_for_the_rest_of_the_attempt() -> None:
    clock = Clock()
    claim = Claim(heartbeat_timeout_s=TIMEOUT_S, clock=clock)
    clock.now += GAP_S + 0.5  # e.g. API calls that took 7.5 s without a heartbeat
    claim.beat()
    assert "without a heartbeat" in claim.refusal()
    for _ in range(5):  # heartbeating often again does not bring it back
        clock.now += 0.5
        claim.beat()
    assert claim.refusal()


def test_a_claim_whose_attempt_started_long_ago_without_a_heartbeat_is_lost_at_once() -> None:
    """The server started the attempt (and its heartbeat timer) before the worker's thread
    ran it: that wait counts as a gap."""
    claim = Claim(heartbeat_timeout_s=TIMEOUT_S, started_ago_s=GAP_S + 1, clock=Clock())
    assert "before the attempt's first heartbeat" in claim.refusal()
    assert Claim(heartbeat_timeout_s=TIMEOUT_S, started_ago_s=1, clock=Clock()).refusal() == ""


def test_a_claim_ends_with_the_attempts_timeout_whatever_it_heartbeats() -> None:
    clock = Clock()
    claim = Claim(heartbeat_timeout_s=TIMEOUT_S, expires_in_s=30, clock=clock)
    ends = 100 + 30 - MARGIN_S
    while clock.now + 1 < ends:
        clock.now += 1
        claim.beat()
        assert claim.refusal() == ""
    clock.now = ends
    claim.beat()
    assert claim.refusal() == "the attempt's timeout has passed"


@pytest.mark.parametrize("gap", [30.0, 300.0])
def test_without_a_heartbeat_timeout_only_the_attempts_timeout_bounds_the_claim(
    gap: float,
) -> None:
    clock = Clock()
    claim = Claim(heartbeat_timeout_s=None, expires_in_s=1000, clock=clock)
    clock.now += gap
    claim.beat()
    assert claim.refusal() == ""
