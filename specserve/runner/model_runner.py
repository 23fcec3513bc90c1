"""Runs the target model over a ragged batch against the paged KV cache.

The runner knows nothing of requests or speculation: it feeds token slices at given positions,
writes their K/V, and returns logits (and final hidden states) for the rows asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.config import AttentionImpl, KvDtype
from specserve.models import huge_pages
from specserve.models.attention import (
    AttentionMetadata,
    ByLayerKind,
    build_ragged_metadata,
    kernel_usable,
)
from specserve.models.attention_reference import build_metadata
from specserve.models.llama import DecoderLM


@dataclass(frozen=True)
class RunItem:
    """One sequence's slice of a forward pass."""

    token_ids: list[int]  # fed at positions start .. start + len - 1
    start: int
    block_table: list[int]  # covers start + len(token_ids) positions
    num_logits: int  # logits for the last `num_logits` fed positions (0 = none)
    # The `hidden_rows` positions just before those: their final-normed states only, which the
    # caller turns into logits a few rows at a time (no [rows, vocab] tensor for all of them).
    hidden_rows: int = 0
    # The sliding-window layers' blocks of the same positions, for a runner that keeps them in a
    # pool of their own (`window_blocks`); NULL (0) behind the window.
    window_table: list[int] | None = None


@dataclass(frozen=True)
class RunOutput:
    logits: torch.Tensor  # [sum(num_logits), vocab] float32
    hidden: torch.Tensor  # [sum(num_logits), hidden]: final-normed states of the same rows
    hidden_only: torch.Tensor | None = None  # [sum(hidden_rows), hidden]; None: none asked


def uses_ragged(model: DecoderLM, device: torch.device, attention: AttentionImpl) -> bool:
    """The ragged path where its kernel runs (CPU float32), else the padded reference."""
    arch = model.arch
    dtype = next(model.parameters()).dtype
    shapes = (arch.head_dim, arch.num_heads, arch.num_kv_heads)
    return attention == "auto" and kernel_usable(device, dtype, shapes)


def kv_cache_dtype(
    model: DecoderLM, device: torch.device, attention: AttentionImpl, kv_dtype: KvDtype
) -> torch.dtype:
    """`kv_dtype` where the paged kernel reads the cache; elsewhere the model's own dtype."""
    if uses_ragged(model, device, attention):
        return getattr(torch, kv_dtype)
    return next(model.parameters()).dtype


def splits_kv(model: DecoderLM) -> bool:
    """Layers of both kinds, full and sliding: their K/V can live in pools of their own."""
    kinds = {model.arch.layer_type(i) for i in range(model.arch.num_layers)}
    return kinds == {"full", "sliding"}


class ModelRunner:
    """`kv_dtype`: the cache's element type where the paged kernel reads it. The engine passes
    `CacheConfig.kv_dtype` (float16 by default); direct users (tests, the draft model) keep
    float32, K/V as computed, unless they ask.

    `window_blocks`: for a model with layers of both kinds (`splits_kv`), its sliding layers
    keep their K/V in a pool of this many blocks of their own, addressed by each item's
    `window_table` (scheduler/window_blocks.py); 0: every layer in the `num_blocks` pool."""

    def __init__(
        self,
        model: DecoderLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        attention: AttentionImpl = "auto",
        kv_dtype: KvDtype = "float32",
        window_blocks: int = 0,
    ) -> None:
        arch = model.arch
        self.model, self.device, self.block_size = model, device, block_size
        self.num_blocks = num_blocks
        self.ragged = uses_ragged(model, device, attention)
        self.window_blocks = window_blocks if splits_kv(model) else 0
        layers = range(arch.num_layers)
        kinds = [arch.layer_type(i) if self.window_blocks else "full" for i in layers]
        dtype = kv_cache_dtype(model, device, attention, kv_dtype)
        pools = {"full": num_blocks, "sliding": self.window_blocks}
        self.caches = {
            kind: self._zeros(kinds.count(kind), blocks * block_size, dtype)
            for kind, blocks in pools.items()
            if kind in kinds
        }
        seen = {kind: 0 for kind in self.caches}
        self.kv_layers = []
        for kind in kinds:
            cache, seen[kind] = self.caches[kind][seen[kind]], seen[kind] + 1
            self.kv_layers.append((cache[0], cache[1]))

    def _zeros(self, layers: int, slots: int, dtype: torch.dtype) -> torch.Tensor:
        arch = self.model.arch
        # Head-major: one KV head's rows of consecutive slots are contiguous (a block of a head is
        # block_size * head_dim elements in a row), which is how attention streams them.
        shape = (layers, 2, arch.num_kv_heads, slots, arch.head_dim)
        # Zeroed so that masked (never written) slots hold finite values: 0 * garbage = NaN. On
        # the CPU in a mapping of its own on huge pages (models/huge_pages.py).
        if self.device.type == "cpu":
            return huge_pages.zeros(shape, dtype)
        return torch.zeros(shape, dtype=dtype, device=self.device)

    @property
    def kv(self) -> torch.Tensor:
        """The full layers' cache (every layer's, where the runner keeps one pool)."""
        return self.caches["full"]

    @property
    def kv_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in self.caches.values())

    @torch.inference_mode()
    def run(self, items: list[RunItem]) -> RunOutput:
        ids: list[int] = []
        positions: list[int] = []
        logit_rows: list[int] = []
        hidden_rows: list[int] = []
        for item in items:
            n = len(item.token_ids)
            ids += item.token_ids
            positions += range(item.start, item.start + n)
            first_logit = len(ids) - item.num_logits
            hidden_rows += range(first_logit - item.hidden_rows, first_logit)
            logit_rows += range(first_logit, len(ids))
        meta = self._metadata(items, [i.block_table for i in items])
        if self.window_blocks:
            tables = [i.window_table for i in items if i.window_table is not None]
            if len(tables) < len(items):
                raise ValueError("this runner keeps sliding layers' K/V apart: give window tables")
            meta = ByLayerKind(full=meta, sliding=self._metadata(items, tables))
        dev = self.device
        hidden = self.model(
            torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), self.kv_layers, meta
        )
        rows = hidden[torch.tensor(logit_rows, dtype=torch.long, device=dev)]
        only = (
            hidden[torch.tensor(hidden_rows, dtype=torch.long, device=dev)] if hidden_rows else None
        )
        return RunOutput(logits=self.model.logits(rows).float(), hidden=rows, hidden_only=only)

    def _metadata(self, items: list[RunItem], tables: list[list[int]]) -> AttentionMetadata:
        build = build_ragged_metadata if self.ragged else build_metadata
        return build(
            q_lens=[len(i.token_ids) for i in items],
            ctx_lens=[i.start + len(i.token_ids) for i in items],
            block_tables=tables,
            block_size=self.block_size,
            device=self.device,
            sliding_window=self.model.arch.sliding_window,
        )
