"""ctypes side of `norms.h`: RMSNorms outside a projection, in the block library (the q/k norm
of each head, and x + norm(y) for Gemma 3's sandwich norms). The Python layer on GGUF blocks calls
these; the native decoder calls the same C functions in its layer loop."""

from __future__ import annotations

import torch

from specserve.kernels import ggml


def rms_norm_heads(
    qkv: torch.Tensor,  # [T, width] float32 contiguous, heads of `dim` floats: normed in place
    first: int,
    count: int,
    dim: int,
    weight: torch.Tensor,  # [dim] float32 contiguous
    eps: float,
) -> None:
    """RMSNorm of heads first .. first + count - 1 of every row, in place (norms.h)."""
    lib = ggml.require()
    if dim % 8 or (first + count) * dim > qkv.shape[1] or not _rows_ok(qkv, weight):
        raise ValueError(f"heads {first}..{first + count} of {dim} in {list(qkv.shape)}")
    lib.rms_norm_heads(
        qkv.data_ptr(), qkv.shape[1], qkv.shape[0], first, count, dim, weight.data_ptr(), eps
    )


def rms_norm_add(
    x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x + RMSNorm(y) with `weight` [K], per row of x, y [T, K] (norms.h): a new tensor."""
    lib = ggml.require()
    if x.shape != y.shape or y.shape[1] % 8 or not _rows_ok(x, y, weight):
        raise ValueError(f"x {list(x.shape)} and y {list(y.shape)}: float32 rows of 8k values")
    out = torch.empty_like(x)
    lib.rms_norm_add(
        y.data_ptr(), x.data_ptr(), out.data_ptr(), y.shape[0], y.shape[1], weight.data_ptr(), eps
    )
    return out


def _rows_ok(*tensors: torch.Tensor) -> bool:
    return all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors
    )
