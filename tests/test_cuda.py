"""The CPU suites' key checks on a GPU: HF parity, lossless speculation (n-gram, draft model,
EAGLE head, hybrid), KV accounting, seeds.

Every test skips when `torch.cuda.is_available()` is False. SPECSERVE_TEST_DEVICE names another
device (`cpu` runs the same checks on the CPU, to check the tests themselves).
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.random_model import SHAPES, write_random_model
from specserve.engine.engine import Engine
from specserve.models.registry import build_model
from specserve.request import SamplingParams
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.speculation.draft import DraftModelProposer
from specserve.speculation.eagle_head import (
    EagleConfig,
    EagleHead,
    HeadShape,
    fingerprint,
    save_eagle,
)
from specserve.speculation.eagle_proposer import EagleProposer
from specserve.speculation.hybrid import HybridProposer
from tests.engine.helpers import make_engine, mixed_prompts
from tests.engine.test_speculation import LOOPY, greedy
from tests.models.test_parity import assert_matches_hf
from tests.speculation.test_draft import GREEDY, mixed_params
from tests.tiny import make_model_dir, noisy_copy

DEVICE = os.environ.get("SPECSERVE_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    torch.device(DEVICE).type == "cuda" and not torch.cuda.is_available(),
    reason="needs a CUDA device: torch.cuda.is_available() is False "
    "(SPECSERVE_TEST_DEVICE=cpu runs these checks on the CPU)",
)
DEV = torch.device(DEVICE)


# ----------------------------------------------------------------------------- helpers
def engine_on_device(model_dir: Path, **kw: object) -> Engine:
    engine = make_engine(model_dir, device=DEVICE, **kw)  # type: ignore[arg-type]
    assert engine.res.runner.kv.device.type == DEV.type
    assert next(engine.res.model.parameters()).device.type == DEV.type
    return engine


def generate(
    engine: Engine, prompts: list[list[int]], params: SamplingParams | list[SamplingParams]
) -> list[list[int]]:
    """`run_all`, failing with the engine's own error when a request ends in 'error'."""
    plist = params if isinstance(params, list) else [params] * len(prompts)
    ids = [engine.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    ends: dict[str, tuple[str | None, str | None]] = {}
    while engine.has_work():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            if out.finished:
                ends[out.request_id] = (out.finish_reason, out.error)
    errors = [err for reason, err in ends.values() if reason == "error"]
    assert not errors, f"{len(errors)} requests failed on {DEVICE}: {errors[0]}"
    assert set(ends) == set(ids)
    return [tokens[i] for i in ids]


def assert_all_free(engine: Engine) -> None:
    assert not engine.has_work()
    assert engine.res.allocator.num_free == engine.res.allocator.num_blocks
    proposer = engine.res.proposer
    if isinstance(proposer, DraftModelProposer):
        assert proposer.num_free_blocks == proposer.num_blocks


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/speculation/test_draft.py's target: varied text, so drafts are sometimes wrong."""
    return make_model_dir(tmp_path_factory.mktemp("cuda-target-qwen2"), "qwen2", seed=0)


@pytest.fixture(scope="module")
def noisy_draft(target_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The target with 10% noise on its matrices: agrees often, not always."""
    out = tmp_path_factory.mktemp("cuda-draft-noisy")
    return noisy_copy(target_dir, out)


# ------------------------------------------------------------------------- HF parity
@pytest.mark.parametrize(
    ("arch", "tied"), [("llama", False), ("llama", True), ("qwen2", False), ("mistral", False)]
)
def test_logits_match_hf(arch: str, tied: bool, tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, arch, with_tokenizer=False, seed=3, tied=tied)
    table = [5, 2, 9, 0, 7, 11, 3, 1, 4, 6, 8, 10]  # scattered blocks on purpose
    assert_matches_hf(model_dir, 320, table, block_size=4, device=DEV)


def test_logits_match_hf_at_smollm2_shape(tmp_path: Path) -> None:
    """30 layers, 9 query heads over 3 KV heads, tied 49k vocab: random weights, real shapes."""
    model_dir = write_random_model(SHAPES["smollm2-135m"], tmp_path, dtype=torch.float32)
    assert_matches_hf(model_dir, 49152, [3, 0, 2], block_size=16, device=DEV)


def test_ragged_batch_matches_single_sequences(tiny_llama: Path) -> None:
    model = build_model(tiny_llama, DEV)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 320, (n,), generator=g).tolist() for n in (9, 1, 14)]
    tables = [[0, 1, 2], [3], [4, 5, 6, 7]]
    alone = []
    for ids, table in zip(seqs, tables, strict=True):
        runner = ModelRunner(model, num_blocks=8, block_size=4, device=DEV)
        alone.append(runner.run([RunItem(ids, 0, table, num_logits=len(ids))]).logits)
    runner = ModelRunner(model, num_blocks=8, block_size=4, device=DEV)
    items = [RunItem(ids, 0, t, num_logits=len(ids)) for ids, t in zip(seqs, tables, strict=True)]
    together = runner.run(items).logits
    torch.testing.assert_close(together, torch.cat(alone), atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------- greedy losslessness
@pytest.mark.parametrize("n", [1, 4])
def test_ngram_greedy_lossless_mixed_batch(tiny_llama: Path, n: int) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=4)
    want = generate(engine_on_device(tiny_llama), prompts, greedy())
    assert generate(engine_on_device(tiny_llama, speculate=n), prompts[:1], greedy()) == want[:1]
    caps = [None, 0, 2, None, 0, 1, None, 0]  # per-request speculate caps
    engine = engine_on_device(tiny_llama, speculate=n)
    assert generate(engine, prompts, [greedy(speculate=c) for c in caps]) == want
    assert engine.stats.proposer.accepted_tokens > 0 and engine.stats.spec_steps > 0
    assert_all_free(engine)


def test_ngram_greedy_lossless_under_preemption(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=5)
    want = generate(engine_on_device(tiny_llama), prompts, greedy(40))
    engine = engine_on_device(tiny_llama, num_blocks=30, speculate=4)
    assert generate(engine, prompts, greedy(40)) == want
    assert engine.scheduler.num_preemptions > 0
    assert_all_free(engine)


def test_greedy_outputs_equal_the_cpu_engines(target_dir: Path) -> None:
    prompts = mixed_prompts(8, seed=6)
    on_cpu = generate(make_engine(target_dir), prompts, mixed_params())
    assert generate(engine_on_device(target_dir), prompts, mixed_params()) == on_cpu


@pytest.mark.parametrize("draft_kind", ["target", "noisy"])
def test_draft_greedy_lossless_mixed_batch(
    request: pytest.FixtureRequest, target_dir: Path, draft_kind: str
) -> None:
    draft = target_dir if draft_kind == "target" else request.getfixturevalue("noisy_draft")
    prompts, params = mixed_prompts(8, seed=6), mixed_params()
    want = generate(engine_on_device(target_dir), prompts, params)
    engine = engine_on_device(target_dir, speculate=3, proposer="draft", draft_model=str(draft))
    assert isinstance(engine.res.proposer, DraftModelProposer)
    assert engine.res.proposer.runner.kv.device.type == DEV.type
    assert generate(engine, prompts, params) == want
    assert_all_free(engine)
    stats = engine.stats.proposer
    if draft_kind == "target":  # the target drafting for itself is always right
        assert stats.accepted_tokens == stats.drafted_tokens > 0
    else:  # partial acceptance: accepts, rejects and draft-KV rollbacks
        assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_draft_greedy_lossless_under_preemption(target_dir: Path, noisy_draft: Path) -> None:
    prompts = mixed_prompts(8, seed=1)
    want = generate(engine_on_device(target_dir, num_blocks=24), prompts, GREEDY)
    engine = engine_on_device(
        target_dir, num_blocks=24, speculate=3, proposer="draft", draft_model=str(noisy_draft)
    )
    assert generate(engine, prompts, GREEDY) == want
    assert engine.scheduler.num_preemptions > 0
    assert_all_free(engine)


# ------------------------------------------------------------------- EAGLE head, hybrid
@pytest.fixture(scope="module")
def eagle_dir(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random EAGLE head for tiny_llama: its drafts are mostly wrong, which is the point
    here (losslessness where drafts are rejected). Its MLP width (48) is no multiple of the
    block kernels' 32, so on the CPU too it drafts through the torch path the GPU takes."""
    base = build_model(tiny_llama, torch.device("cpu"))
    shape = HeadShape.for_target(base.arch, 48, 16)
    torch.manual_seed(0)
    head = EagleHead(shape)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    head.draft_vocab = torch.arange(base.arch.vocab_size)
    out = tmp_path_factory.mktemp("cuda-eagle") / "head"
    save_eagle(head, out, EagleConfig(shape, "tiny", fingerprint(tiny_llama)))
    return out


def eagle_engine(model_dir: Path, head_dir: Path, proposer: str) -> tuple[Engine, EagleProposer]:
    engine = engine_on_device(model_dir, speculate=4, proposer=proposer, eagle=str(head_dir))
    live = engine.res.proposer
    head = live.head if isinstance(live, HybridProposer) else live
    assert isinstance(head, EagleProposer)
    return engine, head


def assert_head_on_device(head: EagleProposer) -> None:
    """The head drafts where the target runs, through torch (the native layer is CPU-only)."""
    assert head.native is None and head.vocab.device.type == DEV.type
    assert all(p.device.type == DEV.type for p in head.head.parameters())


@pytest.mark.parametrize("proposer", ["eagle", "hybrid"])
def test_eagle_greedy_lossless_mixed_batch(
    tiny_llama: Path, eagle_dir: Path, proposer: str
) -> None:
    prompts = LOOPY + mixed_prompts(5, seed=4)
    want = generate(engine_on_device(tiny_llama), prompts, greedy())
    engine, head = eagle_engine(tiny_llama, eagle_dir, proposer)
    assert generate(engine, prompts, greedy()) == want
    assert_head_on_device(head)
    stats = engine.stats.proposer
    assert stats.drafted_tokens > stats.accepted_tokens  # drafted, and drafts were rejected
    if isinstance(engine.res.proposer, HybridProposer):
        assert stats.accepted_tokens > 0  # the lookup's, on the looping prompts
        assert engine.res.proposer.chosen["head"] > 0  # and the head served drafts too
    assert not head._states  # every finished sequence let its drafting state go
    assert_all_free(engine)


def test_eagle_seeded_sampling_identical_with_and_without_it(
    tiny_llama: Path, eagle_dir: Path
) -> None:
    """Sampled requests draft the engine sampler's pick from the head's logits (on the device
    the head runs on)."""
    prompts = LOOPY + mixed_prompts(3, seed=10)
    params = [
        SamplingParams(max_new_tokens=30, temperature=1.5, seed=s, ignore_eos=True)
        for s in range(len(prompts))
    ]
    params[1] = replace(params[1], top_p=0.9, top_k=40)
    want = generate(engine_on_device(tiny_llama), prompts, params)
    engine, head = eagle_engine(tiny_llama, eagle_dir, "hybrid")
    assert generate(engine, prompts, params) == want
    assert_head_on_device(head)
    assert engine.stats.proposer.drafted_tokens > 0
    assert isinstance(engine.res.proposer, HybridProposer)
    assert engine.res.proposer.chosen["head"] > 0
    assert_all_free(engine)


# ------------------------------------------------------------------------ KV on abort
@pytest.mark.parametrize("proposer", ["ngram", "draft"])
def test_every_block_freed_after_abort(target_dir: Path, noisy_draft: Path, proposer: str) -> None:
    draft = {"draft_model": str(noisy_draft)} if proposer == "draft" else {}
    engine = engine_on_device(target_dir, speculate=4, proposer=proposer, **draft)
    prompts = LOOPY + mixed_prompts(3, seed=9)
    ids = [engine.add_request(p, greedy(60)) for p in prompts]
    for _ in range(20):
        engine.step()
        if engine.last_step and engine.last_step.drafts_proposed:
            break
    assert engine.last_step and engine.last_step.drafts_proposed, "no step speculated"
    assert engine.res.allocator.num_free < engine.res.allocator.num_blocks
    assert engine.abort(ids[0])  # mid-speculation: drafts were just verified
    ended = {o.request_id: o.finish_reason for o in engine.step() if o.finished}
    assert ended.get(ids[0]) == "abort"
    for _ in range(3):
        engine.step()
    for rid in ids[1:]:
        assert engine.abort(rid)
    while engine.has_work():
        ended |= {o.request_id: o.finish_reason for o in engine.step() if o.finished}
    assert ended == dict.fromkeys(ids, "abort")
    assert not engine.abort(ids[0])  # already gone
    assert_all_free(engine)


# ------------------------------------------------------------------------ seeded sampling
def test_seeded_sampling_identical_with_and_without_ngram_speculation(tiny_llama: Path) -> None:
    prompts = LOOPY + mixed_prompts(3, seed=10)
    params = [
        SamplingParams(max_new_tokens=30, temperature=1.5, seed=s, ignore_eos=True)
        for s in range(len(prompts))
    ]
    params[1] = replace(params[1], top_p=0.9, top_k=40)
    params[4] = replace(params[4], repetition_penalty=1.3)
    want = generate(engine_on_device(tiny_llama), prompts, params)
    assert all(len(w) == 30 for w in want)
    engine = engine_on_device(tiny_llama, speculate=4)
    assert generate(engine, prompts, params) == want
    assert engine.stats.proposer.drafted_tokens > 0
    assert_all_free(engine)
    other = [replace(p, seed=(p.seed or 0) + 100) for p in params]
    assert generate(engine_on_device(tiny_llama), prompts, other) != want  # seeds matter


def test_draft_sampling_reproducible_in_any_order(target_dir: Path, noisy_draft: Path) -> None:
    """Rejection sampling: a pure function of each request's seed and positions."""
    prompts = mixed_prompts(6, seed=7)
    params = [
        SamplingParams(max_new_tokens=20, temperature=1.0, top_p=0.9, seed=i, ignore_eos=True)
        for i in range(6)
    ]
    params[2] = replace(params[2], speculate=0)

    def engine() -> Engine:  # enough blocks that every step grants the same k in any order
        kw = {"speculate": 3, "proposer": "draft", "draft_model": str(noisy_draft)}
        return engine_on_device(target_dir, num_blocks=160, **kw)

    first = engine()
    out = generate(first, prompts, params)
    assert all(len(o) == 20 for o in out)
    assert generate(engine(), prompts[::-1], params[::-1]) == out[::-1]
    assert_all_free(first)
    stats = first.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens


def test_max_memory_fraction_sizes_the_kv_pool_from_free_device_memory(tiny_llama: Path) -> None:
    from specserve.config import CacheConfig, EngineConfig, SchedulerConfig
    from specserve.engine.memory import free_memory

    free_before = free_memory(DEV)
    engine = Engine(
        EngineConfig(
            model=str(tiny_llama),
            device=DEVICE,
            max_memory="0.01",
            cache=CacheConfig(block_size=4),
            scheduler=SchedulerConfig(max_batch_tokens=256),
        )
    )
    budget = engine.res.memory
    assert budget is not None
    assert 0.005 * free_before < budget.max_memory <= 0.01 * free_before
    assert engine.res.runner.kv_bytes <= budget.free_for_kv
    assert engine.res.runner.kv.device.type == DEV.type
    prompts = mixed_prompts(3)
    assert all(
        len(o) == 8
        for o in generate(engine, prompts, SamplingParams(max_new_tokens=8, ignore_eos=True))
    )
    assert_all_free(engine)
