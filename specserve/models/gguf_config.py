"""A GGUF's metadata as the config.json transformers would write for the same model, so that one
description (models/hf_config.py) serves both. Per architecture, what llama.cpp's converter
keeps and what its loader assumes where the file says nothing (Gemma 3's local RoPE base and
layer pattern); a RoPE the file encodes in a form we cannot map back is refused, never dropped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from specserve.models.gguf_file import GGUFFile

# GGUF architecture -> (config.json architectures entry, model_type)
ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "mistral": ("MistralForCausalLM", "mistral"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    "phi3": ("Phi3ForCausalLM", "phi3"),
}
# llama.cpp's Gemma 3: every sixth layer attends in full, the others slide with a RoPE base of
# 10,000 (neither is in the files its converter writes)
GEMMA3_PATTERN, GEMMA3_LOCAL_BASE = 6, 10_000.0
# Llama 3.x's rope_scaling, as its checkpoints give it; a GGUF keeps only the frequency
# factors (rope_freqs), which must be what these give
_LLAMA3 = {
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


class UnsupportedGGUF(ValueError):
    """The file describes a model we cannot describe faithfully; the message says what."""


def config_from_gguf(g: GGUFFile) -> dict[str, Any]:
    arch = g.architecture
    if arch not in ARCHITECTURES:
        raise UnsupportedGGUF(
            f"unsupported architecture {arch!r}; supported: {sorted(ARCHITECTURES)}"
        )

    def key(name: str, default: Any = None) -> Any:
        return g.fields.get(f"{arch}.{name}", default)

    heads = int(key("attention.head_count"))
    hidden = int(key("embedding_length"))
    tokens = g.fields.get("tokenizer.ggml.tokens") or []
    cfg: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch][0]],
        "model_type": ARCHITECTURES[arch][1],
        "vocab_size": int(key("vocab_size", len(tokens))),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(key("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in g.tensors,
        "torch_dtype": "float32",
    }
    for ours, theirs in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        if f"tokenizer.ggml.{theirs}" in g.fields:
            cfg[ours] = int(g.fields[f"tokenizer.ggml.{theirs}"])
    if key("attention.sliding_window") is not None:
        cfg["sliding_window"] = int(key("attention.sliding_window"))
    rope = _rope_scaling(g, arch, cfg)
    if rope is not None:
        cfg["rope_scaling"] = rope
    if arch == "qwen2":
        cfg["attention_bias"] = True
    if arch == "gemma3":
        cfg["sliding_window_pattern"] = int(key("attention.sliding_window_pattern", GEMMA3_PATTERN))
        # the sliding layers' RoPE base, where the converter wrote it (llama.cpp reads it)
        cfg["rope_local_base_freq"] = float(key("rope.freq_base_swa", GEMMA3_LOCAL_BASE))
        cfg["query_pre_attn_scalar"] = _gemma3_attention_scalar(key("attention.scale"), cfg)
        cfg["hidden_activation"] = "gelu_pytorch_tanh"
    if arch == "phi3":
        dims = int(key("rope.dimension_count", cfg["head_dim"]))
        cfg["partial_rotary_factor"] = dims / cfg["head_dim"]
    return cfg


def _gemma3_attention_scalar(scale: Any, cfg: dict[str, Any]) -> int:
    """Gemma 3's query_pre_attn_scalar: from `attention.scale` where the file has one (an
    integer in config.json, which transformers refuses as a float: the GGUF keeps its -1/2
    power in float32, so 24 comes back as 23.999998); else as llama.cpp takes it, which
    llama.cpp's converter never writes: hidden / heads for the 27B (62 layers; its
    config.json says 168), head_dim for the other sizes."""
    if scale:
        return round(1.0 / float(scale) ** 2)
    if cfg["num_hidden_layers"] == 62:
        return int(cfg["hidden_size"] // cfg["num_attention_heads"])
    return int(cfg["head_dim"])


def _rope_scaling(g: GGUFFile, arch: str, cfg: dict[str, Any]) -> dict[str, Any] | None:
    kind = g.fields.get(f"{arch}.rope.scaling.type")
    factor = g.fields.get(f"{arch}.rope.scaling.factor")
    if "rope_freqs.weight" in g.tensors:  # Llama 3.x: per-frequency factors
        return _llama3_from_factors(g, cfg)
    if "rope_factors_long.weight" in g.tensors:  # Phi-3 / Phi-4-mini LongRoPE
        return {
            "rope_type": "longrope",
            "long_factor": _f32(g, "rope_factors_long.weight").tolist(),
            "short_factor": _f32(g, "rope_factors_short.weight").tolist(),
            "original_max_position_embeddings": int(
                g.fields.get(f"{arch}.rope.scaling.original_context_length", 4096)
            ),
        }
    if kind in (None, "none") or factor in (None, 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        original = g.fields.get(f"{arch}.rope.scaling.original_context_length")
        old = int(original or cfg["max_position_embeddings"])
        return {
            "rope_type": "yarn",
            "factor": float(factor),
            "original_max_position_embeddings": old,
        }
    raise UnsupportedGGUF(f"RoPE scaling {kind!r} in the GGUF is not supported")


def _f32(g: GGUFFile, name: str) -> np.ndarray:
    return g.array(name).view(np.float32).reshape(-1)


def llama3_factors(base: float, dim: int, rope: dict[str, Any]) -> list[float]:
    """llama.cpp's rope_freqs for a llama3 rope_scaling: per frequency, what its wavelength is
    divided by (1 at high frequencies, `factor` at low ones, a smooth blend between)."""
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def _llama3_from_factors(g: GGUFFile, cfg: dict[str, Any]) -> dict[str, Any]:
    """llama3 rope_scaling whose frequency factors are the file's rope_freqs (llama.cpp's
    converter computes them from it); refused if Llama 3.x's parameters do not give them."""
    stored = _f32(g, "rope_freqs.weight").astype(np.float64)
    factor = float(stored.max())
    rope = {"rope_type": "llama3", "factor": factor, **_LLAMA3}
    dim = int(g.fields.get("llama.rope.dimension_count", cfg["head_dim"]))
    want = llama3_factors(cfg["rope_theta"], dim, rope)
    if len(want) != stored.size or not np.allclose(stored, want, rtol=1e-4):
        raise UnsupportedGGUF(
            "the GGUF's rope_freqs are not Llama 3.x's llama3 scaling "
            f"(factor {factor}, {_LLAMA3}); other frequency factors are not supported"
        )
    return rope
