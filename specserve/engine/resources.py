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
from specserve.engine.memory import MemoryBudget, measure_peak, resolve_max_memory, split_kv
from specserve.models.llama import DecoderLM
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model, read_config
from specserve.models.tokenizer import load_tokenizer
from specserve.runner.cost import LiveCost
from specserve.runner.model_runner import ModelRunner, RunItem, kv_cache_dtype, splits_kv
from specserve.scheduler.kv_blocks import BlockAllocator, blocks_for
from specserve.scheduler.scheduler import Scheduler
from specserve.scheduler.window_blocks import WindowBlocks, window_pool_blocks
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


def kv_pools(
    config: EngineConfig,
    model: DecoderLM,
    device: torch.device,
    weight_bytes: int,
    draft: DecoderLM | None,
    kinds: KvKinds,
    max_model_len: int,
) -> tuple[int, int, MemoryBudget | None]:
    """(KV blocks, window-pool blocks, the memory plan): planned within --max-memory where it
    is given, else from the KV byte budget or block count."""
    if config.max_memory is not None:
        memory = plan_memory(config, model, device, weight_bytes, draft, kinds)
        return memory.num_blocks, memory.window_blocks, memory
    draft_kv = draft.arch.kv_bytes_per_token if draft is not None else 0
    return (*kv_blocks_for(config, kinds, draft_kv, max_model_len), None)


@dataclass(frozen=True)
class KvKinds:
    """The target's K/V bytes by layer kind, and the window pool's bound (0: every layer in
    one pool: no sliding layers beside full ones, or `--no-window-kv-pool`)."""

    full_bytes_per_token: int  # the layers in the block pool
    window_block_bytes: int  # one window-pool block over the sliding layers
    window_bound: int
    window: int  # the sliding layers' window (0: none)

    @classmethod
    def of(cls, config: EngineConfig, model: DecoderLM, device: torch.device) -> KvKinds:
        arch, sched, bs = model.arch, config.scheduler, config.cache.block_size
        per_token = target_kv_bytes_per_token(config, model, device)
        if not (config.cache.window_pool and splits_kv(model)) or arch.sliding_window is None:
            return cls(per_token, 0, 0, 0)
        sliding = sum(arch.layer_type(i) == "sliding" for i in range(arch.num_layers))
        per_layer = per_token // arch.num_layers
        bound = window_pool_blocks(
            arch.sliding_window, bs, sched.max_running_requests, sched.max_batch_tokens
        )
        return cls(
            per_layer * (arch.num_layers - sliding),
            per_layer * sliding * bs,
            bound,
            arch.sliding_window,
        )


def target_kv_bytes_per_token(config: EngineConfig, model: DecoderLM, device: torch.device) -> int:
    """K/V bytes per token of the target's cache, at its element size (fp16: half of float32,
    so the same bytes hold twice the blocks)."""
    dtype = kv_cache_dtype(model, device, config.attention, config.cache.kv_dtype)
    return model.arch.kv_bytes(dtype.itemsize)


def param_bytes(model: DecoderLM) -> int:
    """Bytes of the weights, GGUF blocks (buffers) included."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def largest_step(config: EngineConfig) -> int:
    """Tokens in the largest step: a full prefill budget, or every running sequence verifying
    N+1 positions (whichever is larger, capped by the token budget)."""
    sched = config.scheduler
    spec_tokens = sched.max_running_requests * (config.spec.speculate + 1)
    return min(max(spec_tokens, 1), sched.max_batch_tokens)


def plan_memory(
    config: EngineConfig,
    model: DecoderLM,
    device: torch.device,
    weight_bytes: int,
    draft: DecoderLM | None = None,
    kinds: KvKinds | None = None,
) -> MemoryBudget:
    """Measure the largest steps' peak activation on a scratch KV pool and size the rest."""
    bs = config.cache.block_size
    limit = model.arch.max_position
    prefill = min(config.scheduler.max_batch_tokens, limit)
    spec = min(largest_step(config), limit)
    scratch = ModelRunner(
        model, blocks_for(prefill, bs), bs, device, config.attention, config.cache.kv_dtype
    )
    table = list(range(blocks_for(prefill, bs)))
    peak = max(
        # a prefill chunk (one logits row) and a speculative step (logits on every row)
        measure_peak(lambda: scratch.run([RunItem([0] * prefill, 0, table, 1)]), device),
        measure_peak(lambda: scratch.run([RunItem([0] * spec, 0, table, spec)]), device),
        # the draft's largest step: a catch-up of max_batch_tokens (the bound its proposer keeps)
        draft_peak(draft, prefill, bs, device) if draft is not None else 0,
    )
    kinds = kinds or KvKinds.of(config, model, device)
    budget = MemoryBudget(
        max_memory=resolve_max_memory(config.max_memory or "", device),
        target_weights=weight_bytes,
        draft_weights=param_bytes(draft) if draft is not None else 0,
        activation_peak=peak,
        kv_bytes_per_token=kinds.full_bytes_per_token,
        draft_kv_bytes_per_token=draft.arch.kv_bytes_per_token if draft is not None else 0,
        block_size=bs,
        window_block_bytes=kinds.window_block_bytes,
        window_bound=kinds.window_bound,
    )
    budget.check()
    logger.info("memory budget: %s", budget.as_dict())
    return budget


def draft_peak(draft: DecoderLM, tokens: int, bs: int, device: torch.device) -> int:
    tokens = min(tokens, draft.arch.max_position)
    scratch = ModelRunner(draft, blocks_for(tokens, bs), bs, device)
    table = list(range(blocks_for(tokens, bs)))
    return measure_peak(lambda: scratch.run([RunItem([0] * tokens, 0, table, 1)]), device)


def kv_blocks_for(
    config: EngineConfig, kinds: KvKinds, draft_kv_bytes_per_token: int, max_model_len: int
) -> tuple[int, int]:
    """(blocks, window-pool blocks) from the explicit count, else from the byte budget, capped
    at what the running limit can ever use."""
    bs = config.cache.block_size
    usable = config.scheduler.max_running_requests * -(-max_model_len // bs)
    if config.cache.num_blocks is not None:
        blocks = config.cache.num_blocks
        return blocks, min(kinds.window_bound, blocks + 1)
    per_block = (kinds.full_bytes_per_token + draft_kv_bytes_per_token) * bs
    blocks, window = split_kv(
        config.cache.max_kv_bytes, per_block, kinds.window_block_bytes, kinds.window_bound, usable
    )
    return max(1, blocks), window


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
