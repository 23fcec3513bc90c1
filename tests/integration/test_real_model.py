"""The embedded SmolLM2 model: parity with HF transformers (exact numerics), sensible greedy text
and lossless n-gram speculation on the default q8 numerics."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from specserve.config import Numerics
from specserve.engine.engine import Engine
from specserve.engine.resources import EngineResources
from specserve.models.loader import embedded_default_gguf
from specserve.request import SamplingParams
from tests.engine.helpers import make_engine, run_all

pytestmark = pytest.mark.integration

QUESTIONS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "Repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox.",
]


@cache
def base_engine(numerics: Numerics = "q8") -> Engine:
    # Exact numerics with float32 K/V, as HF computes them (the parity test compares greedy
    # tokens); q8 with the default fp16 cache.
    kv_dtype = "float32" if numerics == "exact" else "float16"
    return make_engine(
        None,
        num_blocks=512,
        block_size=16,
        max_batch_tokens=1024,
        numerics=numerics,
        kv_dtype=kv_dtype,
    )


def engine_with(speculate: int, num_blocks: int = 512, numerics: Numerics = "q8") -> Engine:
    """A fresh engine reusing the loaded model (only the KV pool and proposer differ), under
    the static policy: every draft verified whole, so the on/off tests see every position."""
    from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
    from specserve.engine.resources import make_policy
    from specserve.runner.model_runner import ModelRunner
    from specserve.scheduler.kv_blocks import BlockAllocator
    from specserve.scheduler.scheduler import Scheduler
    from specserve.speculation.proposer import Loaded
    from specserve.speculation.registry import REGISTRY

    base = base_engine(numerics).res
    config = EngineConfig(
        numerics=numerics,
        cache=CacheConfig(block_size=16, num_blocks=num_blocks),
        scheduler=SchedulerConfig(max_batch_tokens=1024),
        spec=SpecConfig(speculate=speculate, policy="static"),
    )
    allocator = BlockAllocator(num_blocks, 16)
    runner = ModelRunner(base.model, num_blocks, 16, base.device)
    res = EngineResources(
        model_dir=base.model_dir,
        model=base.model,
        tokenizer=base.tokenizer,
        runner=runner,
        allocator=allocator,
        scheduler=Scheduler(config.scheduler, allocator, base.max_model_len),
        proposer=REGISTRY.build(Loaded(config)),
        policy=make_policy(config, runner, allocator),
        eos_ids=base.eos_ids,
        max_model_len=base.max_model_len,
        device=base.device,
        weight_bytes=base.weight_bytes,
    )
    return Engine(config, res)


def prompts() -> list[list[int]]:
    engine = base_engine()
    return [engine.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def test_default_model_runs_on_gguf_blocks_where_the_kernels_build() -> None:
    from specserve.kernels import ggml
    from specserve.models.block_linear import BlockLinear, block_kinds, block_numerics
    from tests.kernels.expect import require

    require(ggml.library, "GGUF block kernels")  # without them the parity test covers dense
    model = base_engine().res.model
    assert model.block_kernel_fallback is None  # the start-up product checks passed
    assert all(isinstance(layer.gate_up_proj, BlockLinear) for layer in model.layers)
    assert isinstance(model.lm_head, BlockLinear)  # Q8_0 token embeddings, tied
    assert block_kinds(model) == ["Q4_1", "Q8_0"]
    assert block_numerics(model) == "q8"  # the default


def test_q8_greedy_answers_sensibly() -> None:
    """q8 is another numeric than HF's: SmolLM2-135M's greedy answer to the France question
    moves (to "L'Étoile, la Marseillaise, ..."; a float64 emulation of the same quantised
    activations, fp16 scales or float32, says the same, so it is the arithmetic, not a kernel
    bug). The code and the copying answers stay the float32 ones."""
    params = SamplingParams(max_new_tokens=32)
    engine = base_engine("q8")
    _, code, fox = (engine.tokenizer.decode(out) for out in run_all(engine, prompts(), params))
    assert "def reverse_string" in code and "[::-1]" in code
    assert fox.startswith("The quick brown fox jumps over")


def test_greedy_64_tokens_match_hf_generate() -> None:
    from benchmarks.hf_reference import hf_gguf_model

    hf = hf_gguf_model(embedded_default_gguf())
    # Generate through EOS like ignore_eos does (min_new_tokens would mask EOS instead).
    hf.generation_config.eos_token_id = None
    hf.config.eos_token_id = None
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    ours = run_all(base_engine("exact"), prompts(), params)  # HF's float32 numbers
    for ids, out in zip(prompts(), ours, strict=True):
        with torch.no_grad():
            ref = hf.generate(
                torch.tensor([ids]), max_new_tokens=64, do_sample=False, pad_token_id=0
            )
        assert out == ref[0, len(ids) :].tolist()


@pytest.mark.parametrize("n", [1, 3, 5])
def test_ngram_greedy_is_lossless_alone(n: int) -> None:
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    want = run_all(engine_with(0), prompts(), params)
    for p, w in zip(prompts(), want, strict=True):
        engine = engine_with(n)
        assert run_all(engine, [p], params)[0] == w
        assert engine.res.allocator.num_free == engine.res.allocator.num_blocks
    assert engine.stats.proposer.drafted_tokens > 0


# Small pools force preemption (a preempted sequence is recomputed by prefill where its tokens
# first ran as decode rows: the same rows, as every kernel computes a row the same either way).
@pytest.mark.parametrize(
    ("num_blocks", "numerics"), [(512, "q8"), (512, "exact"), (24, "exact"), (18, "q8")]
)
def test_ngram_greedy_is_lossless_in_mixed_batch(num_blocks: int, numerics: Numerics) -> None:
    ps = (prompts() * 3)[:8]
    caps = [None, 0, 3, None, 0, 1, 5, None]
    params = [SamplingParams(max_new_tokens=40, ignore_eos=True, speculate=c) for c in caps]
    want = run_all(engine_with(0, numerics=numerics), ps, params)
    engine = engine_with(5, num_blocks=num_blocks, numerics=numerics)
    assert run_all(engine, ps, params) == want
    if num_blocks < 512:  # 288-384 slots for 8 x ~80 tokens: preemption must have happened
        assert engine.scheduler.num_preemptions > 0
    assert engine.stats.proposer.accepted_tokens > 0
    assert engine.res.allocator.num_free == num_blocks


def test_ngram_seeded_sampling_is_lossless() -> None:
    params = [
        SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.95, seed=s, ignore_eos=True)
        for s in (1, 2, 3)
    ]
    want = run_all(engine_with(0), prompts(), params)
    engine = engine_with(4)
    assert run_all(engine, prompts(), params) == want
    assert engine.stats.proposer.drafted_tokens > 0
