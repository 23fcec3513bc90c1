"""Each family through the engine on a tiny random model of it: greedy output bit-identical with
speculation on and off (n-gram drafts, and a draft model of the same family), drafts both
accepted and rejected; chat prompts through the checkpoint's own tokenizer and template.

tests/tiny.py gives every family the same small ChatML tokenizer: what shows here is that a
family's checkpoint brings its tokenizer and template, not any family's own template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specserve.request import SamplingParams
from tests.engine.helpers import assert_no_kv_held, make_engine, mixed_prompts, run_all
from tests.models.test_families import LLAMA3_ROPE
from tests.tiny import make_model_dir, noisy_copy

LOOPY = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 15, 16, 12, 13]]
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3": ("llama", {"rope_parameters": {"rope_theta": 10000.0, **LLAMA3_ROPE}}),
    "qwen3": ("qwen3", {}),
    "gemma3": ("gemma3", {}),  # window 8: every request here runs past it
    "phi3": ("phi3", {}),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    arch, config = FAMILIES[request.param]
    return make_model_dir(tmp_path_factory.mktemp(request.param), arch, config=config)


def greedy(n: int = 24) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True)


def test_greedy_speculation_on_off_bit_identical(family_dir: Path) -> None:
    prompts = LOOPY + mixed_prompts(3, seed=4)
    want = run_all(make_engine(family_dir), prompts, greedy())
    engine = make_engine(family_dir, speculate=3, proposer="ngram", policy="static")
    assert run_all(engine, prompts, greedy()) == want
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens  # drafts kept and drafts rejected
    assert_no_kv_held(engine)


def test_draft_model_of_the_family_is_lossless(family_dir: Path, tmp_path: Path) -> None:
    draft = noisy_copy(family_dir, tmp_path / "draft", noise=0.3)
    prompts = LOOPY[:2] + mixed_prompts(2, seed=6)
    want = run_all(make_engine(family_dir), prompts, greedy(16))
    # static: every draft verified whole (the adaptive default may keep none of a draft)
    engine = make_engine(
        family_dir, speculate=3, proposer="draft", draft_model=str(draft), policy="static"
    )
    assert run_all(engine, prompts, greedy(16)) == want
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens
    assert_no_kv_held(engine)


def test_chat_through_the_checkpoints_tokenizer(family_dir: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(family_dir))
    messages = [{"role": "user", "content": "def add(a, b):"}]
    engine = make_engine(family_dir)
    ids = engine.encode_chat(messages)
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert ids[0] == start and ids.count(start) == 2  # special tokens as one id each
    out = run_all(engine, [ids], greedy(8))[0]
    assert len(out) == 8 and all(0 <= t < 320 for t in out)


def test_draft_model_of_another_family_is_lossless(tmp_path: Path) -> None:
    """Any pair sharing a tokenizer: a Gemma 3 target, a Qwen3 draft."""
    target = make_model_dir(tmp_path / "target", "gemma3")
    draft = make_model_dir(tmp_path / "draft", "qwen3", seed=1)
    prompts = LOOPY[:1] + mixed_prompts(1, seed=7)
    want = run_all(make_engine(target), prompts, greedy(12))
    engine = make_engine(target, speculate=3, proposer="draft", draft_model=str(draft))
    assert run_all(engine, prompts, greedy(12)) == want
    assert engine.stats.proposer.drafted_tokens > 0
    assert_no_kv_held(engine)
