"""The engine times proposing and the policy stops asking a proposer that only costs time."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specserve.request import SamplingParams, Sequence
from specserve.runner.cost import CostCurve, LiveCost, StepCostModel
from specserve.speculation.proposer import Draft, Proposer
from tests.engine.helpers import make_engine, run_all


class _Empty(Proposer):
    """Finds nothing, ever, and takes 10 ms to look (several forward passes of the tiny model,
    even on a busy machine); counts the steps it was asked."""

    name = "empty"

    def __init__(self) -> None:
        self.asked = 0

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        self.asked += 1
        time.sleep(0.01)
        return [Draft([]) for _ in seqs]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


def test_a_proposer_that_finds_nothing_is_asked_only_to_explore(tiny_llama: Path) -> None:
    prompt, params = [[5, 6, 7, 8]], SamplingParams(max_new_tokens=60)
    want = run_all(make_engine(tiny_llama), prompt, params)
    engine = make_engine(tiny_llama, speculate=2, policy="adaptive")
    empty = _Empty()
    engine.use_proposer(empty)
    policy = engine.res.policy
    assert policy is not None
    # rows nearly free (a profile, not a clock): only what proposing costs can close it
    curve = CostCurve((1, 64), (0.001, 0.001 + 63 * 1e-6))
    policy.cost = LiveCost(StepCostModel(curve, 0.0, 0.0, 0.0, context=0))
    assert run_all(engine, prompt, params) == want  # only the speed changes
    payoff = policy.payoff
    # 58 decode steps with room for a draft: at most the first min_steps ask, then one in
    # `explore`; the pre-check may close sooner, once the calls' price (10 ms each, timed)
    # outweighs what drafts could gain on this step cost (both measured: which closes first
    # depends on the machine), and it explores as often
    closed = 58 - payoff.min_steps
    assert empty.asked <= payoff.min_steps + closed // payoff.explore
    assert policy.stats.unpaid_steps + policy.stats.skipped_steps == 58 - empty.asked
    [(low, steps, paid)] = payoff.table()
    assert low == 1 and steps == empty.asked and paid < 1.0
    [sums] = payoff.classes.values()  # the engine timed each ask: at least its 10 ms
    assert sums.with_seconds - sums.base_seconds >= 0.01
