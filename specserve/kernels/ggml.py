"""CPU kernels for GGUF block-quantised weights (`ggml_blocks.c`, `q8_*.c`, `x8*.c`), built on
first use.

Two numerics: exact (float32 products on the blocks expanded to float32) and q8 (activations
quantised per row to 8 bits per 32 values, integer dot products; `q8=True`).

Nothing here is required: `library()` returns None (and says why once in the log) when the CPU
lacks AVX2/FMA/F16C or no compiler works, and callers then run on dequantised float32 weights.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from pathlib import Path
from typing import Literal, get_args

import torch

from specserve.kernels import build
from specserve.kernels.block_kinds import GGUF_KINDS as GGUF_KINDS  # re-exported for callers
from specserve.kernels.block_kinds import QK, BlockKind
from specserve.kernels.block_kinds import QK_K as QK_K

logger = logging.getLogger(__name__)

_HERE = Path(__file__).parent
# The exact numerics and the fused projection, the blocks' reading, the q8 numerics on plain and
# interleaved rows and its driver, the interleaved layout; the decoder stack in one call
# (decoder.c, with the paged attention, RoPE and norm units) and the EAGLE chain built on it.
_UNITS = ("ggml_blocks", "subblocks", "q8_dot", "q8_matmul", "x8_layout", "x8", "x8_kquants",
          "norms", "decoder", "eagle_chain", "paged_attention", "rope")  # fmt: skip
KERNEL = build.KernelSource(
    "ggml_blocks", tuple(_HERE / f"{unit}.c" for unit in _UNITS), build.AVX2_FLAGS,
    build.AVX2_CPU, "GGUF block kernels",
)  # fmt: skip
Q8A_BYTES = 40  # a quantised activation block: float32 d, float32 s, 32 int8
X8_ROWS = 8  # weight rows interleaved together in the *_X8 kinds
# A fused projection's gate on [gate, up] input (ggml_blocks.h's GLU_*): models/arch's Activation.
GLU_CODES: dict[str | None, int] = {None: 0, "silu": 1, "gelu_tanh": 2}
SERIAL_DEQUANT_ROWS = 64  # fewer rows than this are decoded without a parallel region


@cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None when this machine cannot run them."""
    lib = build.load(KERNEL, logger)
    if lib is None:
        return None
    c_int, ptr, i64 = ctypes.c_int, ctypes.c_void_p, ctypes.c_int64
    lib.ggml_matmul.argtypes = [c_int, ptr, ptr, ptr, i64, i64, i64, c_int]
    lib.ggml_matmul.restype = None
    lib.ggml_dequantize.argtypes = [c_int, ptr, ptr, i64, i64, c_int]
    lib.ggml_dequantize.restype = None
    lib.ggml_matmul_fused.argtypes = [c_int, ptr, ptr, ptr, i64, i64, i64, c_int]
    lib.ggml_matmul_fused.argtypes += [ptr, ctypes.c_float, c_int, ptr, ptr, c_int]
    lib.ggml_matmul_fused.restype = c_int
    lib.ggml_quantize_q8.argtypes = [ptr, ptr, i64, i64, c_int]
    lib.ggml_quantize_q8.restype = None
    lib.ggml_repack_x8.argtypes = [c_int, ptr, ptr, i64, i64]
    lib.ggml_repack_x8.restype = c_int
    lib.ggml_gather_rows.argtypes = [c_int, ptr, i64, ptr, i64, ptr, i64]
    lib.ggml_gather_rows.restype = c_int
    lib.ggml_q8_path.argtypes = [c_int]
    lib.ggml_q8_path.restype = c_int
    lib.decoder_layers.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, c_int]
    lib.decoder_layers.restype = c_int
    lib.rms_norm_heads.argtypes = [ptr, i64, i64, i64, i64, i64, ptr, ctypes.c_float]
    lib.rms_norm_heads.restype = None
    lib.rms_norm_add.argtypes = [ptr, ptr, ptr, i64, i64, ptr, ctypes.c_float]
    lib.rms_norm_add.restype = None
    lib.eagle_chain.argtypes = [ptr] * 7 + [i64] + [ptr] * 5 + [c_int]
    lib.eagle_chain.restype = c_int
    return lib


def require() -> ctypes.CDLL:
    """The block library; RuntimeError where it cannot be built on this machine."""
    lib = library()
    if lib is None:
        raise RuntimeError("GGUF block kernels are not available on this machine")
    return lib


