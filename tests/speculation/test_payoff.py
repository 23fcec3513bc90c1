"""Proposing closes at a batch size where it has not paid for its own time (payoff.py)."""

from __future__ import annotations

import pytest

from specserve.runner.cost import CostCurve, LiveCost, StepCostModel
from specserve.speculation.objective import Rated
from specserve.speculation.payoff import Payoff, explore_every, size_class
from specserve.speculation.policy import DecodeSeq, Gate, SpeculationPolicy
from specserve.speculation.proposer import Draft


def step(base: float, cost: float, gained: float = 0.0, extra_cost: float = 0.0) -> Rated:
    """A choice whose drafts add `gained` expected tokens for `extra_cost` forward seconds."""
    return Rated([], base + gained, cost + extra_cost, base, cost)


def test_size_classes_double() -> None:
    assert [size_class(n) for n in (0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32)] == [
        1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6,
    ]  # fmt: skip


def test_a_class_that_loses_closes_and_explores_every_explore_th_step() -> None:
    payoff = Payoff(min_steps=4, explore=5)
    for _ in range(3):
        payoff.record(16, 16, seconds=0.004, p=step(16, 0.020))  # nothing found: paid 0.83
    assert payoff.allows(16)  # too few records to close
    payoff.record(16, 16, seconds=0.004, p=step(16, 0.020))
    opened = [payoff.allows(16) for _ in range(15)]
    assert opened == [False, False, False, False, True] * 3
    assert payoff.allows(1) and payoff.allows(8)  # other classes are their own
    assert payoff.allows(31) is False  # 16-31 is one class
    [(low, steps, paid)] = payoff.table()
    assert (low, steps) == (16, 4) and paid == pytest.approx(0.020 / 0.024)
    [sums] = payoff.classes.values()
    assert sums.with_seconds - sums.base_seconds == pytest.approx(0.004)


def test_a_closed_class_explores_less_often_where_exploring_costs_more() -> None:
    """Exploring steps that take 10 ms beside 20 ms steps (an EAGLE head catching up on every
    sequence's features) come every 50th step, 1 % of the time, the interval doubling on the way
    there; once they take 0.5 ms, every `explore`-th again."""
    payoff = Payoff(min_steps=4, explore=5)
    for _ in range(4):
        payoff.record(16, 16, seconds=0.004, p=step(16, 0.020))  # nothing found: closed
    assert explore_every(0.010, 0.020, 5, payoff.explore_budget) == 50
    gaps = []
    for _ in range(6):
        gaps.append(opened_after(payoff, 16))
        payoff.record(16, 16, seconds=0.010, p=step(16, 0.020))  # the exploring step
    assert gaps == [5, 10, 20, 40, 50, 50]
    payoff.record(16, 16, seconds=0.0005, p=step(16, 0.020))  # not an exploring step
    assert opened_after(payoff, 16) == 50
    payoff.record(16, 16, seconds=0.0005, p=step(16, 0.020))  # a cheap exploring step
    assert opened_after(payoff, 16) == 5


def test_one_slow_exploring_step_does_not_push_the_next_ones_far_away() -> None:
    """A lookup's exploring step caught by a busy machine (50 ms once beside 20 ms steps):
    the next exploring step comes twice as late, not 250 steps later."""
    payoff = Payoff(min_steps=4, explore=16)
    for _ in range(4):
        payoff.record(16, 16, seconds=0.004, p=step(16, 0.020))
    gaps = []
    for seconds in [0.0002, 0.050, 0.0002, 0.0002]:
        gaps.append(opened_after(payoff, 16))
        payoff.record(16, 16, seconds=seconds, p=step(16, 0.020))
    assert gaps == [16, 16, 32, 16]


def opened_after(payoff: Payoff, num_decode: int) -> int:
    """Steps until the closed class of `num_decode` explores (at most 1,000)."""
    for i in range(1, 1001):
        if payoff.allows(num_decode):
            return i
    raise AssertionError("never explored")


