"""Build what an engine runs on: model, tokenizer, KV pool, scheduler and proposer."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specserve.config import EngineConfig
from specserve.engine.memory import MemoryBudget, measure_peak, resolve_max_memory
from specserve.models.llama import LlamaForCausalLM
from specserve.models.loader import resolve_model_dir
from specserve.models.registry import build_model, read_config
from specserve.runner.cost import CostCurve, profile_cost
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator, blocks_for
from specserve.scheduler.scheduler import Scheduler
from specserve.spec.policy import Gate, SpeculationPolicy
from specserve.spec.proposer import NgramProposer, Proposer

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class EngineResources:
    model_dir: Path
    model: LlamaForCausalLM
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


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was requested but no CUDA device is available")
    return device


def load_resources(config: EngineConfig) -> EngineResources:
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    device = resolve_device(config.device)
    model_dir = resolve_model_dir(config.model)
    started = time.perf_counter()
    model = build_model(model_dir, device, _DTYPES[config.dtype])
    tokenizer = load_tokenizer(model_dir)
    logger.info("loaded %s in %.1f s", model_dir, time.perf_counter() - started)
    arch = model.arch
    max_model_len = min(config.max_model_len or arch.max_position, arch.max_position)
    block_size = config.cache.block_size
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    memory = None
    if config.max_memory is not None:
        memory = plan_memory(config, model, device, weight_bytes)
        num_blocks = memory.num_blocks
    else:
        num_blocks = kv_blocks_for(config, arch.kv_bytes_per_token, max_model_len)
    allocator = BlockAllocator(num_blocks, block_size)
    runner = ModelRunner(model, num_blocks, block_size, device)
    return EngineResources(
        model_dir=model_dir,
        model=model,
        tokenizer=tokenizer,
        runner=runner,
        allocator=allocator,
        scheduler=Scheduler(config.scheduler, allocator),
        proposer=make_proposer(config),
        policy=make_policy(config, runner, allocator),
        eos_ids=eos_token_ids(model_dir, tokenizer),
        max_model_len=max_model_len,
        device=device,
        weight_bytes=weight_bytes,
        memory=memory,
    )


def largest_step(config: EngineConfig) -> int:
    """Tokens in the largest step: a full prefill budget, or every running sequence verifying
    N+1 positions (whichever is larger, capped by the token budget)."""
    sched = config.scheduler
    spec_tokens = sched.max_running_requests * (config.spec.speculate + 1)
    return min(max(spec_tokens, 1), sched.max_batch_tokens)


def plan_memory(
    config: EngineConfig, model: LlamaForCausalLM, device: torch.device, weight_bytes: int
) -> MemoryBudget:
    """Measure the largest steps' peak activation on a scratch KV pool and size the rest."""
    bs = config.cache.block_size
    prefill, spec = config.scheduler.max_batch_tokens, largest_step(config)
    scratch = ModelRunner(model, blocks_for(prefill, bs), bs, device)
    table = list(range(blocks_for(prefill, bs)))
    peak = max(
        # a prefill chunk (one logits row) and a speculative step (logits on every row)
        measure_peak(lambda: scratch.run([RunItem([0] * prefill, 0, table, 1)]), device),
        measure_peak(lambda: scratch.run([RunItem([0] * spec, 0, table, spec)]), device),
    )
    budget = MemoryBudget(
        max_memory=resolve_max_memory(config.max_memory or "", device),
        target_weights=weight_bytes,
        draft_weights=0,
        activation_peak=peak,
        kv_bytes_per_token=model.arch.kv_bytes_per_token,
        draft_kv_bytes_per_token=0,
        block_size=bs,
    )
    budget.check()
    logger.info("memory budget: %s", budget.as_dict())
    return budget


def kv_blocks_for(config: EngineConfig, kv_bytes_per_token: int, max_model_len: int) -> int:
    """Blocks from the explicit count, else from the byte budget, capped at what the running
    limit can ever use."""
    bs = config.cache.block_size
    if config.cache.num_blocks is not None:
        return config.cache.num_blocks
    by_bytes = config.cache.max_kv_bytes // (kv_bytes_per_token * bs)
    usable = config.scheduler.max_running_requests * -(-max_model_len // bs)
    return max(1, min(by_bytes, usable))


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


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


def make_proposer(config: EngineConfig) -> Proposer | None:
    spec = config.spec
    if spec.speculate == 0:
        return None
    if spec.proposer in ("auto", "ngram"):
        return NgramProposer(spec.ngram_min, spec.ngram_max)
    raise ValueError(f"proposer {spec.proposer!r} is not available in this build")


def make_policy(
    config: EngineConfig, runner: ModelRunner, allocator: BlockAllocator
) -> SpeculationPolicy | None:
    spec = config.spec
    if spec.speculate == 0:
        return None
    cost: CostCurve | None = None
    if spec.policy == "adaptive":
        # Cover the largest speculative step: every running sequence verifying N+1 positions.
        largest = config.scheduler.max_running_requests * (spec.speculate + 1)
        largest = min(
            largest, config.scheduler.max_batch_tokens, allocator.num_blocks * allocator.block_size
        )
        started = time.perf_counter()
        cost = profile_cost(runner, allocator, largest)
        logger.info(
            "profiled step cost c(T) for T <= %d in %.1f s: %s",
            largest,
            time.perf_counter() - started,
            ", ".join(
                f"c({t})={c * 1e3:.1f}ms" for t, c in zip(cost.tokens, cost.seconds, strict=True)
            ),
        )
    return SpeculationPolicy(
        adaptive=spec.policy == "adaptive",
        gate=Gate(spec.max_batch, spec.max_tokens),
        max_k=spec.speculate,
        cost=cost,
    )
