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
    """Write `model_dir/BLOCKS_FILE` if the kernels run here and the blocks check out."""
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
                logger.warning(
                    "not using GGUF blocks of %s: %s does not decode exactly", gguf_path, name
                )
                return False
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


def load_blocks(model_dir: Path) -> dict[str, tuple[BlockKind, torch.Tensor]]:
    """The blocks `write_blocks` stored for `model_dir`; empty if there are none."""
    path = model_dir / BLOCKS_FILE
    if not path.is_file():
        return {}
    with safe_open(str(path), framework="pt") as f:
        kinds = json.loads((f.metadata() or {}).get(_KIND_KEY, "{}"))
        return {name: (BlockKind[kinds[name]], f.get_tensor(name)) for name in f.keys()}  # noqa: SIM118
