"""Memory budget arithmetic, the measured activation peak, and the pool it leaves."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.config import EngineConfig, SchedulerConfig, SpecConfig
from specserve.engine.engine import Engine
from specserve.engine.memory import MemoryBudget, measure_peak, parse_bytes, resolve_max_memory
from specserve.request import SamplingParams
from tests.engine.helpers import mixed_prompts

CPU = torch.device("cpu")


def budget(**kw: int) -> MemoryBudget:
    base = dict(
        max_memory=10_000,
        target_weights=2_000,
        draft_weights=0,
        activation_peak=1_000,
        kv_bytes_per_token=10,
        draft_kv_bytes_per_token=0,
        block_size=16,
    )
    return MemoryBudget(**{**base, **kw})


def test_budget_arithmetic() -> None:
    b = budget()
    assert b.free_for_kv == 7_000
    assert b.kv_tokens == 688  # 700 tokens rounded down to whole 16-token blocks
    assert b.num_blocks == 43
    assert b.as_dict()["headroom"] == 7_000 - 6_880


def test_draft_shrinks_the_target_pool() -> None:
    plain = budget()
    with_draft = budget(draft_weights=1_000, draft_kv_bytes_per_token=5)
    assert with_draft.kv_tokens == 400  # (10000-2000-1000-1000) / (10+5) = 400
    assert with_draft.num_blocks < plain.num_blocks
    assert with_draft.target_kv + with_draft.draft_kv <= with_draft.free_for_kv


def test_budget_too_small_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="leaves no room for the KV cache"):
        budget(max_memory=3_000).check()


def test_resolve_max_memory_forms() -> None:
    assert resolve_max_memory("2GiB", CPU) == 2 << 30
    assert resolve_max_memory("1500", CPU) == 1500
    assert 0 < resolve_max_memory("0.5", CPU) < resolve_max_memory("1.0", CPU)
    with pytest.raises(ValueError):
        resolve_max_memory("-3", CPU)


def test_measure_peak_counts_live_tensors() -> None:
    def step() -> torch.Tensor:
        a = torch.ones(1000, 1000)  # 4 MB
        b = a * 2  # 4 MB, both alive
        del a
        return b.sum()

    assert measure_peak(step, CPU) == pytest.approx(8_000_000, rel=0.01)


def engine_under(model: Path, speculate: int) -> Engine:
    return Engine(
        EngineConfig(
            model=str(model),
            max_memory="8MiB",
            scheduler=SchedulerConfig(max_batch_tokens=64, max_running_requests=8),
            spec=SpecConfig(speculate=speculate),
        )
    )


def test_speculation_shrinks_pool_and_admission_stays_within_it(tmp_path: Path) -> None:
    from tests.tiny import make_model_dir

    # A wide vocabulary makes the verify step's logits (one row per scored token) the peak.
    model = make_model_dir(tmp_path, "llama", vocab_size=4096)
    plain, spec = engine_under(model, 0), engine_under(model, 4)
    assert plain.res.memory is not None and spec.res.memory is not None
    # The speculative step scores every row with logits: a larger measured peak, a smaller pool.
    assert spec.res.memory.activation_peak > plain.res.memory.activation_peak
    assert spec.res.allocator.num_blocks < plain.res.allocator.num_blocks
    mem = spec.res.memory
    assert spec.res.runner.kv_bytes <= mem.target_kv
    used = mem.target_weights + mem.activation_peak + spec.res.runner.kv_bytes
    assert used <= mem.max_memory
    for p in mixed_prompts(40, seed=9):
        spec.add_request(p, SamplingParams(max_new_tokens=20, ignore_eos=True))
    peak_blocks = 0
    while spec.has_work():
        spec.step()
        peak_blocks = max(peak_blocks, spec.res.allocator.num_used)
        assert spec.res.allocator.num_used <= spec.res.allocator.num_blocks
    assert peak_blocks > 0
    assert spec.res.allocator.num_free == spec.res.allocator.num_blocks


def test_kv_cache_bytes_takes_the_byte_forms_max_memory_takes() -> None:
    from specserve.cli import build_parser
    from specserve.cli_args import engine_config_from_args

    for text, want in [("256MiB", 256 << 20), ("268435456", 268435456), ("1.5GB", 1_500_000_000)]:
        assert parse_bytes(text) == want
        args = build_parser().parse_args(["serve", "--kv-cache-bytes", text])
        assert engine_config_from_args(args).cache.max_kv_bytes == want
    for bad in ("0", "-5", "nan", "lots"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_fp16_kv_cache_holds_twice_the_blocks_in_the_same_bytes(tiny_llama: Path) -> None:
    from specserve.config import CacheConfig
    from specserve.engine.kv_sizing import KvKinds, kv_blocks_for, target_kv_bytes_per_token
    from specserve.models.registry import build_model
    from specserve.runner.model_runner import ModelRunner, kv_cache_dtype

    model = build_model(tiny_llama, CPU)
    per_token, blocks = {}, {}
    for dtype in ("float16", "float32"):
        config = EngineConfig(cache=CacheConfig(max_kv_bytes=1 << 20, kv_dtype=dtype))
        per_token[dtype] = target_kv_bytes_per_token(config, model, CPU)
        kinds = KvKinds.of(config, model, CPU)
        blocks[dtype], window = kv_blocks_for(config, kinds, 0, max_model_len=4096)
        assert kinds.full_bytes_per_token == per_token[dtype] and window == 0  # no sliding layers
    assert per_token["float32"] == model.arch.kv_bytes_per_token == 2 * per_token["float16"]
    assert blocks["float16"] == 2 * blocks["float32"]
    runner = ModelRunner(model, blocks["float16"], 16, CPU, kv_dtype="float16")
    assert runner.kv.dtype == torch.float16 and runner.kv_bytes == 1 << 20
    # The padded reference path keeps the model's dtype whatever is asked.
    assert kv_cache_dtype(model, CPU, "reference", "float16") == torch.float32


def test_kv_cache_dtype_flag_env_and_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    from specserve.cli import build_parser
    from specserve.cli_args import engine_config_from_args
    from specserve.config import CacheConfig

    def kv_dtype(*flags: str) -> str:
        args = build_parser().parse_args(["serve", *flags])
        return engine_config_from_args(args).cache.kv_dtype

    assert kv_dtype() == "float16"
    assert kv_dtype("--kv-cache-dtype", "float32") == "float32"
    monkeypatch.setenv("KV_CACHE_DTYPE", "float32")
    assert kv_dtype() == "float32"
    assert kv_dtype("--kv-cache-dtype", "float16") == "float16"
    monkeypatch.setenv("KV_CACHE_DTYPE", "bfloat16")
    with pytest.raises(SystemExit, match="kv_dtype"):
        kv_dtype()
    with pytest.raises(ValueError, match="kv_dtype"):
        CacheConfig(kv_dtype="int8")  # type: ignore[arg-type]
