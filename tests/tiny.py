"""Tiny random-weight checkpoints (HF layout) and a tiny byte-level BPE tokenizer."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

TEXT = (
    "def add(a, b):\n    return a + b\n\n"
    "The quick brown fox jumps over the lazy dog. "
    * 4
    + "Speculative decoding proposes tokens and verifies them in one pass.\n"
)


def make_tokenizer(out_dir: Path, vocab_size: int = 320) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token="<|im_start|>"
    )
    fast.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    fast.save_pretrained(str(out_dir))


def make_model_dir(
    out_dir: Path,
    arch: str = "llama",
    vocab_size: int = 320,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    with_tokenizer: bool = True,
    tied: bool = False,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write config.json + model.safetensors for a tiny random model of the given family
    (`FAMILY_CONFIG` adds what each needs to be tiny and to show its features; `config`
    overrides any field)."""
    import transformers

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        eos_token_id=2,
        bos_token_id=1,
    )
    cfg_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "gemma3": (transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM),
        "phi3": (transformers.Phi3Config, transformers.Phi3ForCausalLM),
    }[arch]
    extra = {"sliding_window": 24} if arch == "mistral" else {}
    fields = {**common, **extra, **FAMILY_CONFIG.get(arch, {}), **(config or {})}
    hf_config = cfg_cls(**copy.deepcopy(fields))  # transformers fills nested dicts in
    torch.manual_seed(seed)
    model = model_cls(hf_config).float()
    # Random init gives near-uniform logits; a larger output projection gives clear argmax
    # margins and varied, partly repetitive text (a tied model would just echo its input).
    if not tied:
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(20.0)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    if with_tokenizer:
        make_tokenizer(out_dir, vocab_size)
    return out_dir


# What each newer family needs on top of the common tiny shapes: head_dim where its default is
# not hidden / heads; for Gemma 3 a window (8) shorter than the parity tests' 30 tokens, one
# sliding and one full layer, each with its RoPE (the full one linearly scaled, as Gemma 3 4B+
# is), and an attention scale that is not head_dim's; for Phi-3 partial rotary.
FAMILY_CONFIG: dict[str, dict[str, Any]] = {
    "qwen3": {"head_dim": 16},
    "gemma3": {
        "head_dim": 16,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"],
        "query_pre_attn_scalar": 24,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
        },
        "pad_token_id": 0,
    },
    "phi3": {"partial_rotary_factor": 0.5, "pad_token_id": 0},
}


def make_gemma3_multimodal_dir(out_dir: Path, seed: int = 0, with_tokenizer: bool = True) -> Path:
    """A tiny Gemma3ForConditionalGeneration (a one-layer vision tower beside FAMILY_CONFIG's
    text model, weights under language_model.*), as Gemma 3 4B and up are published."""
    import transformers

    text = {
        "vocab_size": 320,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "eos_token_id": 2,
        "bos_token_id": 1,
        **copy.deepcopy(FAMILY_CONFIG["gemma3"]),
    }
    vision = {
        "model_type": "siglip_vision_model",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
    }
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=4
    )
    torch.manual_seed(seed)
    model = transformers.Gemma3ForConditionalGeneration(config).float()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    if with_tokenizer:
        make_tokenizer(out_dir, 320)
    return out_dir


def noisy_copy(model_dir: Path, out: Path, noise: float = 0.1, seed: int = 1) -> Path:
    """`model_dir` copied to `out` with `noise` x std Gaussian noise on every matrix: a draft
    that agrees with its target often, not always."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(model_dir, out, dirs_exist_ok=True)
    weights = load_file(str(model_dir / "model.safetensors"))
    gen = torch.Generator().manual_seed(seed)
    for name, w in weights.items():
        if w.ndim == 2:
            weights[name] = w + noise * w.std() * torch.randn(w.shape, generator=gen)
    save_file(weights, str(out / "model.safetensors"))
    return out


TINY_CONTEXT = 4096  # long enough that a request of thousands of tokens lasts seconds


def make_tiny_model(path: Path) -> Path:
    """A tiny Llama whose context is stretched to TINY_CONTEXT (RoPE has no learnt positions)."""
    import json

    make_model_dir(path, "llama")
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = TINY_CONTEXT
    (path / "config.json").write_text(json.dumps(config))
    return path
