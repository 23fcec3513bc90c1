"""GGUF files the tests write: a tiny HF checkpoint (tests/tiny.py) as llama.cpp's converter
would write it (its tensor names, q/k rows permuted, a gpt2 tokenizer), each matrix in the GGUF
type the test asks for. gguf-py quantises the 32-value types; K-quant tensors get random valid
blocks (random codes, small positive fp16 scales), and the model is then whatever those blocks
decode to."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from specserve.models.gguf_config import llama3_factors

T = GGMLQuantizationType
# the offsets of a K-quant block's fp16 scales (d, and dmin where it has one)
_K_HALVES = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,)}
K_QUANTS = tuple(_K_HALVES)

_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


# where a family's converter names a tensor otherwise (llama.cpp's tensor tables)
_LAYER_BY_ARCH = {
    "gemma3": {
        "post_attention_layernorm": "post_attention_norm",
        "pre_feedforward_layernorm": "ffn_norm",
        "post_feedforward_layernorm": "post_ffw_norm",
    },
    "phi3": {"self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"},
}
_LAYER.update({"self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"})


def gguf_name(hf: str, arch: str = "llama") -> str:
    if not hf.startswith(("model.", "lm_head.")):
        return hf  # already a GGUF name (rope_freqs.weight)
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, *inner, kind = hf.split(".")
    part = ".".join(inner)
    return f"blk.{layer}.{_LAYER_BY_ARCH.get(arch, {}).get(part) or _LAYER[part]}.{kind}"


def random_k_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int) -> np.ndarray:
    """Valid K-quant blocks [rows, bytes]: random bytes (any code of a quant or sub-block scale
    is valid), then each fp16 d set to a small positive value, and each dmin to the d that
    centres the weights (w = d sc q - dmin mn with random sc, q, mn: dmin = d mean(q)), so that
    the matrix is not dominated by its offsets."""
    block, size = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    out = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    d = rng.uniform(1e-3, 4e-3, (rows, cols // block))
    mean_q = {T.Q2_K: 1.5, T.Q4_K: 7.5, T.Q5_K: 15.5}.get(qtype, 0.0)
    for at, value in zip(_K_HALVES[qtype], (d, d * mean_q), strict=False):
        halves = value.astype(np.float16)
        out[:, :, at : at + 2] = halves.view(np.uint8).reshape(rows, cols // block, 2)
    return out.reshape(rows, -1)


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: HF's half-split rotary pairs -> interleaved rows."""
    pairs = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
    return pairs.swapaxes(1, 2).reshape(w.shape)


def write_gguf(
    model_dir: Path,
    out: Path,
    qtype: Callable[[str], GGMLQuantizationType],
    arch: str = "llama",
    seed: int = 0,
) -> Path:
    """`model_dir` (a tests/tiny.py checkpoint with its tokenizer) as a GGUF at `out`, each
    matrix (by its GGUF name) of `qtype(name)`; norms stay F32."""
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = GGUFWriter(str(out), arch)
    w.add_name(out.stem)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    partial = cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get(
        "partial_rotary_factor", 1.0
    )
    rope_dims = int(head_dim * partial)
    w.add_rope_dimension_count(rope_dims)
    tensors = load_file(str(model_dir / "model.safetensors"))
    _add_family(w, arch, cfg, head_dim, tensors)
    _add_tokenizer(w, model_dir, cfg)
    for i, (hf, value) in enumerate(sorted(tensors.items())):
        name = gguf_name(hf, arch)
        data = value.astype(np.float32)
        if arch == "gemma3" and name.endswith("norm.weight"):
            data = data + np.float32(1.0)  # llama.cpp stores Gemma's norms as 1 + w
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            data = _permute(data, heads if "attn_q" in name else kv_heads)
        t = qtype(name) if data.ndim == 2 else T.F32
        if t in K_QUANTS:
            raw = random_k_blocks(t, data.shape[0], data.shape[1], seed + i)
        else:
            raw = quantize(data, t) if t != T.F32 else data
        w.add_tensor(name, raw, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def _add_family(
    w: GGUFWriter, arch: str, cfg: dict[str, Any], head_dim: int, tensors: dict[str, np.ndarray]
) -> None:
    """What llama.cpp's converter writes of each family's RoPE, window and scales."""
    rope = cfg.get("rope_parameters") or {}
    if arch == "gemma3":
        rope = rope.get("full_attention", rope)
        w.add_sliding_window(cfg["sliding_window"])
        w.add_uint32("gemma3.attention.sliding_window_pattern", 2)  # the tiny model's
        w.add_float32("gemma3.attention.scale", cfg["query_pre_attn_scalar"] ** -0.5)
        assert cfg["layer_types"] == ["sliding_attention", "full_attention"]
    w.add_rope_freq_base(rope.get("rope_theta") or cfg["rope_theta"])
    kind = rope.get("rope_type", "default")
    if kind == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    elif kind == "llama3":  # the frequency factors, as llama.cpp's converter computes them
        factors = llama3_factors(rope["rope_theta"], head_dim, rope)
        tensors["rope_freqs.weight"] = np.array(factors, dtype=np.float32)
    else:
        assert kind == "default", kind


def _add_tokenizer(w: GGUFWriter, model_dir: Path, cfg: dict[str, object]) -> None:
    """The checkpoint's byte-level BPE as llama.cpp's `gpt2` tokenizer model."""
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {t["content"]: t["id"] for t in tok["added_tokens"]}
    vocab.update(special)
    size = int(str(cfg["vocab_size"]))
    tokens = [f"[PAD{i}]" for i in range(size)]
    types = [5] * size  # unused
    for text, i in vocab.items():
        tokens[i], types[i] = text, 3 if text in special else 1  # control / normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(special["<|im_start|>"])
    w.add_eos_token_id(special["<|im_end|>"])
    jinja = model_dir / "chat_template.jinja"
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    template = jinja.read_text() if jinja.is_file() else config.get("chat_template")
    if template:
        w.add_chat_template(template)
