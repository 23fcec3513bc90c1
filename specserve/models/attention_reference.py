"""Reference paged attention: every sequence padded to the step's longest query and context.

The first implementation, kept as the reference the ragged path is tested against and as the
path for devices and dtypes the kernel does not cover (cuda, half precision). It gathers
B x Lmax cached rows per layer and runs one padded SDPA, so a step mixing a long prefill chunk
with decode rows costs far more than its parts; `models/attention.py` does not.

Layout: each layer's cache is `[kv_heads, num_slots, head_dim]` for K and for V, where slot =
block * block_size + offset. A step feeds T new tokens from B sequences; sequence b feeds q_len[b]
tokens at absolute positions ctx_len[b] - q_len[b] .. ctx_len[b] - 1 and attends to its first
ctx_len[b] cached positions. The same metadata serves every layer, so it is built once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ReferenceMetadata:
    slot_mapping: torch.Tensor  # [T] int64: cache slot written by each new token
    kv_index: torch.Tensor  # [B, Lmax] int64: cache slots read per sequence (padding -> slot 0)
    q_index: torch.Tensor  # [B, Qmax] int64: row of the flat token array per padded query
    out_index: torch.Tensor  # [T] int64: row of the flat [B*Qmax] output per new token
    mask: torch.Tensor | None  # [B, 1, Qmax, Lmax] bool: True where query may attend key
    full_mask: torch.Tensor | None  # the same without the sliding window, where there is one
    window: int | None
    single: bool  # one sequence: padding gathers are identities and skipped

    def attend(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [Hkv, num_slots, D]
        v_cache: torch.Tensor,
        scale: float,
        full: bool = False,
    ) -> torch.Tensor:  # [T, H * D]
        """As `AttentionMetadata.attend`: `full` ignores the sliding window."""
        mask = self.full_mask if full and self.window is not None else self.mask
        return reference_attention(q, k, v, k_cache, v_cache, self, scale, mask)


def build_metadata(
    q_lens: list[int],
    ctx_lens: list[int],
    block_tables: list[list[int]],
    block_size: int,
    device: torch.device,
    sliding_window: int | None = None,
) -> ReferenceMetadata:
    """Index tensors for one step. q_lens[b] <= ctx_lens[b]; block tables cover ctx_lens[b]."""
    bsz, q_max, l_max = len(q_lens), max(q_lens), max(ctx_lens)
    n_blocks = max(len(t) for t in block_tables)
    tables = torch.tensor([t + [0] * (n_blocks - len(t)) for t in block_tables])  # [B, nblk]
    q_len_t, ctx_t = torch.tensor(q_lens), torch.tensor(ctx_lens)  # [B]
    k_pos = torch.arange(l_max)  # [Lmax]
    kv_index = tables[:, k_pos // block_size] * block_size + k_pos % block_size  # [B, Lmax]
    kv_valid = k_pos[None, :] < ctx_t[:, None]  # [B, Lmax]
    kv_index = torch.where(kv_valid, kv_index, 0)
    starts = ctx_t - q_len_t  # [B]
    new = kv_valid & (k_pos[None, :] >= starts[:, None])  # [B, Lmax]: positions fed this step
    slot_mapping = kv_index[new]  # [T], row-major = flat token order

    q_off = torch.arange(q_max)  # [Qmax]
    q_valid = q_off[None, :] < q_len_t[:, None]  # [B, Qmax]
    first_row = torch.cumsum(q_len_t, 0) - q_len_t  # [B]
    q_index = torch.where(q_valid, first_row[:, None] + q_off[None, :], 0)
    out_index = (torch.arange(bsz)[:, None] * q_max + q_off[None, :])[q_valid]  # [T]

    q_pos = starts[:, None] + q_off[None, :]  # [B, Qmax]
    full = (k_pos[None, None, :] <= q_pos[:, :, None]) & kv_valid[:, None, :]
    # Padded query rows attend to key 0 only, so softmax stays finite; their output is dropped.
    full[:, :, 0] |= ~q_valid
    mask = full
    if sliding_window is not None:
        mask = full & (k_pos[None, None, :] > q_pos[:, :, None] - sliding_window)
        mask[:, :, 0] |= ~q_valid
    return ReferenceMetadata(
        slot_mapping=slot_mapping.to(device),
        kv_index=kv_index.to(device),
        q_index=q_index.to(device),
        out_index=out_index.to(device),
        mask=_or_none(mask, device),
        full_mask=None if sliding_window is None else _or_none(full, device),
        window=sliding_window,
        single=bsz == 1,
    )


def _or_none(mask: torch.Tensor, device: torch.device) -> torch.Tensor | None:
    """[B, 1, Qmax, Lmax] on `device`; None where every query attends every key (as one
    sequence decoding one token, outside any window, does)."""
    return None if bool(mask.all()) else mask.unsqueeze(1).to(device)


def reference_attention(
    q: torch.Tensor,  # [T, H, D]
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    k_cache: torch.Tensor,  # [Hkv, num_slots, D]
    v_cache: torch.Tensor,  # [Hkv, num_slots, D]
    meta: ReferenceMetadata,
    scale: float,
    mask: torch.Tensor | None,  # [B, 1, Qmax, Lmax] (meta.mask or meta.full_mask)
) -> torch.Tensor:  # [T, H * D]
    """Write the new K/V into their slots, then attend each query to its sequence's cache."""
    k_cache.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    bsz, l_max = meta.kv_index.shape
    flat = meta.kv_index.view(-1)
    kv_heads, dim = k_cache.shape[0], k_cache.shape[2]
    # index_select is ~40x cheaper than advanced indexing on a large cache tensor.
    keys = k_cache.index_select(1, flat).view(kv_heads, bsz, l_max, dim).transpose(0, 1)
    values = v_cache.index_select(1, flat).view(kv_heads, bsz, l_max, dim).transpose(0, 1)
    if meta.single:
        queries = q.unsqueeze(0).transpose(1, 2)  # [1, H, T, D]
    else:
        q_max = meta.q_index.shape[1]
        queries = q.index_select(0, meta.q_index.view(-1)).view(bsz, q_max, *q.shape[1:])
        queries = queries.transpose(1, 2)  # [B, H, Qmax, D]
    out = F.scaled_dot_product_attention(
        queries, keys, values, attn_mask=mask, scale=scale, enable_gqa=True
    )  # [B, H, Qmax, D]
    out = out.transpose(1, 2).flatten(2)  # [B, Qmax, H*D]
    return out[0] if meta.single else out.flatten(0, 1).index_select(0, meta.out_index)
