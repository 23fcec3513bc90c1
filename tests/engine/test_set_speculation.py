"""Engine.set_speculation: speculation settings swapped between steps, requests in flight go on
and their greedy output does not change."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from specserve.config import SpecConfig
from specserve.request import SamplingParams
from tests.engine.helpers import make_engine, run_all

LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 15, 16, 12, 13]]


def greedy(n: int = 40) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def test_speculation_turned_on_mid_request_keeps_outputs(tiny_llama: Path) -> None:
    want = run_all(make_engine(tiny_llama), LOOPY, greedy())
    engine = make_engine(tiny_llama, speculate=0, proposer="ngram")
    ids = [engine.add_request(p, greedy()) for p in LOOPY]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    steps = 0
    while engine.has_work():
        if steps == 5:  # requests are decoding: switch speculation on under them
            assert engine.stats.proposer.drafted_tokens == 0
            engine.set_speculation(replace(engine.config.spec, speculate=4))
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        steps += 1
    assert [tokens[i] for i in ids] == want
    stats = engine.stats.proposer
    assert stats.drafted_tokens > 0 and stats.accepted_tokens > 0
    assert stats.drafted_tokens > stats.accepted_tokens  # rejections happened too
    assert engine.res.policy is not None and engine.config.spec.speculate == 4
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks


def test_speculation_off_and_gate_live(tiny_llama: Path) -> None:
    # static: drafts verified before the switch (adaptive ones follow step timings)
    engine = make_engine(tiny_llama, speculate=3, proposer="ngram", policy="static")
    run_all(engine, LOOPY[:1], greedy(20))
    drafted = engine.stats.proposer.drafted_tokens
    assert drafted > 0
    engine.set_speculation(replace(engine.config.spec, speculate=0))
    assert engine.res.proposer is None and engine.res.policy is None
    run_all(engine, LOOPY[:1], greedy(20))
    assert engine.stats.proposer.drafted_tokens == drafted
    gated = SpecConfig(speculate=3, proposer="ngram", max_batch=0)
    engine.set_speculation(gated)
    run_all(engine, LOOPY[:1], greedy(20))
    assert engine.stats.proposer.drafted_tokens == drafted
    assert engine.res.policy is not None and engine.res.policy.stats.gated["max_batch"] > 0


def test_a_proposer_that_needs_loading_is_refused(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=2, proposer="ngram")
    before = engine.res.proposer
    with pytest.raises(ValueError, match="restart"):
        engine.set_speculation(SpecConfig(speculate=2, proposer="draft", draft_model="x"))
    assert engine.res.proposer is before and engine.config.spec.proposer == "ngram"