def check_blocks(blocks: torch.Tensor, kind: BlockKind, in_features: int) -> None:
    """ValueError unless `blocks` are contiguous CPU uint8 rows of `kind` for `in_features`."""
    if in_features % kind.block_values:
        raise ValueError(f"in_features {in_features} is not a multiple of {kind.block_values}")
    expected = kind.row_bytes(in_features)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != expected:
        raise ValueError(
            f"{kind.name} blocks must be uint8 [out, {expected}], got {blocks.dtype} "
            f"{list(blocks.shape)}"
        )
    if not blocks.is_contiguous() or blocks.device.type != "cpu":
        raise ValueError("blocks must be a contiguous CPU tensor")
    if kind.interleaved and blocks.shape[0] % X8_ROWS:
        rows = blocks.shape[0]
        raise ValueError(f"{kind.name} blocks need a multiple of {X8_ROWS} rows, got {rows}")


def repack_x8(blocks: torch.Tensor, kind: BlockKind, in_features: int) -> torch.Tensor:
    """Plain blocks [N, row_bytes] (N a multiple of 8) in their interleaved layout, `kind.x8`:
    the same bytes, eight rows side by side, for the q8 numerics' kernel (`x8_layout.h`)."""
    lib = require()
    check_blocks(blocks, kind, in_features)
    if kind.interleaved or not kind.has_x8 or blocks.shape[0] % X8_ROWS:
        raise ValueError(f"cannot interleave {kind.name} blocks of {blocks.shape[0]} rows")
    out = torch.empty_like(blocks)
    lib.ggml_repack_x8(kind.x8, blocks.data_ptr(), out.data_ptr(), blocks.shape[0], in_features)
    return out


def gather_rows(
    blocks: torch.Tensor, kind: BlockKind, ids: torch.Tensor, in_features: int
) -> torch.Tensor:
    """Rows `ids` of `blocks` (any layout) as plain GGUF rows of `kind.plain` [len(ids), bytes].
    `blocks` must have passed `check_blocks`; ids are checked against its rows here."""
    lib = require()
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    out = torch.empty(ids.numel(), blocks.shape[1], dtype=torch.uint8)
    rows = blocks.shape[0]
    if lib.ggml_gather_rows(
        kind, blocks.data_ptr(), rows, ids.data_ptr(), ids.numel(), out.data_ptr(), in_features
    ):
        raise IndexError(f"row ids must be in [0, {rows})")
    return out


def matmul(
    x: torch.Tensor,
    blocks: torch.Tensor,
    kind: BlockKind,
    threads: int | None = None,
    q8: bool = False,
) -> torch.Tensor:
    """x [M, K] float32 @ W^T -> [M, N], W given as blocks [N, row_bytes]; q8: in the q8
    numerics (x quantised per row and 32-value block, integer dot products)."""
    check_blocks(blocks, kind, x.shape[-1])
    return matmul_checked(x, blocks, kind, threads, q8)


def matmul_checked(
    x: torch.Tensor,
    blocks: torch.Tensor,
    kind: BlockKind,
    threads: int | None = None,
    q8: bool = False,
) -> torch.Tensor:
    """`matmul` for blocks that passed `check_blocks` for x's width once, at construction: the
    per-step path, where re-checking the weights costs more than the call itself."""
    lib = require()
    if x.dtype != torch.float32:
        raise ValueError(f"activations must be float32, got {x.dtype}")
    if q8:
        return matmul_fused(x, blocks, kind, x.shape[-1], threads=threads, q8=True)
    if kind.interleaved:
        raise ValueError(f"{kind.name} blocks multiply in the q8 numerics only")
    x = x.contiguous()
    out = torch.empty(x.shape[0], blocks.shape[0], dtype=torch.float32)
    lib.ggml_matmul(
        kind,
        x.data_ptr(),
        blocks.data_ptr(),
        out.data_ptr(),
        x.shape[0],
        blocks.shape[0],
        x.shape[1],
        threads or torch.get_num_threads(),
    )
    return out


