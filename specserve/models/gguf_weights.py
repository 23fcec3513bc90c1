"""A GGUF's tensors as the decoder takes them, read in place: block rows where a kernel runs
their type, float32 only where one must be (norms, biases, types without a kernel).

Names are llama.cpp's (`blk.N.attn_q.weight`), mapped to transformers' (what
`load_hf_weights` and `attach_blocks` take) per architecture; llama.cpp's q/k row permutation
of the `llama` architecture is undone by a gather of whole rows. Block rows stay views of the
file's mapping until the model packs them (models/huge_pages.py), so nothing is copied twice
and nothing is written to the cache.
"""

from __future__ import annotations

import logging
import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.gguf_file import GGUFFile, TensorInfo
from specserve.models.weight_report import WeightReport

logger = logging.getLogger(__name__)

# llama.cpp's per-layer tensor -> transformers' name under model.layers.N
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Where an architecture names a tensor otherwise (Gemma's sandwich norms, Phi-3's fused gate/up).
_LAYER_BY_ARCH = {
    "gemma3": {
        "ffn_norm": "pre_feedforward_layernorm",
        "post_attention_norm": "post_attention_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
}
_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output.weight": "lm_head.weight",
    "output_norm.weight": "model.norm.weight",
}
# llama.cpp's converter interleaves q/k rows for these (transformers undoes it the same way).
_PERMUTED_ARCHS = ("llama", "mistral")
# llama.cpp stores Gemma's RMSNorm weights as 1 + w; transformers' modules add the 1 back.
_NORM_PLUS_ONE_ARCHS = ("gemma", "gemma2", "gemma3")


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """transformers' name of a GGUF tensor; None for tensors the decoder does not take."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) != 4 or parts[0] != "blk" or parts[3] not in ("weight", "bias"):
        return None
    inner = _LAYER_BY_ARCH.get(arch, {}).get(parts[2]) or _LAYER.get(parts[2])
    return None if inner is None else f"model.layers.{parts[1]}.{inner}.{parts[3]}"


@dataclass
class GGUFWeights:
    """What `read_weights` found: the decoder's tensors and how they are held."""

    blocks: dict[str, tuple[BlockKind, torch.Tensor]] = field(default_factory=dict)  # [out, bytes]
    dense: dict[str, torch.Tensor] = field(default_factory=dict)  # float32, transformers' shapes
    # the file's bytes per GGUF type, and which quantised types were expanded to float32
    bytes_by_type: Counter[str] = field(default_factory=Counter)
    expanded: Counter[str] = field(default_factory=Counter)

    def report(self, block_tensors: int) -> WeightReport:
        return WeightReport(
            dict(self.bytes_by_type), block_tensors, len(self.dense), dict(self.expanded)
        )


def q4_0_as_q4_1(rows: np.ndarray) -> np.ndarray | None:
    """Q4_0 blocks (d, 16 bytes of nibbles; w = d (q - 8)) as Q4_1 blocks (d, m = -8 d, the same
    nibbles; w = d q + m): the same float32 weights (d q and 8 d are exact, and so is their
    difference), in a layout with interleaved kernels. None if some -8 d overflows fp16."""
    blocks = rows.reshape(rows.shape[0], -1, 18)
    d = blocks[..., :2].copy().view(np.float16)  # [rows, nb, 1]
    with np.errstate(over="ignore"):
        m = (d * np.float16(-8)).astype(np.float16)
    if not np.isfinite(m).all():
        return None
    out = np.concatenate([blocks[..., :2], m.view(np.uint8), blocks[..., 2:]], axis=-1)
    return out.reshape(rows.shape[0], -1)


def q5_0_as_q8_0(rows: np.ndarray) -> np.ndarray:
    """Q5_0 blocks (d, 32 high bits, 16 bytes of nibbles; w = d (q - 16), q of 5 bits) as Q8_0
    blocks (d, 32 int8 q - 16): the same weights, in a layout with interleaved kernels."""
    blocks = rows.reshape(rows.shape[0], -1, 22)
    high = blocks[..., 2:6].copy().view("<u4")  # [rows, nb, 1]: bit j is q[j]'s fifth bit
    bits = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    nibbles = np.concatenate([blocks[..., 6:] & 15, blocks[..., 6:] >> 4], axis=-1)
    q = ((nibbles | bits).astype(np.int16) - 16).astype(np.int8)
    return np.concatenate([blocks[..., :2], q.view(np.uint8)], axis=-1).reshape(rows.shape[0], -1)


