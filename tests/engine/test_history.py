"""A scored row's history as a view (issue 54, item 5): with a grammar or a repetition penalty,
every row copied prompt + output, the grammar compared its whole consumed output token by token
and the penalty built a sorted set of the history: per-row work that grew with the context, on
the engine's thread. `History` copies nothing; the grammar compares only what followed its last
row; the penalty's distinct tokens are kept as the sequence grows. Same masks, same logits."""

from __future__ import annotations

import random
import tracemalloc
from pathlib import Path

import pytest
import torch

from specserve.engine.plan import SeqPlan, StepPlan
from specserve.engine.verification import sample_rows
from specserve.grammar import Grammars
from specserve.models.tokenizer import load_tokenizer
from specserve.request import GrammarSpec, History, SamplingParams, Sequence
from specserve.runner.sampler import apply_repetition_penalty, pick_tokens
from specserve.scheduler.batch import SeqWork
from specserve.speculation.proposer import Draft

DIGITS = GrammarSpec("regex", "[0-9]*")


@pytest.fixture(scope="module")
def grammars(tiny_llama: Path) -> Grammars:
    tok = load_tokenizer(tiny_llama)
    return Grammars(tok, len(tok), frozenset({tok.convert_tokens_to_ids("<|im_end|>")}))


def digit_ids(grammars: Grammars) -> list[int]:
    ids = [grammars._hf.convert_tokens_to_ids(str(d)) for d in range(10)]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    return ids


def test_a_history_reads_as_its_token_list() -> None:
    rng = random.Random(0)
    seq = Sequence(0, "r", [rng.randrange(50) for _ in range(30)], SamplingParams())
    for _ in range(20):
        seq.output_ids += [rng.randrange(80) for _ in range(rng.randrange(3))]
        drafts = [rng.randrange(100) for _ in range(rng.randrange(4))]
        view, tokens = History(seq, drafts), seq.token_ids + drafts
        assert len(view) == len(tokens) and list(view) == tokens
        assert [view[i] for i in (0, -1, len(tokens) // 2)] == [
            tokens[i] for i in (0, -1, len(tokens) // 2)
        ]
        for s in (slice(5, None), slice(28, len(tokens) - 1), slice(len(tokens) - 2, None)):
            assert view[s] == tokens[s]
        assert sorted(view.seen_ids().tolist()) == sorted(set(tokens))


def test_the_penalty_on_a_history_is_the_penalty_on_its_tokens() -> None:
    rng = random.Random(1)
    seq = Sequence(0, "r", [rng.randrange(300) for _ in range(200)], SamplingParams())
    for _ in range(10):
        seq.output_ids += [rng.randrange(400) for _ in range(5)]
        drafts = [rng.randrange(500) for _ in range(3)]
        logits = torch.randn(500)
        on_view, on_list = logits.clone(), logits.clone()
        apply_repetition_penalty(on_view, History(seq, drafts), 1.3)
        apply_repetition_penalty(on_list, seq.token_ids + drafts, 1.3)
        assert torch.equal(on_view, on_list)


def allowed(row: torch.Tensor) -> set[int]:
    return set(torch.isfinite(row).nonzero().flatten().tolist())


def test_the_grammar_on_histories_masks_as_on_lists(grammars: Grammars) -> None:
    """Committed output grows, drafts are accepted, rejected or forbidden (a letter), and the
    forced text is asked for between rows: every mask equals a list-fed processor's."""
    rng = random.Random(2)
    digits, letter = digit_ids(grammars), grammars._hf.convert_tokens_to_ids("x")
    spec = grammars.compile(DIGITS)
    prompt = [5, 6, 7]
    seq = Sequence(0, "r", prompt, SamplingParams(grammar=spec))
    on_view, on_list = grammars.processor(spec, 3), grammars.processor(spec, 3)
    vocab = grammars.vocab_size
    for _ in range(40):
        drafts = [rng.choice([*digits, letter]) for _ in range(rng.randrange(4))]
        for i in range(len(drafts) + 1):
            view = on_view(History(seq, drafts[:i]), torch.zeros(vocab))
            want = on_list(seq.token_ids + drafts[:i], torch.zeros(vocab))
            assert allowed(view) == allowed(want)
        assert on_view.forced(seq.output_ids, 4) == on_list.forced(list(seq.output_ids), 4)
        seq.output_ids += [rng.choice(digits) for _ in range(rng.randrange(1, 3))]


def test_a_rows_work_does_not_copy_the_context(grammars: Grammars) -> None:
    """One verify step of four rows (three drafts) under a grammar and a penalty, after a
    20,000-token prompt and 2,000 output tokens: what Python allocates for it stays far below
    one copy of the context (~180 KB)."""
    digits = digit_ids(grammars)
    spec = grammars.compile(DIGITS)
    prompt = [i % 300 for i in range(20_000)]
    params = SamplingParams(repetition_penalty=1.2, grammar=spec)
    seq = Sequence(0, "r", prompt, params)
    seq.logits_processors = (grammars.processor(spec, len(prompt)),)
    vocab = grammars.vocab_size
    logits = torch.randn(4, vocab)

    def step() -> list[int]:
        drafts = [digits[(len(seq.output_ids) + j) % 10] for j in range(3)]
        work = SeqWork(seq, 1, True, max_drafts=3)
        plan = SeqPlan(work, 3, None, Draft(drafts), slice(0, 4), slice(0, 0))
        return pick_tokens(logits, sample_rows(StepPlan(1, [plan])))

    for _ in range(1000):  # 2,000 output tokens, two a step
        step()
        seq.output_ids += [digits[len(seq.output_ids) % 10], digits[(len(seq.output_ids) + 1) % 10]]
    tracemalloc.start()
    try:
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 40_000, f"a step allocated {peak} bytes"
