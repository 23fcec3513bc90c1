"""Prefix caching in the engine: outputs identical with it on and off (greedy and seeded, with
and without speculation, under preemption and eviction), hits where prompts share a prefix, and
no block leaked or freed twice whatever ends a sharer."""

from __future__ import annotations

import random
from collections import abc
from pathlib import Path

import pytest
import torch

from specserve.engine.engine import Engine
from specserve.request import SamplingParams
from tests.engine.helpers import assert_no_kv_held, make_engine, run_all
from tests.tiny import noisy_copy

DOC = [random.Random(7).randrange(3, 320) for _ in range(37)]  # a shared "document"
# Questions over the document, and a second turn that resends a first turn's prompt.
WAVE_1 = [[*DOC, 11, 12, 13], [*DOC, 21, 22], [5, 6, 7, 8, 5, 6, 7, 8, 5]]
TAIL = [40, 41, 42]


def greedy(n: int = 24, **kw: object) -> SamplingParams:
    return SamplingParams(max_new_tokens=n, ignore_eos=True, **kw)  # type: ignore[arg-type]


def two_waves(engine: Engine, params: SamplingParams) -> list[list[int]]:
    """Wave 1, then wave 2 on the same engine: more questions over DOC and second turns whose
    prompts are a first turn's prompt + its output + more."""
    first = run_all(engine, WAVE_1, params)
    wave_2 = [[*DOC, 31], [*DOC, 32, 33, 34]] + [
        p + out + TAIL for p, out in zip(WAVE_1, first, strict=True)
    ]
    return first + run_all(engine, wave_2, params)


