"""Half-precision runs: the engine serves bf16/fp16 weights and speculation stays lossless."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.config import CacheConfig, EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.request import SamplingParams
from tests.engine.helpers import mixed_prompts, run_all


def _engine(model_dir: Path, dtype: str, speculate: int) -> Engine:
    return Engine(
        EngineConfig(
            model=str(model_dir),
            dtype=dtype,  # type: ignore[arg-type]
            cache=CacheConfig(block_size=4, num_blocks=64),
            scheduler=SchedulerConfig(max_batch_tokens=256, max_running_requests=16),
            spec=SpecConfig(speculate=speculate, proposer="ngram"),
        )
    )


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_runs_and_speculation_is_lossless(tiny_llama: Path, dtype: str) -> None:
    prompts = mixed_prompts(4)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    outputs = []
    for speculate in (0, 3):
        engine = _engine(tiny_llama, dtype, speculate)
        assert engine.res.runner.kv.dtype == getattr(torch, dtype)
        outputs.append(run_all(engine, prompts, params))
        assert engine.res.allocator.num_free == engine.res.allocator.num_blocks
    assert all(len(t) == 12 for t in outputs[0])
    assert outputs[0] == outputs[1]
