"""What the engine shows about itself: what it loaded (`EngineFacts`, fixed for its life) and its
KV pool at one instant (`KvPool`). The server, the fleet and the training scripts read these
through `Engine`'s public properties, never the resources behind them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from specserve.engine.memory import MemoryBudget
from specserve.engine.resources import EngineResources
from specserve.scheduler.kv_blocks import CacheStats


@dataclass(frozen=True)
class EngineFacts:
    """What the engine loaded; fixed once it is built."""

    model_dir: Path
    device: torch.device
    vocab_size: int
    weight_bytes: int  # the target's weights and a draft model's, GGUF blocks included
    attention: Literal["ragged", "reference"]
    budget: MemoryBudget | None  # None unless --max-memory had the engine plan its memory


@dataclass(frozen=True)
class WindowPool:
    """The sliding-window layers' own pool (scheduler/window_blocks.py), at one instant."""

    window: int  # positions a sliding layer attends to
    layers: int  # sliding layers (the rest are in the block pool)
    num_blocks: int
    kv_bytes: int
    used: int  # blocks a sequence holds
    peak_used: int  # the most held at once so far
    attached: int  # blocks kept with cached prefixes


@dataclass(frozen=True)
class KvPool:
    """The target's KV pool: its size and, at one instant, its use."""

    num_blocks: int
    block_size: int
    kv_bytes: int  # the K/V tensors of every block
    dtype: str  # element type of the K/V tensors: "float16", "float32", ...
    prefix_caching: bool
    used: int  # blocks a sequence holds
    cached: int  # blocks holding a cached prefix (held or not)
    cache: CacheStats | None  # a copy of the prefix cache's counters; None without caching
    window: WindowPool | None = None  # the sliding layers' pool, where they keep one

    @property
    def tokens(self) -> int:
        """KV slots in the whole pool: one request can never hold more."""
        return self.num_blocks * self.block_size


def engine_facts(res: EngineResources) -> EngineFacts:
    return EngineFacts(
        model_dir=res.model_dir,
        device=res.device,
        vocab_size=res.model.arch.vocab_size,
        weight_bytes=res.weight_bytes,
        attention="ragged" if res.runner.ragged else "reference",
        budget=res.memory,
    )


def kv_pool(res: EngineResources) -> KvPool:
    alloc = res.allocator
    return KvPool(
        num_blocks=alloc.num_blocks,
        block_size=alloc.block_size,
        kv_bytes=res.runner.kv_bytes,
        dtype=str(res.runner.kv.dtype).removeprefix("torch."),
        prefix_caching=alloc.caching,
        used=alloc.num_used,
        cached=alloc.num_cached,
        cache=replace(alloc.stats) if alloc.caching else None,
        window=window_pool(res),
    )


def window_pool(res: EngineResources) -> WindowPool | None:
    pool, caches = res.window, res.runner.caches
    if pool is None:
        return None
    sliding = caches["sliding"]
    return WindowPool(
        window=pool.window,
        layers=sliding.shape[0],
        num_blocks=pool.num_blocks,
        kv_bytes=sliding.numel() * sliding.element_size(),
        used=pool.num_used,
        peak_used=pool.peak_used,
        attached=pool.num_attached,
    )
