"""Block weights checked before they serve: `check_matmul` multiplies a sample of each matrix's
rows through this machine's compiled kernel against a float32 reference, at start-up.

The blocks come from a GGUF read in place (models/gguf_weights.py), or from
`ggml_blocks.safetensors` beside an HF checkpoint's float32 weights (`load_blocks`; the tests
write such directories to run block kernels on checkpoints transformers builds).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind

logger = logging.getLogger(__name__)

BLOCKS_FILE = "ggml_blocks.safetensors"
_KIND_KEY = "specserve.block_kinds"  # safetensors metadata: JSON {tensor name: kind name}

# name, the block rows' count -> the float32 rows [n, K] a sample of n rows must equal
Reference = Callable[[str, int], torch.Tensor]


def checkpoint_rows(model_dir: Path) -> Reference:
    """Rows of the float32 weights beside the blocks in an HF directory."""

    def rows(name: str, n: int) -> torch.Tensor:
        with safe_open(str(model_dir / "model.safetensors"), framework="pt") as dense:
            return dense.get_slice(name)[:n]

    return rows


def check_matmul(
    reference: Reference,
    blocks: dict[str, tuple[BlockKind, torch.Tensor]],
    rows: int = 8,
    q8: bool = False,
) -> str | None:
    """Multiply random activations with a sample of each matrix's block rows through the kernel
    and against its float32 rows from `reference`; None if every product agrees to within
    float32 summation error (with `q8`, the q8 product too, within its quantisation error),
    else what differs: this checks the product this machine's compiled kernel computes."""
    gen = torch.Generator().manual_seed(0)
    for name, (kind, all_rows) in blocks.items():
        n = min(rows, all_rows.shape[0])
        weight = reference(name, n)  # [n, K] float32
        x = torch.randn(9, weight.shape[1], generator=gen)  # 9: both row-tile paths
        # One thread: a few rows gain nothing from more, and a busy machine stalls them.
        sample = all_rows[:n].contiguous()
        got = ggml.matmul(x, sample, kind, threads=1)
        want = x @ weight.T
        problem = _off_bound(f"{name}: block kernel", got, want, _f32_bound(x, weight))
        if problem is None and q8:
            got = ggml.matmul(x, sample, kind, threads=1, q8=True)
            bound = _q8_bound(x, weight) + _f32_bound(x, weight)
            problem = _off_bound(f"{name}: q8 block kernel", got, want, bound, "q8")
        if problem is not None:
            return problem
    return None


def _f32_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [M, N]
    """|sum error| <= K * eps * sum |x w| for float32 summation in any order."""
    return weight.shape[1] * 2.0**-23 * (x.abs() @ weight.abs().T) + 1e-30


def _q8_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # [M, N]
    """Quantising x per 32-value block moves each value by at most amax / 254 (half a step of
    amax / 127): |q8 error| <= sum_j amax_blk(j) / 254 * |w_j|, plus float32 rounding."""
    m, k = x.shape
    step = x.abs().view(m, k // ggml.QK, ggml.QK).amax(-1) / 254  # [M, K / 32]
    return (step.repeat_interleave(ggml.QK, dim=1) @ weight.abs().T) * (1 + 1e-5)


def _off_bound(
    what: str, got: torch.Tensor, want: torch.Tensor, bound: torch.Tensor, kind: str = "float32"
) -> str | None:
    if bool(((got - want).abs() <= bound).all()):
        return None
    worst = float(((got - want).abs() / bound).max())
    return f"{what} product off by {worst:.3g}x the {kind} bound"


def load_blocks(model_dir: Path) -> dict[str, tuple[BlockKind, torch.Tensor]]:
    """The blocks `write_blocks` stored for `model_dir`; empty if there are none."""
    path = model_dir / BLOCKS_FILE
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="pt") as f:
        kinds = json.loads((f.metadata() or {}).get(_KIND_KEY, "{}"))
        return {name: (BlockKind[kinds[name]], f.get_tensor(name)) for name in f.keys()}  # noqa: SIM118
