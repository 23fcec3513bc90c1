"""Each family we serve against transformers on a tiny random model of it (float32, exact
numerics): prefill, decode one at a time and a chunk, through our paged attention (both paths),
so sliding windows, per-layer RoPE, q/k norms and scales are all crossed (tests/tiny.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specserve.config import AttentionImpl
from specserve.models.families import model_class
from specserve.models.registry import read_config
from tests.models.test_parity import assert_matches_hf
from tests.tiny import make_gemma3_multimodal_dir, make_model_dir

TABLE = [5, 2, 9, 0, 7, 11, 3, 1, 4, 6, 8, 10]  # scattered blocks on purpose

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,  # wavelengths fall in all three bands
}

# (family, config overrides): Llama 3.x's RoPE scaling and the other kinds a listed family
# uses (linear: Gemma 3's global layers; yarn: Qwen3's long context; longrope: Phi-3.5/4-mini)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama3-rope": ("llama", {"rope_parameters": {"rope_theta": 10000.0, **LLAMA3_ROPE}}),
    "llama-linear-rope": (
        "llama",
        {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}},
    ),
    "qwen3": ("qwen3", {}),
    "qwen3-yarn": (
        "qwen3",
        {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
                "rope_theta": 10000.0,
            }
        },
    ),
    "gemma3": ("gemma3", {}),
    "gemma3-softcap": ("gemma3", {"final_logit_softcapping": 3.0}),
    "phi3": ("phi3", {}),
    "phi3-longrope": (
        "phi3",
        {
            "original_max_position_embeddings": 64,
            "rope_parameters": {
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.5,
                "short_factor": [1.0, 1.5, 2.0, 4.0],
                "long_factor": [2.0, 3.0, 4.0, 8.0],
            },
        },
    ),
}


@pytest.mark.parametrize("attention", ["auto", "reference"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_hf(case: str, attention: AttentionImpl, tmp_path: Path) -> None:
    arch, config = CASES[case]
    model_dir = make_model_dir(tmp_path, arch, with_tokenizer=False, seed=3, config=config)
    assert_matches_hf(model_dir, 320, TABLE, block_size=4, attention=attention)


def test_longrope_long_factors_serve_a_longer_context(tmp_path: Path) -> None:
    """Asked for more than the original context, Phi-3's LongRoPE serves its long factors at
    every position: transformers' numbers over a sequence longer than the original (16 here;
    the test's 30 tokens), where it too takes the long ones. Within the original context, the
    short factors (the case above)."""
    _, config = CASES["phi3-longrope"]
    config = {**config, "original_max_position_embeddings": 16}
    model_dir = make_model_dir(tmp_path, "phi3", with_tokenizer=False, seed=3, config=config)
    assert_matches_hf(model_dir, 320, TABLE, block_size=4, context=64)
    cfg = read_config(model_dir)
    assert model_class(cfg).arch_from_hf(cfg).max_position == 16  # unasked: the original
    long = model_class(cfg).arch_from_hf(cfg, context=64)
    assert long.full_rope.long_context and long.max_position >= 64


@pytest.mark.parametrize("arch", ["gemma3", "qwen3"])
def test_tied_embeddings_match_hf(arch: str, tmp_path: Path) -> None:
    model_dir = make_model_dir(tmp_path, arch, with_tokenizer=False, seed=5, tied=True)
    assert_matches_hf(model_dir, 320, TABLE, block_size=4)


def test_described_as_the_family(tmp_path: Path) -> None:
    """What the description says for the tiny models, which the parity above then holds."""
    families = ("gemma3", "phi3", "qwen3")
    cfgs = {a: read_config(make_model_dir(tmp_path / a, a, with_tokenizer=False)) for a in families}
    gemma = model_class(cfgs["gemma3"]).arch_from_hf(cfgs["gemma3"])
    assert (gemma.norm, gemma.sandwich_norms, gemma.qk_norm) == ("rms_plus_one", True, True)
    assert gemma.activation == "gelu_tanh" and gemma.embed_scale == 8.0
    assert [gemma.window(i) for i in range(2)] == [8, None]
    assert gemma.layer_rope(0).theta == 10000.0 and gemma.layer_rope(0).kind == "default"
    assert gemma.layer_rope(1).theta == 1e6 and gemma.layer_rope(1).kind == "linear"
    assert gemma.attention_scale == 24**-0.5
    phi = model_class(cfgs["phi3"]).arch_from_hf(cfgs["phi3"])
    assert phi.full_rope.rotary_dim == 8 and phi.window(0) is None
    qwen = model_class(cfgs["qwen3"]).arch_from_hf(cfgs["qwen3"])
    assert qwen.qk_norm and not qwen.sandwich_norms and qwen.activation == "silu"


def test_gemma3_multimodal_checkpoint_served_as_text(tmp_path: Path) -> None:
    """Gemma 3 4B and up are published as Gemma3ForConditionalGeneration: its text model's
    logits (no image in the prompt), the vision tower's tensors left unread."""
    model_dir = make_gemma3_multimodal_dir(tmp_path, seed=3, with_tokenizer=False)
    assert read_config(model_dir)["architectures"] == ["Gemma3ForConditionalGeneration"]
    assert_matches_hf(model_dir, 320, TABLE, block_size=4)
