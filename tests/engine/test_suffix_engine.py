"""The suffix proposer in the engine: greedy outputs identical with it on and off, alone, in
mixed batches, under preemption and across requests (drafts from other requests' outputs), under
the adaptive policy made to trim; drafts really verified and really rejected; a lookup that finds
nothing adds no rows. Seeded sampling: tests/engine/test_speculation.py."""

from __future__ import annotations

from pathlib import Path

from specserve.engine.engine import Engine
from specserve.runner.cost import CostCurve, LiveCost, StepCostModel
from specserve.speculation.suffix import SuffixProposer
from tests.engine.helpers import assert_no_kv_held, make_engine, mixed_prompts, run_all
from tests.engine.observers import FedTokens
from tests.engine.test_speculation import LOOPY, greedy


def suffix_engine(model: Path, **kw: object) -> Engine:
    return make_engine(model, speculate=kw.pop("speculate", 4), proposer="suffix", **kw)  # type: ignore[arg-type]


def assert_drafted_and_rejected(engine: Engine) -> None:
    stats = engine.stats.proposer
    assert stats.accepted_tokens > 0, "the proposer never landed a draft"
    assert stats.drafted_tokens > stats.accepted_tokens, "no draft was ever rejected"


def test_greedy_lossless_alone_and_in_mixed_batches(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=11)
    want = run_all(make_engine(tiny_llama), prompts, greedy())
    for p, w in zip(prompts, want, strict=True):
        assert run_all(suffix_engine(tiny_llama), [p], greedy()) == [w]
    engine = suffix_engine(tiny_llama)
    caps = [None, 0, 2, None, 0, 1, None, 3]
    assert run_all(engine, prompts, [greedy(speculate=c) for c in caps]) == want
    assert_drafted_and_rejected(engine)
    assert_no_kv_held(engine)


def test_lossless_under_preemption(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=12)
    want = run_all(make_engine(tiny_llama), prompts, greedy(40))
    engine = suffix_engine(tiny_llama, num_blocks=30)
    assert run_all(engine, prompts, greedy(40)) == want
    assert engine.scheduler.num_preemptions > 0
    assert_drafted_and_rejected(engine)
    assert_no_kv_held(engine)


def test_lossless_across_requests_with_drafts_from_other_outputs(tiny_llama: Path) -> None:
    # The same prompts again, after a shuffle: the second pass can draft from the first's
    # outputs, which sit in the global index only (each request's own context is new).
    prompts = mixed_prompts(6, seed=13)
    want = run_all(make_engine(tiny_llama), prompts, greedy(24))
    engine = suffix_engine(tiny_llama)
    first = [run_all(engine, [p], greedy(24))[0] for p in prompts]
    proposer = engine.res.proposer
    assert isinstance(proposer, SuffixProposer)
    shared_before = proposer.drafts_from["shared"]
    order = [3, 0, 5, 1, 4, 2]
    again = run_all(engine, [prompts[i] for i in order], greedy(24))
    assert first == want and again == [want[i] for i in order]
    assert proposer.drafts_from["shared"] > shared_before
    assert_drafted_and_rejected(engine)
    assert_no_kv_held(engine)


def test_adaptive_policy_with_suffix_is_lossless(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(4, seed=14)
    want = run_all(make_engine(tiny_llama), prompts, greedy())
    engine = suffix_engine(tiny_llama, policy="adaptive")
    policy = engine.res.policy
    assert policy is not None
    # A row costs a third of a step here, so only confident tokens are worth verifying: the
    # policy keeps some drafts, trims others, and the outputs must not notice.
    policy.cost = LiveCost(StepCostModel(CostCurve((1, 65), (0.03, 0.03 + 64 * 0.01)), 0, 0, 0, 1))
    assert run_all(engine, prompts, greedy()) == want
    assert policy.stats.trimmed_tokens > 0 and engine.stats.proposer.drafted_tokens > 0
    # Requests that ask for the static policy verify every draft whole, even here.
    trimmed, proposed = policy.stats.trimmed_tokens, engine.stats.proposer.proposed_tokens
    drafted = engine.stats.proposer.drafted_tokens
    assert run_all(engine, prompts, [greedy(speculation_policy="static")] * len(prompts)) == want
    assert policy.stats.trimmed_tokens == trimmed
    new_proposed = engine.stats.proposer.proposed_tokens - proposed
    assert new_proposed > 0 and engine.stats.proposer.drafted_tokens - drafted == new_proposed
    assert_drafted_and_rejected(engine)
    assert_no_kv_held(engine)


def fed_rows(engine: Engine) -> list[int]:
    """Record the tokens every forward pass of `engine` feeds."""
    fed = FedTokens()
    engine.observers.add(fed)
    return fed.tokens


def test_a_lookup_that_finds_nothing_adds_no_rows(tiny_llama: Path) -> None:
    # Distinct tokens, two new per step at most: the first steps' lookups find nothing.
    prompt = list(range(3, 40))
    # static: every step reserves draft slots (the adaptive pre-check may close proposing)
    engine = suffix_engine(tiny_llama, speculate=4, policy="static")
    baseline = make_engine(tiny_llama)
    fed, base_fed = fed_rows(engine), fed_rows(baseline)
    engine.add_request(prompt, greedy(6))
    baseline.add_request(prompt, greedy(6))
    empty_steps = 0
    while engine.has_work() and engine.stats.proposer.drafted_tokens == 0:  # in lockstep
        engine.step()
        baseline.step()
        rec = engine.last_step
        assert rec is not None
        if rec.drafts_reserved and not rec.drafts_proposed:
            empty_steps += 1
            assert rec.drafts_verified == {} and fed[-1] == base_fed[-1] == 1
    assert empty_steps > 0
