"""config.json -> the model's description, in transformers' current form and the older one on
the Hub; what we cannot serve refused from the config alone, naming what is supported; the
native decoder refusing what it does not implement; plain Llama fingerprints unchanged."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from specserve.models.arch import RopeSpec
from specserve.models.families import model_class
from specserve.models.hf_config import arch_from_hf
from specserve.models.native_stack import refusal

SHAPES: dict[str, Any] = {
    "vocab_size": 320,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


def config(architecture: str, **fields: Any) -> dict[str, Any]:
    return {"architectures": [architecture], **SHAPES, **fields}


def test_gemma3_hub_form_reads_as_the_current_form() -> None:
    """A Gemma 3 config.json as published (top-level RoPE keys, sliding_window_pattern)."""
    hub = config(
        "Gemma3ForCausalLM", head_dim=16, sliding_window=512, sliding_window_pattern=6,
        rope_theta=1e6, rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8},
    )  # fmt: skip
    layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    current = config(
        "Gemma3ForCausalLM", head_dim=16, sliding_window=512, layer_types=layer_types,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    )  # fmt: skip
    arch = arch_from_hf(hub)
    assert arch == arch_from_hf(current)
    assert [arch.window(i) for i in range(6)] == [512] * 5 + [None]
    assert arch.layer_rope(5) == RopeSpec(1e6, 16, "linear", factor=8.0)
    assert arch.layer_rope(0) == RopeSpec(1e4, 16)
    assert arch.attention_scale == 256**-0.5  # query_pre_attn_scalar's default
    assert arch.tie_word_embeddings and arch.embed_scale == 8.0


def test_llama31_hub_form_keeps_its_rope_scaling() -> None:
    """Refused before (models/arch.py); from a GGUF it may have been dropped silently."""
    scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}  # fmt: skip
    arch = arch_from_hf(config("LlamaForCausalLM", rope_theta=500000.0, rope_scaling=scaling))
    assert arch.full_rope == RopeSpec(
        500000.0, 16, "llama3", factor=32.0, high_freq_factor=4.0, original_max_position=8192
    )
    assert refusal(arch) is None  # its tables come from Python: the native decoder runs it


def test_qwen_windows_only_from_max_window_layers() -> None:
    cfg = config(
        "Qwen2ForCausalLM", use_sliding_window=True, sliding_window=32, max_window_layers=4
    )
    arch = arch_from_hf(cfg)
    assert [arch.window(i) for i in range(6)] == [None] * 4 + [32] * 2
    assert arch_from_hf({**cfg, "use_sliding_window": False}).sliding_window is None


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"architectures": ["GPTNeoXForCausalLM"]}, "Gemma3ForCausalLM"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "'llama3'"),
        ({"rope_parameters": {"rope_type": "mrope", "rope_theta": 1e4}}, "'yarn'"),
        ({"hidden_act": "relu"}, "'gelu_pytorch_tanh'"),
        ({"layer_types": ["chunked_attention"] * 6}, "sliding_attention"),
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ],
)
def test_refused_from_the_config_naming_what_is_supported(
    fields: dict[str, Any], named: str
) -> None:
    with pytest.raises(ValueError, match="supported") as err:
        model_class({**config("LlamaForCausalLM"), **fields})
    assert named in str(err.value)


def test_plain_llama_identity_is_the_one_fingerprints_recorded() -> None:
    """Medusa heads record a hash of it (speculation/medusa.py): a plain Llama's must not move
    with the fields the families added (this digest is the one before they existed)."""
    cfg = config("LlamaForCausalLM", rope_theta=100000.0, tie_word_embeddings=True)
    identity = arch_from_hf(cfg).identity()
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    assert digest == "daaa5f9cd3a2f509"
    qwen3 = arch_from_hf(config("Qwen3ForCausalLM")).identity()
    assert qwen3["class"] == "Qwen3ForCausalLM" and qwen3["qk_norm"] is True


@pytest.mark.parametrize(
    ("architecture", "fields", "missing"),
    [
        ("LlamaForCausalLM", {}, None),
        ("MistralForCausalLM", {"sliding_window": 64}, None),
        ("Qwen2ForCausalLM", {}, None),
        ("Qwen3ForCausalLM", {}, None),
        ("Gemma3ForCausalLM", {"head_dim": 16}, None),
        ("Qwen3ForCausalLM", {"head_dim": 12}, "q/k norm over a head dim not a multiple of 8"),
        ("Phi3ForCausalLM", {"partial_rotary_factor": 0.75}, None),
        ("LlamaForCausalLM", {"mlp_bias": True}, "MLP biases"),
    ],
)
def test_native_decoder_refuses_what_it_does_not_implement(
    architecture: str, fields: dict[str, Any], missing: str | None
) -> None:
    reason = refusal(arch_from_hf(config(architecture, **fields)))
    if missing is None:
        assert reason is None
    else:
        assert reason is not None and missing in reason and architecture in reason


def test_supports_keeps_why_it_refuses() -> None:
    """The loader asks `supports`; the model keeps the reason for the loader's log and /info."""
    import torch

    from specserve.models.llama import DecoderLM
    from specserve.models.native_stack import NativeStack

    with torch.device("meta"):
        biased = DecoderLM(arch_from_hf(config("LlamaForCausalLM", mlp_bias=True)))
        llama = DecoderLM(arch_from_hf(config("LlamaForCausalLM")))
    assert not NativeStack.supports(biased)
    assert biased.native_refusal is not None and "MLP biases" in biased.native_refusal
    assert not NativeStack.supports(llama)  # its description would do: its weights are not blocks
    assert llama.native_refusal == "not every projection runs as GGUF blocks"