@pytest.fixture(scope="module")
def draft_dir(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return noisy_copy(tiny_llama, tmp_path_factory.mktemp("draft"))


# Seeded sampling is bit-identical where drafts are deterministic; a draft model's sampled
# drafts keep only the distribution (rejection sampling: a cached prefix computes the prompt's
# last rows in a shorter pass, and float32 rounding may then tip an acceptance test).
@pytest.mark.parametrize(
    ("proposer", "sampled"),
    [(None, False), (None, True), ("ngram", False), ("ngram", True), ("draft", False)],
)
def test_outputs_identical_with_prefix_caching_on_and_off(
    tiny_llama: Path, draft_dir: Path, proposer: str | None, sampled: bool
) -> None:
    def build(prefix_caching: bool) -> Engine:
        if proposer is None:
            return make_engine(tiny_llama, prefix_caching=prefix_caching)
        draft_model = str(draft_dir) if proposer == "draft" else None
        return make_engine(
            tiny_llama,
            prefix_caching=prefix_caching,
            speculate=3,
            proposer=proposer,
            draft_model=draft_model,
        )

    params = greedy(temperature=1.2, seed=5) if sampled else greedy()
    want = two_waves(build(prefix_caching=False), params)
    engine = build(prefix_caching=True)
    assert two_waves(engine, params) == want
    stats = engine.res.allocator.stats
    # DOC's 9 full blocks for 2 questions, and each second turn's first-turn blocks at least.
    assert stats.hit_tokens >= 2 * 36 + 3 * 8, stats
    if proposer is not None:
        spec = engine.stats.proposer
        assert spec.drafted_tokens > spec.accepted_tokens > 0  # drafted, some rejected
    assert_no_kv_held(engine)


def test_identical_under_preemption_and_eviction(tiny_llama: Path) -> None:
    prompts = [[*DOC, i, i + 1] for i in range(3, 9)]
    want = run_all(make_engine(tiny_llama, num_blocks=256, prefix_caching=False), prompts,
                   greedy(40))  # fmt: skip
    engine = make_engine(tiny_llama, num_blocks=48, speculate=2)
    assert run_all(engine, prompts, greedy(40)) == want
    assert run_all(engine, prompts[::-1], greedy(40)) == want[::-1]  # again: hits, evictions
    assert engine.scheduler.num_preemptions > 0
    assert engine.res.allocator.stats.evicted_blocks > 0
    assert engine.res.allocator.stats.hit_tokens > 0
    assert_no_kv_held(engine)


def test_a_hash_collision_changes_no_output(tiny_llama: Path) -> None:
    want = two_waves(make_engine(tiny_llama, prefix_caching=False), greedy())
    engine = make_engine(tiny_llama)
    engine.res.allocator.hash_fn = lambda parent, tokens: 1  # every block's key collides
    assert two_waves(engine, greedy()) == want
    assert_no_kv_held(engine)


class FailWhenArmed:
    """A logits processor that raises once `armed`: its request fails, alone (verification)."""

    armed = False

    def __call__(self, ids: abc.Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        if self.armed:
            raise RuntimeError("injected")
        return logits


@pytest.mark.parametrize("how", ["abort", "error"])
def test_ending_one_sharer_leaves_the_other_intact(tiny_llama: Path, how: str) -> None:
    prompts = [[*DOC, 50], [*DOC, 60]]
    want = run_all(make_engine(tiny_llama, prefix_caching=False), prompts[1:], greedy(30))
    engine = make_engine(tiny_llama)
    run_all(engine, [[*DOC, 70]], greedy(4))  # DOC's blocks are now cached
    fail = FailWhenArmed()
    ids = [engine.add_request(prompts[0], greedy(30), logits_processors=(fail,))]
    ids.append(engine.add_request(prompts[1], greedy(30)))
    out: list[int] = []
    ended: str | None = None
    for step in range(40):
        for o in engine.step():
            if o.request_id == ids[1]:
                out += o.new_token_ids
            elif o.finished:
                ended = o.error
        if step == 3:
            seqs = {s.request_id: s for s in engine.scheduler.running}
            shared = seqs[ids[0]].block_table[:9]
            assert shared == seqs[ids[1]].block_table[:9]  # really shared
            if how == "abort":
                engine.abort(ids[0])
            else:
                fail.armed = True  # its next row raises
        if not engine.has_work():
            break
    assert out == want[0]
    assert how == "abort" or "injected" in (ended or "")
    assert_no_kv_held(engine)


def test_a_preempted_sequence_recomputes_only_what_was_evicted(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama, num_blocks=40)
    prompts = [[*DOC, i] for i in range(3, 7)]
    want = run_all(make_engine(tiny_llama, num_blocks=256, prefix_caching=False), prompts,
                   greedy(60))  # fmt: skip
    assert run_all(engine, prompts, greedy(60)) == want
    stats = engine.res.allocator.stats
    assert engine.scheduler.num_preemptions > 0
    # Every admission after the first reused DOC's blocks, re-admissions included.
    assert stats.hit_tokens >= (len(prompts) - 1) * 36
    assert_no_kv_held(engine)


def test_prompt_logprobs_requests_skip_the_cache(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama)
    run_all(engine, [[*DOC, 1]], greedy(4))
    before = engine.res.allocator.stats.hit_tokens
    run_all(engine, [[*DOC, 2]], greedy(4, prompt_logprobs=True))
    assert engine.res.allocator.stats.hit_tokens == before
    run_all(engine, [[*DOC, 3]], greedy(4))
    assert engine.res.allocator.stats.hit_tokens == before + 36


def test_only_committed_tokens_enter_the_cache(tiny_llama: Path) -> None:
    """A speculates and ends with its last token closing a block: that position's KV was
    never computed (rejected drafts' K/V may sit there), so the block must not be cached. B's
    prompt starts with all of A's tokens: it may reuse A's blocks, but not that one."""
    a_prompt = [12, 13, 14, 15, 16, 12, 13]
    engine = make_engine(tiny_llama, speculate=3)
    [a_out] = run_all(engine, [a_prompt], greedy(25))  # 32 tokens: 8 full blocks of 4
    assert engine.stats.proposer.drafted_tokens > engine.stats.proposer.accepted_tokens > 0
    b_prompt = a_prompt + a_out + [30, 31, 32, 33, 34]
    want = run_all(make_engine(tiny_llama, prefix_caching=False), [b_prompt], greedy(20))
    assert run_all(engine, [b_prompt], greedy(20)) == want
    assert engine.res.allocator.stats.hit_tokens == 7 * 4  # 7 blocks, not the 8th
    assert_no_kv_held(engine)


def test_a_cache_salt_reuses_only_its_own_prefixes_and_changes_no_output(tiny_llama: Path) -> None:
    engine = make_engine(tiny_llama)
    want = run_all(make_engine(tiny_llama, prefix_caching=False), [[*DOC, 1]], greedy(8))
    stats = engine.res.allocator.stats
    assert run_all(engine, [[*DOC, 1]], greedy(8, cache_salt="a")) == want
    assert run_all(engine, [[*DOC, 1]], greedy(8, cache_salt="b")) == want
    assert run_all(engine, [[*DOC, 1]], greedy(8)) == want
    assert stats.hit_tokens == 0  # three namespaces, nothing shared between them
    assert run_all(engine, [[*DOC, 2]], greedy(8, cache_salt="a")) != []
    assert stats.hit_tokens == 36  # the same salt's DOC blocks
    assert_no_kv_held(engine)
