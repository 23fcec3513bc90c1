"""Runs the target model over a ragged batch against the paged KV cache.

The runner knows nothing of requests or speculation: it feeds token slices at given positions,
writes their K/V, and returns logits (and final hidden states) for the rows asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specserve.config import AttentionImpl, KvDtype
from specserve.models import huge_pages
from specserve.models.attention import build_ragged_metadata, kernel_usable
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


class ModelRunner:
    """`kv_dtype`: the cache's element type where the paged kernel reads it. The engine passes
    `CacheConfig.kv_dtype` (float16 by default); direct users (tests, the draft model) keep
    float32, K/V as computed, unless they ask."""

    def __init__(
        self,
        model: DecoderLM,
        num_blocks: int,
        block_size: int,
        device: torch.device,
        attention: AttentionImpl = "auto",
        kv_dtype: KvDtype = "float32",
    ) -> None:
        arch = model.arch
        self.model, self.device, self.block_size = model, device, block_size
        self.num_blocks = num_blocks
        self.ragged = uses_ragged(model, device, attention)
        # Head-major: one KV head's rows of consecutive slots are contiguous (a block of a head is
        # block_size * head_dim elements in a row), which is how attention streams them.
        shape = (arch.num_layers, 2, arch.num_kv_heads, num_blocks * block_size, arch.head_dim)
        dtype = kv_cache_dtype(model, device, attention, kv_dtype)
        # Zeroed so that masked (never written) slots hold finite values: 0 * garbage = NaN. On
        # the CPU in a mapping of its own on huge pages (models/huge_pages.py).
        if device.type == "cpu":
            self.kv = huge_pages.zeros(shape, dtype)
        else:
            self.kv = torch.zeros(shape, dtype=dtype, device=device)
        self.kv_layers = [(self.kv[i, 0], self.kv[i, 1]) for i in range(arch.num_layers)]

    @property
    def kv_bytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

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
        build = build_ragged_metadata if self.ragged else build_metadata
        meta = build(
            q_lens=[len(i.token_ids) for i in items],
            ctx_lens=[i.start + len(i.token_ids) for i in items],
            block_tables=[i.block_table for i in items],
            block_size=self.block_size,
            device=self.device,
            sliding_window=self.model.arch.sliding_window,
        )
        dev = self.device
        hidden = self.model(
            torch.tensor(ids, device=dev), torch.tensor(positions, device=dev), self.kv_layers, meta
        )
        rows = hidden[torch.tensor(logit_rows, dtype=torch.long, device=dev)]
        only = (
            hidden[torch.tensor(hidden_rows, dtype=torch.long, device=dev)] if hidden_rows else None
        )
        return RunOutput(logits=self.model.logits(rows).float(), hidden=rows, hidden_only=only)
