"""Paged attention over a ragged batch: each sequence costs what it feeds, nothing is padded.

Layout: each layer's cache is `[kv_heads, num_slots, head_dim]` for K and for V (head-major),
where slot = block * block_size + offset, in float32 or fp16. A step feeds T new tokens from B
sequences; sequence b feeds q_len[b] tokens at absolute positions ctx_len[b] - q_len[b] ..
ctx_len[b] - 1 and attends to its first ctx_len[b] cached positions (within the sliding window,
if any, in the layers that slide). The metadata serves every layer, so it is built once per step.

Every row of the step, decode, verify or prefill, goes through one call of the C kernel
(`kernels/paged_attention.c`) after the step's K/V are written: each row reads its keys from the
cache, in the form (fp16-rounded or not) any later step reads them, and reduces over them in an
order fixed by its own position. So a row's output is the same bit for bit whether it is decoded
alone, verified among k + 1, prefilled in a chunk of any size, or attends to a prefix that came
from the prefix cache.

`models/attention_reference.py` is the padded gather + SDPA path, kept as the reference in tests
and for devices and dtypes the kernel does not cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from specserve.kernels import attention as kernel


class AttentionMetadata(Protocol):
    """What one step's attention needs, built once and shared by every layer."""

    def attend(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, Hkv, D]: the new tokens' keys (after RoPE)
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [Hkv, num_slots, D]
        v_cache: torch.Tensor,
        scale: float,
        full: bool = False,
    ) -> torch.Tensor:  # [T, H * D]
        """Write the new K/V into their slots, then attend each query row to its sequence:
        within the step's sliding window, if any, unless `full` (a layer that attends to its
        whole context in a model whose other layers slide, as five in six of Gemma 3's)."""
        ...


@dataclass(frozen=True)
class ByLayerKind:
    """A step's metadata where the full and the sliding layers keep their K/V in pools of their
    own (scheduler/window_blocks.py): each kind's layers write and read through theirs."""

    full: AttentionMetadata  # the block tables
    sliding: AttentionMetadata  # the window tables

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        full: bool = False,
    ) -> torch.Tensor:
        kind = self.full if full else self.sliding
        return kind.attend(q, k, v, k_cache, v_cache, scale, full=full)


@dataclass(frozen=True)
class RaggedMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot written by each new token
    seqs: torch.Tensor  # [B, 3] int64: first row, q_len, ctx_len
    tables: torch.Tensor  # [B, max_blocks] int32, zero-padded
    block_size: int
    window: int | None

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        full: bool = False,
    ) -> torch.Tensor:
        # A float16 cache holds K/V rounded to nearest even (torch's float -> half conversion).
        k_cache.index_copy_(1, self.slot_mapping, k.transpose(0, 1).to(k_cache.dtype))
        v_cache.index_copy_(1, self.slot_mapping, v.transpose(0, 1).to(v_cache.dtype))
        out = q.new_empty(q.shape)  # [T, H, D]
        window = None if full else self.window
        kernel.paged_attention(
            q, k_cache, v_cache, out, self.seqs, self.tables, self.block_size, scale, window
        )
        return out.flatten(1)


def build_ragged_metadata(
    q_lens: list[int],
    ctx_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
    sliding_window: int | None = None,
) -> RaggedMetadata:
    """Index tensors for one step. q_lens[b] <= ctx_lens[b]; block tables cover ctx_lens[b]."""
    slots: list[int] = []
    seqs: list[tuple[int, int, int]] = []
    first = 0
    for q_len, ctx, table in zip(q_lens, ctx_lens, block_tables, strict=True):
        slots += _slots(table, ctx - q_len, ctx, block_size)
        seqs.append((first, q_len, ctx))
        first += q_len
    width = max(len(t) for t in block_tables)
    padded = [t + [0] * (width - len(t)) for t in block_tables]
    return RaggedMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        seqs=torch.tensor(seqs, dtype=torch.int64),
        tables=torch.tensor(padded, dtype=torch.int32),
        block_size=block_size,
        window=sliding_window,
    )


def _slots(table: list[int], start: int, end: int, block_size: int) -> list[int]:
    """Cache slots of positions start .. end - 1 (numpy for a prefill chunk's many)."""
    if end - start <= 32:
        return [table[p // block_size] * block_size + p % block_size for p in range(start, end)]
    positions = np.arange(start, end)
    blocks = np.asarray(table, dtype=np.int64)[positions // block_size]
    return (blocks * block_size + positions % block_size).tolist()


def kernel_usable(
    device: torch.device, dtype: torch.dtype, arch_shapes: tuple[int, int, int]
) -> bool:
    """The ragged path needs the kernel: CPU, float32, a head_dim/heads layout it takes."""
    head_dim, num_heads, num_kv_heads = arch_shapes
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and kernel.supports(head_dim, num_heads, num_kv_heads)
        and kernel.library() is not None
    )