def test_drafts_that_pay_for_proposing_keep_it_open_and_reopen_a_closed_class() -> None:
    payoff = Payoff(min_steps=4, explore=5)
    for _ in range(8):  # 30 % more tokens for 5 % more forward time and 8 % proposing
        payoff.record(4, 4, seconds=0.002, p=step(4, 0.025, gained=1.2, extra_cost=0.00125))
    assert payoff.table()[0][2] == pytest.approx((5.2 / 0.02825) / (4 / 0.025))
    assert all(payoff.allows(4) for _ in range(20))
    for _ in range(60):
        payoff.record(4, 4, seconds=0.002, p=step(4, 0.025))  # found nothing: paid 0.93
    assert not payoff.allows(4)
    for _ in range(3):  # copying text arrives: drafts double the tokens
        payoff.record(4, 4, seconds=0.002, p=step(4, 0.025, gained=4.0, extra_cost=0.005))
    assert payoff.allows(4)


def test_a_few_steps_that_pay_much_outweigh_many_that_found_little() -> None:
    payoff = Payoff(min_steps=10, explore=5)
    for i in range(200):  # one step in ten: a token more; the rest: nothing for 0.3 ms
        gained = 1.0 if i % 10 == 0 else 0.0
        payoff.record(1, 1, seconds=0.0003, p=step(1, 0.004, gained, 0.0005 * (gained > 0)))
        assert payoff.allows(1)  # (a mean of each step's log ratio dips below the margin)
    assert 0.98 < payoff.table()[0][2] < 1.05


def test_a_cheap_proposer_that_finds_little_stays_open() -> None:
    payoff = Payoff(min_steps=4, explore=5)
    for _ in range(50):  # 20 us of lookup on a 7 ms step, nothing found: 0.3 % of the rate
        payoff.record(1, 1, seconds=20e-6, p=step(1, 0.007))
    assert payoff.table()[0][2] < 1.0
    assert all(payoff.allows(1) for _ in range(20))  # ... but within the margin


def flat(per_row: float, fixed: float) -> LiveCost:
    curve = CostCurve((1, 64), (fixed + per_row, fixed + 64 * per_row))
    return LiveCost(StepCostModel(curve, 0.0, 0.0, 0.0, context=100))


def free(n: int, cap: int = 3) -> list[DecodeSeq]:
    return [DecodeSeq(100, False, cap) for _ in range(n)]


def test_the_policy_stops_proposing_where_finding_nothing_cost_its_time() -> None:
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=flat(0.001, 0.02))
    nothing = [DecodeSeq(100, False) for _ in range(16)]
    for _ in range(policy.payoff.min_steps):
        assert policy.open(free(16), 16, 16) == [3] * 16
        assert policy.choose(nothing, proposing=16, seconds=0.003) == [0] * 16
    assert policy.open(free(16), 16, 16) == [0] * 16
    assert policy.stats.unpaid_steps == 1
    static = [*free(15), DecodeSeq(100, True, 3)]
    assert policy.open(static, 16, 16) == [0] * 15 + [3]  # a static request still drafts
    grammar = [*free(15), DecodeSeq(100, False, 3, grammar=True)]
    assert policy.open(grammar, 16, 16) == [0] * 15 + [3]  # and so does forced text
    assert policy.open(free(1), 1, 1) == [3]  # batch 1 never proposed: open


def test_drafts_whose_predicted_gain_covers_proposing_keep_the_policy_proposing() -> None:
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=flat(0.0001, 0.02))
    good = Draft([1, 2, 3], confidence=[1.0, 1.0, 1.0])
    for _ in range(40):
        policy.record(good, 3)
    views = [DecodeSeq(100, False, draft=good) for _ in range(16)]
    for _ in range(3 * policy.payoff.min_steps):
        assert policy.open(free(16), 16, 16) == [3] * 16
        assert policy.choose(views, proposing=16, seconds=0.003) == [3] * 16
    assert policy.stats.unpaid_steps == 0
    assert policy.payoff.table()[0][2] > 1.5