# GGUF types held as another type's blocks: the same weights, in a layout whose interleaved
# kernel (kernels/x8.c) multiplies a step's rows at a fraction of the plain rows' cost.
TRANSCODED = {
    GGMLQuantizationType.Q4_0: (BlockKind.Q4_1, q4_0_as_q4_1),
    GGMLQuantizationType.Q5_0: (BlockKind.Q8_0, q5_0_as_q8_0),
}


def kernel_kind(qtype: GGMLQuantizationType) -> BlockKind | None:
    """The block kind a kernel runs for this GGUF type here; None: float32."""
    kind = BlockKind.__members__.get(qtype.name)
    return kind if kind in ggml.GGUF_KINDS and ggml.library() is not None else None


def read_weights(gguf: GGUFFile, heads: int, kv_heads: int, keep_blocks: bool) -> GGUFWeights:
    """The decoder's tensors of `gguf`; with `keep_blocks`, every tensor whose type has a kernel
    stays block rows (views of the mapping), the rest is float32."""
    arch = gguf.architecture
    out = GGUFWeights()
    for info in gguf.tensors.values():
        name = hf_name(info.name, arch)
        out.bytes_by_type[info.type.name] += info.nbytes
        if name is None:
            logger.debug("GGUF tensor %s is not used", info.name)
            continue
        rows = _unpermuted(gguf.array(info.name), info, arch, heads, kv_heads)
        kind = kernel_kind(info.type) if keep_blocks and len(info.dims) == 2 else None
        if kind is not None and info.type in TRANSCODED:
            target, transcode = TRANSCODED[info.type]
            held = transcode(rows)
            if held is not None:
                kind, rows = target, held
        if kind is not None:
            with warnings.catch_warnings():  # read-only: nothing writes weights
                warnings.simplefilter("ignore", UserWarning)
                out.blocks[name] = (kind, torch.from_numpy(rows))
            continue
        if info.type not in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            out.expanded[info.type.name] += 1
        out.dense[name] = _float32(rows, info, arch)
    return out


def _unpermuted(
    rows: np.ndarray, info: TensorInfo, arch: str, heads: int, kv_heads: int
) -> np.ndarray:
    """Rows of q and k in transformers' order (a gather of whole rows: blocks stay intact)."""
    if arch not in _PERMUTED_ARCHS or info.name.split(".")[-2] not in ("attn_q", "attn_k"):
        return rows
    return unpermute_rows(rows, heads if ".attn_q." in info.name else kv_heads)


def unpermute_rows(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row interleaving undone: per head, rows (0, 2, 4, ..., 1, 3, ...)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, -1).swapaxes(1, 2).reshape(rows.shape)


def _float32(rows: np.ndarray, info: TensorInfo, arch: str) -> torch.Tensor:
    values = np.asarray(gguf_dequantize(rows, info.type), dtype=np.float32)
    shape = (info.rows, info.row_length) if len(info.dims) > 1 else (info.row_length,)
    out = torch.from_numpy(np.array(values.reshape(shape)))  # our own, writable copy
    if arch in _NORM_PLUS_ONE_ARCHS and info.name.endswith("norm.weight"):
        out -= 1.0
    return out


def dequantised(kind: BlockKind, rows: torch.Tensor) -> torch.Tensor:
    """Block rows of a GGUF type as float32 [rows, in_features], by gguf-py (not our kernel):
    the reference the start-up product check compares our kernels against."""
    qtype = GGMLQuantizationType[kind.plain.name]
    return torch.from_numpy(np.array(gguf_dequantize(rows.numpy(), qtype)))


def warn_expanded(weights: GGUFWeights, source: str) -> None:
    """One warning naming each quantised type that runs as float32 and how many tensors."""
    if weights.expanded:
        shown = ", ".join(f"{n} x {t}" for t, n in sorted(weights.expanded.items()))
        logger.warning(
            "%s: no block kernel here for %s: those tensors run as float32 (slower, 4-8x the "
            "memory); see /info model_weights", source, shown,
        )  # fmt: skip