def matmul_fused(
    x: torch.Tensor,  # [M, K] float32, or [M, 2K] with glu
    blocks: torch.Tensor,  # [N, row_bytes], checked once for K
    kind: BlockKind,
    in_features: int,  # K
    norm: tuple[torch.Tensor, float] | None = None,  # RMSNorm (weight [K], eps) on the input
    glu: str | None = None,  # input = act(x[:, :K]) * x[:, K:] (SiLU or GELU-tanh)
    bias: torch.Tensor | None = None,  # [N]
    residual: torch.Tensor | None = None,  # [M, N] float32 contiguous, added to the output
    threads: int | None = None,
    q8: bool = False,  # the q8 numerics: the (normed / gated) input rows quantised to Q8A
) -> torch.Tensor:  # [M, N]
    """`matmul` with the projection's neighbours fused in (see ggml_matmul_fused in the C file):
    one call instead of a norm, a gate, a bias add and a residual add."""
    lib = require()
    if glu not in GLU_CODES:
        raise ValueError(f"no fused gate {glu!r}; known: {[g for g in GLU_CODES if g]}")
    x = x.contiguous()
    width = 2 * in_features if glu else in_features
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != width:
        raise ValueError(f"activations must be float32 [M, {width}], got {x.dtype} {list(x.shape)}")
    out = torch.empty(x.shape[0], blocks.shape[0], dtype=torch.float32)
    if residual is not None and (residual.shape != out.shape or not residual.is_contiguous()):
        raise ValueError(f"residual must be contiguous {list(out.shape)}")
    norm_w, eps = (norm[0].contiguous(), norm[1]) if norm is not None else (None, 0.0)
    rc = lib.ggml_matmul_fused(
        kind, x.data_ptr(), blocks.data_ptr(), out.data_ptr(), x.shape[0], blocks.shape[0],
        in_features, threads or torch.get_num_threads(), pointer(norm_w), eps, GLU_CODES[glu],
        pointer(bias), pointer(residual), int(q8),
    )  # fmt: skip
    if rc == -2:
        raise ValueError(f"{kind.name} blocks multiply in the q8 numerics only")
    if rc == -3:
        raise ValueError(f"{in_features} values are not whole {kind.name} blocks")
    if rc != 0:
        raise MemoryError("block kernel could not allocate its input buffer")
    return out


def pointer(t: torch.Tensor | None) -> int | None:
    """A tensor's address for a C argument that may be NULL."""
    return None if t is None else t.data_ptr()


def dequantize(blocks: torch.Tensor, kind: BlockKind, in_features: int) -> torch.Tensor:
    """The float32 weights [N, in_features] the blocks encode."""
    lib = require()
    check_blocks(blocks, kind, in_features)
    out = torch.empty(blocks.shape[0], in_features, dtype=torch.float32)
    # A few rows (a step's embeddings) in this thread: a parallel region for them cost 45 us a
    # decode step here idle (15 us without) and ~0.7 ms with the other core busy. Rows are
    # decoded independently, so the result is the same.
    threads = 1 if blocks.shape[0] < SERIAL_DEQUANT_ROWS else torch.get_num_threads()
    lib.ggml_dequantize(
        kind, blocks.data_ptr(), out.data_ptr(), blocks.shape[0], in_features, threads
    )
    return out


def quantize_q8(x: torch.Tensor) -> torch.Tensor:
    """x [M, K] float32 -> its Q8A blocks as bytes [M, K/32 * 40] (for tests; see q8_dot.c)."""
    lib = require()
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] % QK:
        raise ValueError(f"activations must be float32 [M, 32 n], got {x.dtype} {list(x.shape)}")
    x = x.contiguous()
    out = torch.empty(x.shape[0], x.shape[1] // QK * Q8A_BYTES, dtype=torch.uint8)
    lib.ggml_quantize_q8(x.data_ptr(), out.data_ptr(), x.shape[0], x.shape[1], 1)
    return out


# The q8 kernels' paths (q8_dot.h), by the number the library uses, and how to force each.
Q8Path = Literal["scalar", "avx2", "vnni"]  # in the order of the library's numbers
Q8_PATHS: tuple[Q8Path, ...] = get_args(Q8Path)
_FORCE = {"scalar": 1, "avx2": 2}


def q8_path() -> Q8Path:
    """Which q8 kernels run: "vnni" (AVX512-VNNI for interleaved rows, AVX2 for the rest) or
    "avx2", whichever is the widest the CPU has (picked at load), or "scalar" (the reference)."""
    return Q8_PATHS[require().ggml_q8_path(-1)]


@contextmanager
def forced_q8(path: Q8Path) -> Iterator[None]:
    """Run the q8 kernels on `path` ("scalar", or "avx2": the narrower path of a VNNI machine)
    inside the block, then on the widest again (tests, benchmarks; not thread-safe: the choice
    is process-wide)."""
    lib = require()
    if path not in _FORCE:
        raise ValueError(f"the q8 path to force must be one of {tuple(_FORCE)}, got {path!r}")
    lib.ggml_q8_path(_FORCE[path])
    try:
        yield
    finally:
        lib.ggml_q8_path(0)


def scalar_q8() -> AbstractContextManager[None]:
    """The q8 kernels on their scalar reference inside the block (see `forced_q8`)."""
    return forced_q8("scalar")
