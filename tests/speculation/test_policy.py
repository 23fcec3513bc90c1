"""The policy's choice against brute force with scored drafts, the gates, the pre-check."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

import numpy as np
import pytest

from specserve.engine.drafting import keep_prefixes
from specserve.request import DraftOdds, SamplingParams, Sequence
from specserve.runner.cost import CostCurve, LiveCost, StepCostModel
from specserve.scheduler.batch import SeqWork
from specserve.speculation.calibration import Calibration
from specserve.speculation.objective import choose_k, choose_k_rated, expected_emitted
from specserve.speculation.payoff import explore_every
from specserve.speculation.policy import DecodeSeq, Gate, SpeculationPolicy, sequence_factor
from specserve.speculation.proposer import Draft

Cost = Callable[[int], float]


def vectorised(cost: Cost) -> Callable[[np.ndarray], np.ndarray]:
    return lambda m: np.array([cost(int(x)) for x in m])


def objective(
    accept: list[list[float]], ks: tuple[int, ...] | list[int], base: float, cost: Cost
) -> float:
    emitted = base + sum(expected_emitted(a, k) - 1.0 for a, k in zip(accept, ks, strict=True))
    return emitted / cost(sum(ks))


def brute_force(accept: list[list[float]], base: float, cost: Cost) -> float:
    return max(
        objective(accept, ks, base, cost)
        for ks in itertools.product(*(range(len(a) + 1) for a in accept))
    )


def test_expected_emitted() -> None:
    assert expected_emitted([0.5, 0.5], 0) == 1.0
    assert expected_emitted([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_emitted([1.0] * 4, 4) == 5.0


def test_flat_cost_high_acceptance_takes_whole_drafts() -> None:
    flat = vectorised(lambda m: 0.030)  # bandwidth-bound: more rows cost nothing
    assert choose_k([[0.9] * 5, [0.9] * 3, [0.9] * 5], flat, 3.0) == [5, 3, 5]


def test_linear_cost_takes_zero() -> None:
    linear = vectorised(lambda m: 0.001 * (16 + m))  # compute-bound: each row costs the same
    assert choose_k([[0.9] * 5] * 16, linear, 16.0) == [0] * 16


def test_confident_tokens_kept_and_unsure_ones_trimmed() -> None:
    # A gently rising cost: the first draft's two sure tokens pay, its unsure tail does not.
    cost = vectorised(lambda m: 0.020 + 0.004 * m)
    assert choose_k([[0.95, 0.95, 0.1, 0.9], [0.05, 0.9]], cost, 2.0) == [2, 0]


def test_optimum_past_a_jump_in_cost_is_found() -> None:
    # Like the block kernels' switch to MKL: the first extra rows cost a jump, then little.
    cost = vectorised(lambda m: 0.02 + (0.01 if m else 0.0) + 0.0001 * m)
    assert choose_k([[0.99] * 4] * 4, cost, 4.0) == [4, 4, 4, 4]
    assert choose_k([[0.3] * 4] * 4, cost, 4.0) == [0, 0, 0, 0]


def test_choice_matches_brute_force_on_random_scored_drafts() -> None:
    rng = random.Random(0)
    for case in range(400):
        s = rng.randint(1, 3)
        accept = [[rng.random() ** 0.5 for _ in range(rng.randint(0, 4))] for _ in range(s)]
        base = s + rng.random()
        a, b = rng.uniform(0.005, 0.05), rng.choice([0.0, 0.0005, 0.003, 0.02])
        step = rng.choice([0.0, 0.03])  # a jump past 3 extra rows: a non-convex cost

        def cost(m: int, a: float = a, b: float = b, step: float = step) -> float:
            return a + b * m + (step if m > 3 else 0.0)

        ks = choose_k(accept, vectorised(cost), base)
        assert all(0 <= k <= len(x) for k, x in zip(ks, accept, strict=True)), case
        assert objective(accept, ks, base, cost) == pytest.approx(
            brute_force(accept, base, cost), rel=1e-9
        ), case


def test_gate_reasons() -> None:
    gate = Gate(max_batch=4, max_tokens=20)
    assert gate.closed_by(5, 10) == "max_batch"
    assert gate.closed_by(4, 21) == "max_tokens"
    assert gate.closed_by(4, 20) is None


def seqs(caps: list[int], static: bool = False, context: int = 100) -> list[DecodeSeq]:
    return [DecodeSeq(context, static, cap) for cap in caps]


def test_policy_gate_zeroes_caps_and_counts() -> None:
    policy = SpeculationPolicy(adaptive=False, gate=Gate(max_batch=2))
    assert policy.open(seqs([4, 4], static=True), num_running=2, scheduled_tokens=2) == [4, 4]
    assert policy.open(seqs([4, 4, 4], static=True), num_running=3, scheduled_tokens=3) == [0] * 3
    assert policy.stats.gated == {"max_batch": 1}


def test_static_policy_verifies_whole_drafts() -> None:
    policy = SpeculationPolicy(adaptive=False, gate=Gate())
    views = [
        DecodeSeq(50, True, draft=Draft([1, 2, 3], confidence=[0.0, 0.0, 0.0])),
        DecodeSeq(50, True, draft=None),
    ]
    assert policy.choose(views) == [3, 0]


def model(per_row: float, fixed: float = 0.02) -> LiveCost:
    curve = CostCurve((1, 64), (fixed + per_row, fixed + 64 * per_row))
    return LiveCost(StepCostModel(curve, 0.0, 0.0, 0.0, context=100))


def test_adaptive_policy_learns_from_rejections() -> None:
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.005))
    draft = Draft([1, 2, 3, 4], confidence=[0.35, 0.35, 0.35, 0.35])
    view = [DecodeSeq(100, False, draft=draft)]
    assert policy.choose(view)[0] >= 2  # optimistic start: worth trying
    for _ in range(40):
        policy.record(draft, 0)  # the first token is always rejected
    assert policy.choose(view) == [0]
    assert policy.stats.trimmed_tokens >= 4


def test_a_sequence_whose_drafts_fail_verifies_less_than_the_shared_calibration_says() -> None:
    """The traffic so far accepted these drafts whole; one sequence's are rejected at once: it
    stops verifying them while a fresh sequence still verifies the whole draft, and once its
    drafts land again it verifies them too."""
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.01))
    draft = Draft([1, 2, 3, 4], confidence=[0.95] * 4)
    for _ in range(40):
        policy.record(draft, 4)
    odds = DraftOdds()
    for _ in range(12):
        policy.record(draft, 0, odds)
    assert sequence_factor(DraftOdds()) == 1.0 and sequence_factor(odds) < 0.3
    views = [
        DecodeSeq(100, False, draft=draft),
        DecodeSeq(100, False, draft=draft, factor=sequence_factor(odds)),
    ]
    assert policy.choose(views) == [4, 0]
    failing = DecodeSeq(100, False, 4, factor=sequence_factor(odds) / 10)
    assert policy.open([failing], 1, 1) == [0]  # not even proposed: no draft of it could pay
    assert policy.open([DecodeSeq(100, False, 4)], 1, 1) == [4]
    for _ in range(20):
        policy.record(draft, 4, odds)
    views[1] = DecodeSeq(100, False, draft=draft, factor=sequence_factor(odds))
    assert policy.choose(views) == [4, 4]


def test_static_requests_on_an_adaptive_policy_keep_their_drafts() -> None:
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.005))
    draft = Draft([1, 2, 3], confidence=[0.5, 0.5, 0.5])
    for _ in range(40):
        policy.record(draft, 0)
    views = [DecodeSeq(100, True, draft=draft), DecodeSeq(100, False, draft=draft)]
    assert policy.choose(views) == [3, 0]


def test_precheck_skips_proposing_when_no_draft_can_pay() -> None:
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.01, fixed=0.0))
    for _ in range(50):
        policy.record(Draft([1], confidence=[0.9]), 0)  # the best bucket seen accepts nothing
    assert policy.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) == [0, 0]
    assert policy.open(seqs([4], static=True), num_running=1, scheduled_tokens=1) == [4]
    assert policy.stats.skipped_steps == 1
    forcing = [DecodeSeq(50, False, 4, grammar=True), DecodeSeq(50, False, 4)]
    assert policy.open(forcing, num_running=2, scheduled_tokens=2) == [4, 0]
    cheap = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.0001))
    assert cheap.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) == [4, 4]


def four_decoding(max_drafts: int = 2) -> list[SeqWork]:
    return [
        SeqWork(Sequence(i, f"r{i}", list(range(100)), SamplingParams()), 1, True, max_drafts)
        for i in range(4)
    ]


def chunk(tokens: int) -> SeqWork:
    return SeqWork(Sequence(9, "p", list(range(600)), SamplingParams()), tokens, False)


def test_a_prefill_chunk_beside_the_rows_does_not_make_drafts_cheap() -> None:
    """Drafts that do not pay in a decode-only step do not pay beside a 512-token prefill
    chunk either (rated by decode tokens over the whole step's seconds, the chunk made the
    same drafts look worth it: the step was dear, a row cheap beside it)."""
    curve = CostCurve((1, 64), (0.03, 0.03 + 63 * 0.004))
    live = LiveCost(StepCostModel(curve, 0.0, 0.0, per_prefill_token=0.002, context=100))
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=live, calibration=Calibration())
    draft = Draft([1, 2], confidence=[0.2, 0.2])
    for _ in range(40):
        policy.record(draft, 0)
        policy.record(draft, 1)  # first tokens: half accepted
    decode = four_decoding()
    assert keep_prefixes(policy, decode, [draft] * 4) == [None] * 4
    assert keep_prefixes(policy, [*decode, chunk(512)], [draft] * 4 + [None]) == [None] * 5
    assert policy.stats.k_chosen == {0: 8}


def calibrated(cost: LiveCost, accepted: float) -> SpeculationPolicy:
    """An adaptive policy whose two-token drafts land whole `accepted` of the time."""
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=cost, calibration=Calibration())
    draft = Draft([1, 2], confidence=[0.5, 0.5])
    for i in range(200):
        policy.record(draft, 2 if i < 200 * accepted else 0)
    return policy


def test_rows_beside_a_chunk_cost_what_the_curve_adds_past_its_tokens() -> None:
    """Beside a prefill chunk, the bar is the decode rows' own rate (the chunk's seconds are
    spent whatever the drafts) and a row costs what the curve adds past the chunk's tokens.
    The curve is flat to 64 tokens (weights streamed once), then 4 ms a token: beside a
    32-token chunk rows ride free and even poor drafts are verified; beside a 512-token one a
    row costs 4 ms against 7.5 ms a decode token, so drafts landing 0.95 of the time are
    verified and those landing 0.3 are not."""
    curve = CostCurve((1, 64, 128), (0.03, 0.03, 0.03 + 64 * 0.004))
    live = LiveCost(StepCostModel(curve, 0.0, 0.0, per_prefill_token=0.002, context=100))
    draft = Draft([1, 2], confidence=[0.5, 0.5])
    decode = four_decoding()
    poor, good = calibrated(live, 0.3), calibrated(live, 0.95)
    for policy in (poor, good):
        assert None not in keep_prefixes(policy, decode, [draft] * 4)
        kept = keep_prefixes(policy, [*decode, chunk(32)], [draft] * 4 + [None])
        assert None not in kept[:4]
    assert keep_prefixes(poor, [*decode, chunk(512)], [draft] * 4 + [None]) == [None] * 5
    assert None not in keep_prefixes(good, [*decode, chunk(512)], [draft] * 4 + [None])[:4]
    # the pre-check agrees: beside the big chunk even the poor policy's best bucket could pay
    views = [DecodeSeq(100, False, cap=2)] * 4
    assert good.open(views, num_running=5, scheduled_tokens=4 + 512) == [2] * 4


def test_cost_curve_is_isotonic_and_extrapolates() -> None:
    curve = CostCurve.from_points({1: 1.0, 4: 0.5, 8: 3.0})
    assert curve.seconds == (0.75, 0.75, 3.0)  # the violating pair is pooled, not clamped
    assert curve(6) == pytest.approx(1.875)
    assert curve(16) == pytest.approx(3.0 + 8 * 2.25 / 4)
    assert curve.many(np.array([1, 6, 16])).tolist() == pytest.approx([0.75, 1.875, 7.5])


def test_the_predicted_speedup_is_the_chosen_objective_over_none() -> None:
    rng = random.Random(3)
    for _ in range(50):
        accept = [[rng.random() for _ in range(rng.randint(1, 4))] for _ in range(3)]
        per_row = rng.choice([0.0, 0.0005, 0.002])

        def cost(m: int, p: float = per_row) -> float:
            return 0.01 + p * m

        rated = choose_k_rated(accept, vectorised(cost), 3.0)
        ks = rated.ks
        want = objective(accept, ks, 3.0, cost) / objective(accept, [0, 0, 0], 3.0, cost)
        assert rated.speedup == pytest.approx(want, rel=1e-12)
        assert rated.seconds == pytest.approx(cost(sum(ks)), rel=1e-12)
        assert (rated.base_emitted, rated.base_seconds) == (3.0, pytest.approx(cost(0)))
        assert ks == choose_k(accept, vectorised(cost), 3.0)


def test_what_proposing_costs_keeps_the_proposer_from_proposing_where_it_cannot_pay() -> None:
    """Rows nearly free, the best drafts half accepted: proposing pays while the proposer's
    call is cheap, and stops once its calls are seen costing a few steps (injected seconds)."""
    policy = SpeculationPolicy(adaptive=True, gate=Gate(), cost=model(per_row=0.0001))
    for accepted in [1] * 3 + [0] * 7:
        policy.record(Draft([1], confidence=[0.9]), accepted)
    assert policy.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) == [4, 4]
    views = [DecodeSeq(100, False), DecodeSeq(100, False)]  # proposed, found nothing
    for _ in range(3):
        policy.choose(views, proposing=2, seconds=0.0)
    assert policy.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) == [4, 4]
    for _ in range(3):
        policy.choose(views, proposing=2, seconds=0.2)  # 100 ms a sequence
    # an exploring step re-measures the price now and then: the calls (2 x 50 ms, the mean)
    # cost ~5 steps of ~20 ms, so at most 1 % of the time explores: about every 500th step
    every = explore_every(0.1, 0.0202, policy.payoff.explore, policy.payoff.explore_budget)
    assert 490 < every < 510
    opened = [policy.open(seqs([4, 4]), num_running=2, scheduled_tokens=2) for _ in range(1200)]
    explored = [i for i, caps in enumerate(opened) if caps == [4, 4]]
    assert explored == [every - 1, 2 * every - 1]
    assert policy.stats.skipped_steps == 1200 - 2
