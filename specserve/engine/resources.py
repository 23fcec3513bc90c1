"""Build what an engine runs on: model, tokenizer, KV pool, scheduler and proposer."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.config import EngineConfig
from specserve.engine.cost_probe import measure_step_cost
from specserve.engine.kv_sizing import KvKinds, kv_pools, param_bytes
from specserve.engine.memory import MemoryBudget
from specserve.models.llama import DecoderLM
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model, read_config
from specserve.models.tokenizer import load_tokenizer
from specserve.runner.cost import LiveCost
from specserve.runner.model_runner import ModelRunner
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.scheduler import Scheduler
from specserve.scheduler.window_blocks import WindowBlocks
from specserve.speculation.policy import Gate, SpeculationPolicy
from specserve.speculation.proposer import Loaded, Proposer, Target
from specserve.speculation.registry import REGISTRY

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class EngineResources:
    model_dir: Path
    model: DecoderLM
    tokenizer: Any  # transformers PreTrainedTokenizerFast
    runner: ModelRunner
    allocator: BlockAllocator
    scheduler: Scheduler
    proposer: Proposer | None
    policy: SpeculationPolicy | None
    eos_ids: frozenset[int]
    max_model_len: int
    device: torch.device
    weight_bytes: int
    memory: MemoryBudget | None = None
    # the live step cost the scheduler's ITL target and the adaptive policy share (the engine
    # feeds it its steps' timings); None where neither needs one
    cost: LiveCost | None = None
    # the sliding-window layers' pool, where the model has such layers beside full ones
    window: WindowBlocks | None = None


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but no CUDA device is available")
    return device


def default_num_threads() -> int:
    """One compute thread per CPU this process may run on (what measured best here: 2 threads
    decode ~1.4x faster than 1 on 2 cores, in process and over HTTP; docs/benchmarks.md)."""
    return len(os.sched_getaffinity(0))


def load_resources(config: EngineConfig, cost: LiveCost | None = None) -> EngineResources:
    """`cost`: the step cost to use instead of profiling one at start-up (where one is used)."""
    # Set in the thread that will run the steps (torch's and OpenMP's count is per thread).
    torch.set_num_threads(config.num_threads or default_num_threads())
    device = resolve_device(config.device)
    model_dir = resolve_model_dir(config.model)
    started = time.perf_counter()
    model = build_model(
        model_dir,
        device,
        DTYPES[config.dtype],
        gguf_blocks=not config.dense_weights,
        numerics=config.numerics,
        context=config.max_model_len,
    )
    tokenizer = load_tokenizer(model_dir)
    target = Target(model, model_dir, tokenizer, device, DTYPES[config.dtype])
    draft = REGISTRY.load_model(config, target)  # the proposer's own model, if it has one
    logger.info("loaded %s in %.1f s", model_dir, time.perf_counter() - started)
    arch = model.arch
    max_model_len = min(config.max_model_len or arch.max_position, arch.max_position)
    block_size = config.cache.block_size
    weight_bytes = param_bytes(model)
    kinds = KvKinds.of(config, model, device)
    num_blocks, window_blocks, memory = kv_pools(
        config, model, device, weight_bytes, draft, kinds, max_model_len
    )
    allocator = BlockAllocator(num_blocks, block_size, caching=config.cache.prefix_caching)
    window = WindowBlocks(window_blocks, block_size, kinds.window) if window_blocks else None
    runner = ModelRunner(
        model,
        num_blocks,
        block_size,
        device,
        config.attention,
        config.cache.kv_dtype,
        window_blocks=window_blocks,
    )
    proposer = REGISTRY.build(Loaded(config, target, draft, num_blocks))
    if cost is None:
        cost = step_cost(config, runner, allocator, window)
    return EngineResources(
        model_dir=model_dir,
        model=model,
        tokenizer=tokenizer,
        runner=runner,
        allocator=allocator,
        scheduler=Scheduler(config.scheduler, allocator, max_model_len, cost, window),
        proposer=proposer,
        policy=make_policy(config, runner, allocator, cost, window),
        eos_ids=eos_token_ids(model_dir, tokenizer),
        max_model_len=max_model_len,
        device=device,
        weight_bytes=weight_bytes + (param_bytes(draft) if draft is not None else 0),
        memory=memory,
        cost=cost,
        window=window,
    )


def eos_token_ids(model_dir: Path, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    sources: list[Any] = [read_config(model_dir).get("eos_token_id")]
    gen = model_dir / "generation_config.json"
    if gen.exists():
        sources.append(json.loads(gen.read_text()).get("eos_token_id"))
    sources.append(tokenizer.eos_token_id)
    for src in sources:
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, list):
            ids.update(int(i) for i in src)
    return frozenset(ids)


def step_cost(
    config: EngineConfig,
    runner: ModelRunner,
    allocator: BlockAllocator,
    window: WindowBlocks | None = None,
) -> LiveCost | None:
    """The step cost measured at start-up (engine/cost_probe.py) where the adaptive policy or
    the ITL target needs one (the target alone: a shorter profile, speculation's shapes left
    out); None where neither does."""
    spec, sched = config.spec, config.scheduler
    adaptive = spec.speculate > 0 and spec.policy == "adaptive"
    if not adaptive and not sched.itl_target_ms:
        return None
    model = measure_step_cost(
        runner,
        allocator,
        max_seqs=sched.max_running_requests,
        max_drafts=spec.speculate if adaptive else 0,
        max_tokens=sched.max_batch_tokens,
        budget_s=4.0 if adaptive else 1.0,
        window=window,
    )
    return LiveCost(model)


def make_policy(
    config: EngineConfig,
    runner: ModelRunner,
    allocator: BlockAllocator,
    cost: LiveCost | None = None,
    window: WindowBlocks | None = None,
) -> SpeculationPolicy | None:
    """`cost`: a step-cost model profiled before; the adaptive policy profiles one without."""
    spec = config.spec
    if spec.speculate == 0:
        return None
    if spec.policy == "adaptive" and cost is None:
        sched = config.scheduler
        model = measure_step_cost(
            runner,
            allocator,
            max_seqs=sched.max_running_requests,
            max_drafts=spec.speculate,
            max_tokens=sched.max_batch_tokens,
            window=window,
        )
        cost = LiveCost(model)
    return SpeculationPolicy(
        adaptive=spec.policy == "adaptive",
        gate=Gate(spec.max_batch, spec.max_tokens),
        cost=cost,
    )
