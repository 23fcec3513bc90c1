"""The payoff ledger: proposing pauses, engine-wide, while it has cost more than it returned."""

from __future__ import annotations

from specserve.runner.cost import StepShape
from specserve.speculation.payoff import FIRST_PAUSE, MAX_PAUSE, WINDOW, Payoff
from specserve.speculation.policy import DecodeSeq, Gate, SpeculationPolicy
from tests.speculation.test_policy import model, seqs


def losing_window(payoff: Payoff) -> bool | None:
    """WINDOW steps of 4 sequences that accepted nothing and paid 10 % for proposing."""
    verdicts = [payoff.record(4, 0, 0.011, 0.010) for _ in range(WINDOW)]
    assert verdicts[:-1] == [None] * (WINDOW - 1)
    return verdicts[-1]


def pauses(payoff: Payoff) -> int:
    n = 0
    while payoff.paused():
        n += 1
    return n


def test_a_losing_window_pauses_longer_each_time_up_to_the_cap() -> None:
    payoff = Payoff()
    expected = FIRST_PAUSE
    for _ in range(8):
        assert losing_window(payoff) is False
        assert pauses(payoff) == expected
        expected = min(2 * expected, MAX_PAUSE)
    assert expected == MAX_PAUSE


def test_a_paying_window_resets_the_pause() -> None:
    payoff = Payoff()
    losing_window(payoff)
    losing_window(payoff)
    assert pauses(payoff) == 2 * FIRST_PAUSE
    # 2 of 4 sequences accepted a token each for 20 % more time: 6/0.012 > 4/0.010
    assert [payoff.record(4, 2, 0.012, 0.010) for _ in range(WINDOW)][-1] is True
    assert not payoff.paused()
    losing_window(payoff)
    assert pauses(payoff) == FIRST_PAUSE


def test_the_verdict_weighs_the_whole_window() -> None:
    payoff = Payoff()
    for _ in range(WINDOW - 1):  # mostly losing steps ...
        payoff.record(1, 0, 0.0055, 0.005)
    # ... and one that emits 3 tokens for 1.2x the time: (15 + 3) / 0.0885 > 16 / 0.08
    assert payoff.record(1, 2, 0.006, 0.005) is True


def test_steps_without_a_decoding_sequence_are_not_scored() -> None:
    payoff = Payoff()
    assert payoff.record(0, 0, 0.01, 0.01) is None
    assert payoff.steps == 0


def test_the_policy_sits_out_proposing_while_paused_and_counts_it() -> None:
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.0001))
    plain = StepShape.of([(1, 100)] * 2, prefill=0)
    drafted = StepShape.of([(3, 100)] * 2, prefill=0)
    verdicts = [policy.settle(drafted, plain, 0, 0.005) for _ in range(WINDOW)]
    assert verdicts[-1] is False  # 4 drafted rows and 5 ms of proposing bought nothing
    for _ in range(FIRST_PAUSE):
        assert policy.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) == [0, 0]
        assert policy.open(seqs([4], static=True), num_running=1, scheduled_tokens=1) == [4]
    assert policy.stats.unpaid_steps == FIRST_PAUSE
    assert policy.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) == [4, 4]


def test_a_static_policy_keeps_no_ledger() -> None:
    policy = SpeculationPolicy(adaptive=False, gate=Gate())
    shape = StepShape.of([(1, 100)], prefill=0)
    assert policy.settle(shape, shape, 0, 1.0) is None
    assert policy.open([DecodeSeq(100, False, 4)], num_running=1, scheduled_tokens=1) == [4]
