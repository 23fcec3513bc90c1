"""A GGUF model's quantised weights kept in their block format, for the CPU block kernels.

`write_blocks` copies the Q4_1 / Q8_0 tensors of a GGUF file, under transformers names and with
llama.cpp's q/k row permutation undone, into `ggml_blocks.safetensors` beside the dequantised
float32 weights. It writes nothing unless every block tensor dequantises bit-exactly to the
float32 tensor of the same name, so a model served from blocks is the model the float32 path
serves. `load_blocks` reads them back.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind

logger = logging.getLogger(__name__)

BLOCKS_FILE = "ggml_blocks.safetensors"
# Beside the cache when writing the blocks failed: why, so later starts say so once and do not
# retry (delete it to retry).
REFUSED_FILE = "ggml_blocks.refused.json"
_KIND_KEY = "specserve.block_kinds"  # safetensors metadata: JSON {tensor name: kind name}

_LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str | None:
    """transformers name of a llama-family GGUF weight; None for tensors we do not map."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight":
        inner = _LAYER_TENSORS.get(parts[2])
        if inner is not None:
            return f"model.layers.{parts[1]}.{inner}.weight"
    return None


def _unpermute_rows(rows: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row interleaving; rows are whole quantised rows, so it is a gather."""
    half = rows.shape[0] // num_heads // 2
    return rows.reshape(num_heads, half, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def extract_blocks(
    gguf_path: Path, config: dict[str, object]
) -> dict[str, tuple[BlockKind, np.ndarray]]:
    """{transformers name: (kind, uint8 rows [out, row_bytes])} for the block tensors we run."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[-1]).decode() if arch_field is not None else ""
    heads = int(str(config["num_attention_heads"]))
    kv_heads = int(str(config.get("num_key_value_heads") or heads))
    out: dict[str, tuple[BlockKind, np.ndarray]] = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        kind = BlockKind.__members__.get(tensor.tensor_type.name)
        if name is None or kind is None:
            continue
        rows = np.ascontiguousarray(tensor.data)
        if arch == "llama" and ".attn_q." in tensor.name:
            rows = _unpermute_rows(rows, heads)
        elif arch == "llama" and ".attn_k." in tensor.name:
            rows = _unpermute_rows(rows, kv_heads)
        out[name] = (kind, np.array(rows))  # a writable copy of the memory-mapped file
    return out


def write_blocks(gguf_path: Path, model_dir: Path) -> bool:
    """Write `model_dir/BLOCKS_FILE` if the kernels run here and the GGUF has block tensors;
    False if not. ValueError if a block does not decode exactly (nothing is written)."""
    if ggml.library() is None:
        return False
    config = json.loads((model_dir / "config.json").read_text())
    blocks = extract_blocks(gguf_path, config)
    if not blocks:
        return False
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as dense:
        for name, (kind, rows) in blocks.items():
            reference = dense.get_tensor(name)
            decoded = ggml.dequantize(torch.from_numpy(rows), kind, reference.shape[1])
            if not torch.equal(decoded, reference):
                raise ValueError(f"{name} does not decode exactly to its float32 weights")
    tensors = {name: torch.from_numpy(rows) for name, (_, rows) in blocks.items()}
    kinds = json.dumps({name: kind.name for name, (kind, _) in blocks.items()})
    fd, staged = tempfile.mkstemp(prefix=".tmp-blocks-", dir=model_dir)
    os.close(fd)
    try:
        save_file(tensors, staged, metadata={_KIND_KEY: kinds})
        os.replace(staged, model_dir / BLOCKS_FILE)
    finally:
        Path(staged).unlink(missing_ok=True)
    return True


def check_matmul(
    model_dir: Path,
    blocks: dict[str, tuple[BlockKind, torch.Tensor]],
    rows: int = 8,
    q8: bool = False,
) -> str | None:
    """Multiply random activations with a sample of each matrix's block rows through the kernel
    and against its float32 rows from the checkpoint; None if every product agrees to within
    float32 summation error (with `q8`, the q8 product too, within its quantisation error),
    else what differs. Decoding was checked when the blocks were written; this checks the
    product this machine's compiled kernel computes, at start-up."""
    gen = torch.Generator().manual_seed(0)
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as dense:
        for name, (kind, all_rows) in blocks.items():
            n = min(rows, all_rows.shape[0])
            weight = dense.get_slice(name)[:n]  # [n, K] float32
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