# config.json as published for the small models people start with (abridged: bookkeeping keys
# left out; Phi-4-mini's 48 LongRoPE factors replaced by ones)
PUBLISHED: dict[str, dict[str, Any]] = {
    "Llama-3.2-1B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "hidden_size": 2048, "intermediate_size": 8192,
        "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 64, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    },
    "Qwen3-0.6B": {
        "architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
        "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
        "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
        "rope_theta": 1000000, "rope_scaling": None, "sliding_window": None,
        "use_sliding_window": False, "max_window_layers": 28, "tie_word_embeddings": True,
        "vocab_size": 151936, "hidden_act": "silu", "attention_bias": False,
    },
    "gemma-3-270m-it": {
        "architectures": ["Gemma3ForCausalLM"], "_sliding_window_pattern": 6,
        "attention_bias": False, "attn_logit_softcapping": None,
        "final_logit_softcapping": None, "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 640,
        "intermediate_size": 2048, "max_position_embeddings": 32768,
        "model_type": "gemma3_text", "num_attention_heads": 4, "num_hidden_layers": 18,
        "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
        "rope_local_base_freq": 10000.0, "rope_scaling": None, "rope_theta": 1000000.0,
        "sliding_window": 512, "use_bidirectional_attention": False, "vocab_size": 262144,
    },
    "Phi-4-mini-instruct": {
        "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
        "num_hidden_layers": 32, "num_attention_heads": 24, "num_key_value_heads": 8,
        "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
        "partial_rotary_factor": 0.75, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "long_factor": [1.0] * 48,
                         "short_factor": [1.0] * 48},
        "sliding_window": 262144, "tie_word_embeddings": True, "vocab_size": 200064,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "lm_head_bias": False,
    },
    "gemma-3-4b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                        "model_type": "gemma3_text", "num_hidden_layers": 34,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                        "sliding_window": 1024},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152},
        "image_token_index": 262144, "mm_tokens_per_image": 256,
    },
}  # fmt: skip


def test_published_configs_read() -> None:
    llama = arch_from_hf(PUBLISHED["Llama-3.2-1B-Instruct"])
    assert llama.full_rope.kind == "llama3" and llama.max_position == 131072
    assert refusal(llama) is None
    qwen = arch_from_hf(PUBLISHED["Qwen3-0.6B"])
    assert qwen.qk_norm and qwen.sliding_window is None and qwen.full_rope.theta == 1e6
    assert qwen.max_position == 40960
    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    qwen_long = arch_from_hf({**PUBLISHED["Qwen3-0.6B"], "rope_scaling": yarn})  # its model card's
    assert qwen_long.full_rope.kind == "yarn" and qwen_long.max_position == 131072
    gemma = arch_from_hf(PUBLISHED["gemma-3-270m-it"])
    assert [gemma.layer_type(i) for i in range(6)] == ["sliding"] * 5 + ["full"]
    assert gemma.layer_type(17) == "full" and gemma.sliding_window == 512
    assert (gemma.layer_rope(0).theta, gemma.layer_rope(5).theta) == (1e4, 1e6)
    assert gemma.embed_scale == 640**0.5 and gemma.attention_scale == 1 / 16
    phi = arch_from_hf(PUBLISHED["Phi-4-mini-instruct"])
    assert phi.full_rope.kind == "longrope" and phi.full_rope.rotary_dim == 96
    assert phi.max_position == 4096  # its short factors serve up to there
    assert phi.full_rope.attention_factor == pytest.approx(
        (1 + math.log(32) / math.log(4096)) ** 0.5
    )


def test_build_refuses_before_reading_weights(tmp_path: Path) -> None:
    """The weights file here is not even safetensors: the config is refused first."""
    import torch

    from specserve.models.registry import build_model

    cfg = config("LlamaForCausalLM", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"unsupported rope type 'dynamic'.*supported: "):
        build_model(tmp_path, torch.device("cpu"))
