"""Paged attention over a float32 or fp16 KV cache (`paged_attention.c`), built on first use with
RoPE (`rope.c`) and the grammar mask (`mask.c`) in one library.

`library()` is None where the CPU lacks AVX2/FMA/F16C or no compiler works; the model then runs
the padded reference attention (gathers + SDPA, `models/attention_reference.py`).
"""

from __future__ import annotations

import ctypes
import logging
from functools import cache
from pathlib import Path

import torch

from specserve.kernels import build

logger = logging.getLogger(__name__)

_UNITS = ("paged_attention", "rope", "mask")
KERNEL = build.KernelSource(
    "paged_attention", tuple(Path(__file__).with_name(f"{unit}.c") for unit in _UNITS),
    build.AVX2_FLAGS, build.AVX2_CPU, "paged attention kernel",
)  # fmt: skip


@cache
def library() -> ctypes.CDLL | None:
    lib = build.load(KERNEL, logger)
    if lib is None:
        return None
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    # q, q_stride, k_cache, v_cache, element size, out, seq_info, tables, max_blocks, B, H, Hkv,
    # D, block_size, scale, window, num_slots, threads
    lib.paged_attention.argtypes = (
        (ptr, i64, ptr, ptr, i64, ptr, ptr, ptr)
        + (i64,) * 6
        + (ctypes.c_float, i64, i64, ctypes.c_int)
    )
    lib.paged_attention.restype = ctypes.c_int
    lib.rope_rotate_half.argtypes = (ptr, i64, i64, i64, i64, i64, ptr, ptr)
    lib.rope_rotate_half.restype = None
    lib.mask_logits.argtypes = (ptr, ptr, i64)
    lib.mask_logits.restype = i64
    return lib


# Element types of the KV cache the kernel reads in place.
CACHE_DTYPES = (torch.float32, torch.float16)


def supports(head_dim: int, num_heads: int, num_kv_heads: int) -> bool:
    """Shapes the kernel takes (it also refuses others at run time)."""
    return head_dim % 8 == 0 and head_dim <= 256 and num_heads % num_kv_heads == 0


def paged_attention(
    q: torch.Tensor,  # [T, H, D] float32; each row's heads contiguous (row stride may differ)
    k_cache: torch.Tensor,  # [Hkv, num_slots, D] float32 or float16, contiguous
    v_cache: torch.Tensor,  # same shape and dtype
    out: torch.Tensor,  # [T, H, D] float32: rows of the listed sequences are written
    seq_info: torch.Tensor,  # [B, 3] int64: first row, q_len, ctx_len per sequence
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    block_size: int,
    scale: float,
    window: int | None,
) -> None:
    """Each listed sequence's rows attend causally (and within `window`) to its cache. A row's
    result depends only on its query, its position and the keys it may see (see the kernel)."""
    lib = library()
    if lib is None:
        raise RuntimeError("paged attention kernel is not available on this machine")
    _, num_heads, head_dim = q.shape
    if q.stride(2) != 1 or q.stride(1) != head_dim or not out.is_contiguous():
        raise ValueError("paged attention needs each query row's heads contiguous")
    if k_cache.dtype not in CACHE_DTYPES or v_cache.dtype != k_cache.dtype:
        raise ValueError(f"paged attention reads float32 or float16 caches, not {k_cache.dtype}")
    rc = lib.paged_attention(
        q.data_ptr(),
        q.stride(0),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.element_size(),
        out.data_ptr(),
        seq_info.data_ptr(),
        block_tables.data_ptr(),
        block_tables.shape[1],
        seq_info.shape[0],
        num_heads,
        k_cache.shape[0],
        head_dim,
        block_size,
        scale,
        window or 0,
        k_cache.shape[1],
        torch.get_num_threads(),
    )
    if rc != 0:
        raise RuntimeError(f"paged attention kernel refused shapes q={list(q.shape)}")


def rope_rotate_half(
    x: torch.Tensor,  # [T, W] float32, rows contiguous; the first n_heads heads rotate
    n_heads: int,
    cos: torch.Tensor,  # [T, R] float32 contiguous: R the rotated dims of a head
    sin: torch.Tensor,
    head_dim: int | None = None,  # D >= R, the heads' width; None: R (whole heads rotate)
) -> None:
    """Rotate-half RoPE in place on each head's first R dims, rounding as x * cos +
    rotate_half(x) * sin does (the rest of the head passes through)."""
    lib = library()
    if lib is None:
        raise RuntimeError("paged attention kernel is not available on this machine")
    rotary = cos.shape[-1]
    dim = head_dim or rotary
    bad = rotary % 2 or rotary > dim or sin.shape != cos.shape or not sin.is_contiguous()
    if bad or x.stride(1) != 1 or x.shape[1] < n_heads * dim or not cos.is_contiguous():
        raise ValueError("rope needs contiguous rows and [T, rotary] tables of even width")
    lib.rope_rotate_half(
        x.data_ptr(), x.stride(0), x.shape[0], n_heads, dim, rotary, cos.data_ptr(),
        sin.data_ptr(),
    )  # fmt: skip


def mask_logits(logits: torch.Tensor, bits: torch.Tensor) -> int:
    """In place on a [V] row: -inf where `bits` (int32 on the CPU, llguidance's bitmask
    layout: token i is bit i % 32 of word i // 32) has token i's bit clear. Returns how many
    tokens are allowed; if none is, the row is left as it was. The kernel takes a contiguous
    float32 row on the CPU; torch does the rest (another device or dtype, no library)."""
    n = min(logits.numel(), 32 * bits.numel())
    lib = library()
    kernel = logits.device.type == "cpu" and logits.dtype == torch.float32
    if lib is not None and kernel and logits.dim() == 1 and logits.stride(0) == 1:
        return int(lib.mask_logits(logits.data_ptr(), bits.contiguous().data_ptr(), n))
    shifts = torch.arange(32, dtype=torch.int32)
    allowed = ((bits.unsqueeze(1) >> shifts) & 1).flatten()[:n]
    count = int(allowed.sum())
    if count:
        logits[:n].masked_fill_(allowed.to(logits.device) == 0, float("-inf"))
    return count
