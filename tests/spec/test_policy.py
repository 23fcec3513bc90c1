"""The k allocation against brute force, and its behaviour on flat and linear cost curves."""

from __future__ import annotations

import itertools
import random

import pytest

from specserve.runner.cost import CostCurve, cost_grid
from specserve.spec.policy import (
    AcceptanceTracker,
    Gate,
    SpeculationPolicy,
    choose_k,
    expected_emitted,
)


def objective(accept: list[list[float]], ks: tuple[int, ...] | list[int], base: int, cost) -> float:  # type: ignore[no-untyped-def]
    emitted = sum(expected_emitted(a, k) for a, k in zip(accept, ks, strict=True))
    return emitted / cost(base + sum(ks))


def brute_force(accept: list[list[float]], caps: list[int], base: int, cost) -> float:  # type: ignore[no-untyped-def]
    return max(
        objective(accept, ks, base, cost) for ks in itertools.product(*(range(c + 1) for c in caps))
    )


def test_expected_emitted() -> None:
    assert expected_emitted([0.5, 0.5], 0) == 1.0
    assert expected_emitted([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_emitted([1.0] * 4, 4) == 5.0


def test_flat_cost_high_acceptance_takes_full_n() -> None:
    flat = lambda t: 0.030  # noqa: E731 - bandwidth-bound: more tokens cost nothing
    assert choose_k([[0.9] * 5] * 3, [5, 5, 5], 3, flat) == [5, 5, 5]


def test_linear_cost_takes_zero() -> None:
    linear = lambda t: 0.001 * t  # noqa: E731 - compute-bound: each token costs the same
    assert choose_k([[0.9] * 5] * 16, [5] * 16, 16, linear) == [0] * 16


def test_mixed_acceptance_favours_good_sequences() -> None:
    # Cost rising gently: a slot pays only when its acceptance chain is likely.
    cost = lambda t: 0.020 + 0.002 * t  # noqa: E731
    ks = choose_k([[0.95] * 4, [0.05] * 4], [4, 4], 2, cost)
    assert ks[0] > 0 and ks[1] == 0


def test_greedy_matches_brute_force_on_random_cases() -> None:
    rng = random.Random(0)
    for _ in range(300):
        s = rng.randint(1, 3)
        caps = [rng.randint(0, 3) for _ in range(s)]
        accept = [sorted((rng.random() for _ in range(3)), reverse=True) for _ in range(s)]
        base = rng.randint(s, 6)
        a, b = rng.uniform(0.005, 0.05), rng.choice([0.0, 0.0005, 0.003, 0.02])
        cost = lambda t, a=a, b=b: a + b * t  # noqa: E731
        ks = choose_k(accept, caps, base, cost)
        assert all(0 <= k <= c for k, c in zip(ks, caps, strict=True))
        assert objective(accept, ks, base, cost) == pytest.approx(
            brute_force(accept, caps, base, cost), rel=1e-9
        )


def test_gate_reasons() -> None:
    gate = Gate(max_batch=4, max_tokens=20)
    assert gate.closed_by(5, 10) == "max_batch"
    assert gate.closed_by(4, 21) == "max_tokens"
    assert gate.closed_by(4, 20) is None


def test_policy_gate_zeroes_k_and_counts() -> None:
    policy = SpeculationPolicy(adaptive=False, gate=Gate(max_batch=2), max_k=4)
    assert policy.decide([1, 2], [4, 4], num_running=2, scheduled_tokens=2) == [4, 4]
    assert policy.decide([1, 2, 3], [4, 4, 4], num_running=3, scheduled_tokens=3) == [0, 0, 0]
    assert policy.stats.gated == {"max_batch": 1}


def test_adaptive_policy_learns_low_acceptance() -> None:
    cost = CostCurve.from_points({1: 0.02, 8: 0.021, 64: 0.05})
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), max_k=4, cost=cost)
    assert policy.decide([7], [4], 1, 1)[0] == 4  # optimistic prior: try drafting
    for _ in range(30):
        policy.record(7, 4, 0)  # every first draft rejected
    assert policy.decide([7], [4], 1, 1)[0] <= 1


def test_tracker_counts_tested_positions_only() -> None:
    tracker = AcceptanceTracker(4, prior_weight=0.0)
    tracker.record(1, num_drafted=4, num_accepted=1)  # d1 accepted, d2 rejected, d3/d4 untested
    assert tracker.tried == [1, 1, 0, 0]
    assert tracker.accepted == [1, 0, 0, 0]
    assert tracker.estimate(1, 2) == [1.0, 0.0]


def test_cost_curve_interpolates_and_is_monotone() -> None:
    curve = CostCurve.from_points({1: 1.0, 4: 0.5, 8: 3.0})
    assert curve.seconds == (1.0, 1.0, 3.0)
    assert curve(6) == pytest.approx(2.0)
    assert curve(16) == pytest.approx(7.0)  # extrapolated with the last slope
    assert cost_grid(10) == [1, 2, 4, 8, 10]
