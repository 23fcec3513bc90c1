"""Proposing pauses engine-wide while it has cost more than it returned (speculation/payoff.py),
and never while it pays; outputs are the same either way."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from specserve.engine.stats import EngineStats
from specserve.request import SamplingParams, Sequence
from specserve.speculation.payoff import FIRST_PAUSE, WINDOW
from specserve.speculation.policy import PolicyStats
from specserve.speculation.proposer import Draft, Proposer
from tests.engine.helpers import make_engine, run_all

PROMPTS = [[5, 6, 7, 8], [9, 10, 11, 12]]
PARAMS = SamplingParams(max_new_tokens=64, ignore_eos=True)


class _Scripted(Proposer):
    """Drafts each sequence's next tokens from `script` (its continuation, or junk), after
    spending `cost` seconds a call; counts the calls."""

    name = "scripted"

    def __init__(self, script: dict[int, list[int]], cost: float) -> None:
        self.script, self.cost, self.calls = script, cost, 0

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        self.calls += 1
        time.sleep(self.cost)
        out = []
        for s, k in zip(seqs, ks, strict=True):
            n = len(s.output_ids)
            tokens = self.script[s.prompt_ids[0]][n : n + k]  # [] past the script's end
            out.append(Draft(tokens, confidence=[0.95] * len(tokens)))
        return out

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        pass

    def release(self, seq: Sequence) -> None:
        pass


def run_scripted(
    tiny_llama: Path,
    monkeypatch: pytest.MonkeyPatch,
    script: dict[int, list[int]],
    cost: float,
    params: SamplingParams = PARAMS,
) -> tuple[list[list[int]], EngineStats, PolicyStats, _Scripted]:
    engine = make_engine(tiny_llama, speculate=3, policy="adaptive")
    proposer = _Scripted(script, cost)
    engine.res.proposer = proposer
    policy = engine.res.policy
    assert policy is not None
    # every draft verified whole: a sequence whose draft the policy trims to nothing pauses on
    # its own (drafting.py), which would leave the ledger's windows unfilled
    monkeypatch.setattr(
        policy,
        "choose",
        lambda views, prefill: [len(v.draft.tokens) if v.draft else 0 for v in views],
    )
    outs = run_all(engine, PROMPTS, params)
    return outs, engine.stats, policy.stats, proposer


def test_proposing_that_costs_and_finds_nothing_pauses_and_changes_nothing(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = run_all(make_engine(tiny_llama), PROMPTS, PARAMS)
    junk = {p[0]: [1] * 200 for p in PROMPTS}  # drafts the continuation never has
    outs, stats, policy, proposer = run_scripted(tiny_llama, monkeypatch, junk, cost=0.02)
    assert outs == want
    assert policy.unpaid_steps >= FIRST_PAUSE  # a window lost, then a whole pause sat out
    assert proposer.calls + policy.unpaid_steps <= stats.steps
    assert proposer.calls < stats.steps - FIRST_PAUSE


def test_proposing_that_pays_is_never_paused(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    longer = SamplingParams(max_new_tokens=240, ignore_eos=True)
    want = run_all(make_engine(tiny_llama), PROMPTS, longer)
    oracle = {p[0]: w for p, w in zip(PROMPTS, want, strict=True)}  # drafts what comes
    outs, stats, policy, _ = run_scripted(tiny_llama, monkeypatch, oracle, cost=0.0, params=longer)
    assert outs == want
    assert stats.steps > 3 * WINDOW  # windows closed: each one paid
    assert stats.proposer.accepted_tokens > 0 and policy.unpaid_steps == 0
