"""How much KV cache an engine gets: the target's K/V bytes by layer kind (`KvKinds`), and the
block pools sized from the explicit count, the KV byte budget, or a memory plan that measures
the largest steps' activation peak within --max-memory (`kv_pools`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specserve.config import EngineConfig
from specserve.engine.memory import MemoryBudget, measure_peak, resolve_max_memory, split_kv
from specserve.models.llama import DecoderLM
from specserve.runner.model_runner import ModelRunner, RunItem, kv_cache_dtype, splits_kv
from specserve.scheduler.kv_blocks import blocks_for
from specserve.scheduler.window_blocks import window_pool_blocks

logger = logging.getLogger(__name__)


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
