"""Speculation in the engine on a tiny random model: losslessness, edge cases, gates, KV."""

from __future__ import annotations

from pathlib import Path

import pytest

from specserve.request import SamplingParams
from tests.engine.helpers import assert_no_kv_held, make_engine, mixed_prompts, run_all

# Repetitive prompts give the n-gram lookup something to find; the tiny model loops a lot too.
LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 15, 16, 12, 13]]


def greedy(n: int = 30, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [1, 3, 5])
def test_ngram_greedy_lossless_alone_and_mixed(tiny_llama: Path, n: int) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=4)
    want = run_all(make_engine(tiny_llama), prompts, greedy())
    for p, w in zip(prompts, want, strict=True):
        assert run_all(make_engine(tiny_llama, speculate=n), [p], greedy())[0] == w
    caps = [None, 0, 2, None, 0, 1, None, 0]
    params = [greedy(speculate=c) for c in caps]
    engine = make_engine(tiny_llama, speculate=n)
    assert run_all(engine, prompts, params) == want
    assert engine.stats.proposer.accepted_tokens > 0
    assert_no_kv_held(engine)


def test_lossless_under_preemption(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=5)
    want = run_all(make_engine(tiny_llama), prompts, greedy(40))
    engine = make_engine(tiny_llama, num_blocks=30, speculate=4)
    assert run_all(engine, prompts, greedy(40)) == want
    assert engine.scheduler.num_preemptions > 0
    assert_no_kv_held(engine)


@pytest.mark.parametrize("proposer", ["ngram", "suffix"])
def test_seeded_sampling_lossless(tiny_llama: Path, proposer: str) -> None:
    params = [
        SamplingParams(max_new_tokens=30, temperature=1.2, seed=s, ignore_eos=True)
        for s in range(3)
    ]
    want = run_all(make_engine(tiny_llama), LOOPY, params)
    # static: every draft verified, so that some are rejected (adaptive learns to stop drafting)
    engine = make_engine(tiny_llama, speculate=4, proposer=proposer, policy="static")
    assert run_all(engine, LOOPY, params) == want
    assert run_all(engine, LOOPY, params) == want  # again: the suffix index holds the first pass
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # drafts landed, and some did not


def test_n_larger_than_tokens_left(tiny_llama: Path) -> None:
    want = run_all(make_engine(tiny_llama), LOOPY, greedy(3))
    engine = make_engine(tiny_llama, speculate=8)
    got = run_all(engine, LOOPY, greedy(3))
    assert got == want and all(len(g) == 3 for g in got)
    assert_no_kv_held(engine)


def test_draft_crossing_eos_and_stop(tiny_llama: Path) -> None:
    base = run_all(make_engine(tiny_llama), LOOPY, greedy(30))
    # Treat the 6th generated token of the first prompt as EOS: drafts past it must be dropped.
    eos = base[0][5]
    for speculate in (0, 5):
        engine = make_engine(tiny_llama, speculate=speculate, eos_ids=frozenset({eos}))
        out = run_all(engine, LOOPY[:1], SamplingParams(max_new_tokens=30))[0]
        assert out == base[0][: base[0].index(eos) + 1]
        assert_no_kv_held(engine)
    texts = []
    for speculate in (0, 5):
        engine = make_engine(tiny_llama, speculate=speculate)
        tok = engine.tokenizer
        stop = tok.decode(base[0][6:8])
        assert stop
        engine.add_request(LOOPY[0], SamplingParams(max_new_tokens=30, stop=(stop,)))
        text = ""
        while engine.has_work():
            text += "".join(o.new_text for o in engine.step())
        texts.append(text)
        assert stop not in text
        assert_no_kv_held(engine)
    assert texts[0] == texts[1]


def test_draft_at_context_window_end(tiny_llama: Path) -> None:
    prompt = (LOOPY[0] * 60)[:505]  # context window is 512
    want = run_all(make_engine(tiny_llama, num_blocks=300), [prompt], greedy(30))[0]
    engine = make_engine(tiny_llama, num_blocks=300, speculate=5)
    got = run_all(engine, [prompt], greedy(30))[0]
    assert got == want and len(got) == 512 - 505
    assert_no_kv_held(engine)


def test_abort_during_speculation(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, speculate=4, policy="static")  # proposes every step
    rid = engine.add_request(LOOPY[0], greedy(60))
    while not (engine.last_step and engine.last_step.drafts_proposed):
        engine.step()
    assert engine.abort(rid)
    outs = engine.step()
    assert [o.finish_reason for o in outs] == ["abort"]
    assert_no_kv_held(engine)


def test_zero_drafts_everywhere(tiny_llama: Path) -> None:
    # ngram_min above the context length: the lookup can never match.
    prompts = mixed_prompts(4, seed=6)
    want = run_all(make_engine(tiny_llama), prompts, greedy(10))
    engine = make_engine(tiny_llama, speculate=4, ngram_min=64, ngram_max=64)
    assert run_all(engine, prompts, greedy(10)) == want
    assert engine.stats.proposer.drafted_tokens == 0
    assert engine.stats.spec_steps == 0


def test_static_gate_respected_on_step_records(tiny_llama: Path) -> None:
    # static: wherever the gate is open, drafts are reserved (adaptive ones follow timings)
    engine = make_engine(tiny_llama, speculate=4, max_batch=2, max_tokens=12, policy="static")
    for i, p in enumerate(LOOPY + mixed_prompts(3, seed=7)):
        engine.add_request(p, greedy(40 if i < 2 else 8))  # two outlive the rest
    seen_gated = seen_open = False
    while engine.has_work():
        engine.step()
        rec = engine.last_step
        if rec is None:
            continue
        if rec.num_running > 2:
            assert not rec.drafts_reserved
            seen_gated = True
        if rec.drafts_reserved:
            assert rec.num_running <= 2 and rec.num_tokens <= 12
            seen_open = True
    assert seen_gated and seen_open
    assert engine.res.policy is not None and engine.res.policy.stats.gated


def test_adaptive_policy_is_lossless(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(3, seed=8)
    want = run_all(make_engine(tiny_llama), prompts, greedy())
    engine = make_engine(tiny_llama, speculate=4, policy="adaptive")
    assert run_all(engine, prompts, greedy()) == want
    assert engine.res.policy is not None and engine.res.policy.cost is not None
    assert_no_kv_held(engine)
