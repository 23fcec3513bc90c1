"""Paged attention over a ragged batch: each sequence costs what it feeds, nothing is padded.

Layout: each layer's cache is `[kv_heads, num_slots, head_dim]` for K and for V (head-major),
where slot = block * block_size + offset. A step feeds T new tokens from B sequences; sequence
b feeds q_len[b] tokens at absolute positions ctx_len[b] - q_len[b] .. ctx_len[b] - 1 and attends
to its first ctx_len[b] cached positions (within the sliding window, if any). The metadata
serves every layer, so it is built once per step.

Two kinds of sequence in one step:
- decode and verify rows (q_len <= KERNEL_MAX_QUERY): one call of the C kernel for all of them,
  reading each sequence's K/V in place through its block table (`kernels/paged_attention.c`);
- prefill chunks: SDPA per sequence, causal. A chunk that starts at position 0 attends to its
  own fresh K/V; a later chunk gathers its own context (only its own) and takes an offset mask.

`models/attention_reference.py` is the padded gather + SDPA path this replaces, kept as the
reference in tests and for devices and dtypes the kernel does not cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F

from specserve.kernels import attention as kernel

# Sequences feeding at most this many rows go to the kernel; longer ones are prefill chunks.
KERNEL_MAX_QUERY = 32


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
    ) -> torch.Tensor:  # [T, H * D]
        """Write the new K/V into their slots, then attend each query row to its sequence."""
        ...


@dataclass(frozen=True)
class PrefillChunk:
    first: int  # first row of the chunk in the step's flat token array
    num: int  # rows
    ctx_slots: torch.Tensor | None  # [ctx] int64: the whole context's slots, unless start == 0
    mask: torch.Tensor | None  # [num, ctx] bool: True where a row may attend; None = causal


@dataclass(frozen=True)
class RaggedMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot written by each new token
    kernel_seqs: torch.Tensor | None  # [Bk, 3] int64: first row, q_len, ctx_len
    kernel_tables: torch.Tensor | None  # [Bk, max_blocks] int32
    prefill: tuple[PrefillChunk, ...]
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
    ) -> torch.Tensor:
        k_cache.index_copy_(1, self.slot_mapping, k.transpose(0, 1))
        v_cache.index_copy_(1, self.slot_mapping, v.transpose(0, 1))
        out = q.new_empty(q.shape)  # [T, H, D]
        if self.kernel_seqs is not None:
            assert self.kernel_tables is not None
            kernel.paged_attention(
                q, k_cache, v_cache, out, self.kernel_seqs, self.kernel_tables,
                self.block_size, scale, self.window,
            )  # fmt: skip
        for chunk in self.prefill:
            rows = slice(chunk.first, chunk.first + chunk.num)
            if chunk.ctx_slots is None:
                keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)  # [Hkv, n, D]
            else:
                keys = k_cache.index_select(1, chunk.ctx_slots)  # [Hkv, ctx, D]
                values = v_cache.index_select(1, chunk.ctx_slots)
            # Batched 4-D inputs: SDPA's unbatched 3-D form falls back to its slow math path.
            out[rows] = F.scaled_dot_product_attention(
                q[rows].transpose(0, 1)[None],  # [1, H, n, D]
                keys[None],  # [1, Hkv, ctx, D]
                values[None],
                attn_mask=chunk.mask,
                is_causal=chunk.mask is None,
                scale=scale,
                enable_gqa=True,
            )[0].transpose(0, 1)
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
    kernel_seqs: list[tuple[int, int, int]] = []
    kernel_tables: list[list[int]] = []
    prefill: list[PrefillChunk] = []
    first = 0
    for q_len, ctx, table in zip(q_lens, ctx_lens, block_tables, strict=True):
        if q_len <= KERNEL_MAX_QUERY:
            slots += (
                table[p // block_size] * block_size + p % block_size
                for p in range(ctx - q_len, ctx)
            )
            kernel_seqs.append((first, q_len, ctx))
            kernel_tables.append(table)
        else:
            positions = np.arange(ctx)
            ctx_slots = np.asarray(table, dtype=np.int64)[positions // block_size] * block_size
            ctx_slots += positions % block_size
            slots += ctx_slots[ctx - q_len :].tolist()
            prefill.append(_prefill_chunk(first, q_len, ctx, ctx_slots, sliding_window, device))
        first += q_len
    tables = None
    if kernel_tables:
        width = max(len(t) for t in kernel_tables)
        padded = [t + [0] * (width - len(t)) for t in kernel_tables]
        tables = torch.tensor(padded, dtype=torch.int32)
    return RaggedMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        kernel_seqs=torch.tensor(kernel_seqs, dtype=torch.int64) if kernel_seqs else None,
        kernel_tables=tables,
        prefill=tuple(prefill),
        block_size=block_size,
        window=sliding_window,
    )


def _prefill_chunk(
    first: int,
    q_len: int,
    ctx: int,
    ctx_slots: np.ndarray,  # [ctx] int64
    window: int | None,
    device: torch.device,
) -> PrefillChunk:
    start = ctx - q_len
    windowed = window is not None and window < ctx
    if start == 0 and not windowed:  # plain causal over the chunk's own K/V
        return PrefillChunk(first, q_len, None, None)
    q_pos = torch.arange(start, ctx)[:, None]  # [q_len, 1]
    k_pos = torch.arange(ctx)[None, :]  # [1, ctx]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return PrefillChunk(first, q_len, torch.from_numpy(ctx_slots).to(device), mask.to(device))


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
