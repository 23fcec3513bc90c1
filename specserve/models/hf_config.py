"""config.json -> `ModelArch`: the Llama-like families we serve, each a `Family` record.

A family fixes what its config.json does not say (Gemma's (1 + w) norms, Qwen2's q/k/v
biases) and the defaults transformers' config class would fill in for a missing key; the rest
is read from the file. What we cannot honour (an unknown RoPE type or activation, attention
logit soft-capping, ...) is refused here, from config.json alone, before any weight is read.

Tensor names are transformers' own: our modules are named as theirs, less `model.`,
`self_attn.` and `mlp.`, with q/k/v and gate/up fused (`DecoderLM.load_hf_weights`); a family
whose checkpoint stores them fused already (Phi-3) loads as is, and one whose text model sits
under another prefix (a multimodal checkpoint) says so in its record (`checkpoint_name`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from specserve.models.arch import Activation, LayerType, ModelArch, NormKind, RopeSpec
from specserve.models.rope_config import rope_spec

# how a config.json without `layer_types` says which layers slide: every layer (when it
# has a sliding_window), Qwen's layers from max_window_layers on (when use_sliding_window),
# or Gemma 3's all but every sliding_window_pattern-th
WindowRule = Literal["all", "qwen", "gemma"]


@dataclass(frozen=True)
class Family:
    """What one HF architecture fixes (see the module docstring)."""

    architecture: str  # config.json's `architectures` entry
    model_type: str
    defaults: tuple[tuple[str, Any], ...] = ()  # config keys transformers would fill in
    windows: WindowRule = "all"
    qkv_bias: bool | None = None  # None: config's attention_bias
    o_bias: bool | None = None  # None: config's attention_bias
    norm: NormKind = "rms"
    sandwich_norms: bool = False
    qk_norm: bool = False
    scaled_embeddings: bool = False  # embeddings times sqrt(hidden_size)
    local_rope_base: bool = False  # sliding layers' RoPE base is rope_local_base_freq (old form)
    # a multimodal checkpoint served as text: the decoder's config is config.json's text_config
    text_config: bool = False
    renames: tuple[tuple[str, str], ...] = ()  # checkpoint name prefix -> transformers' own
    ignored: tuple[str, ...] = ()  # checkpoint name prefixes of what is not served (vision)


_LLAMA_DEFAULTS = (("rope_theta", 10000.0), ("rms_norm_eps", 1e-6), ("hidden_act", "silu"))
# Gemma3TextConfig's defaults: a multimodal checkpoint's text_config often lists only a few keys
_GEMMA3_DEFAULTS = (
    ("vocab_size", 262_208),
    ("hidden_size", 2304),
    ("intermediate_size", 9216),
    ("num_hidden_layers", 26),
    ("num_attention_heads", 8),
    ("num_key_value_heads", 4),
    ("head_dim", 256),
    ("max_position_embeddings", 131_072),
    ("rope_theta", 1_000_000.0),
    ("rope_local_base_freq", 10_000.0),
    ("rms_norm_eps", 1e-6),
    ("hidden_activation", "gelu_pytorch_tanh"),
    ("sliding_window", 4096),
    ("sliding_window_pattern", 6),
    ("query_pre_attn_scalar", 256),
    ("tie_word_embeddings", True),
)
_GEMMA3: dict[str, Any] = dict(
    windows="gemma",
    norm="rms_plus_one",
    sandwich_norms=True,
    qk_norm=True,
    scaled_embeddings=True,
    local_rope_base=True,
)

FAMILIES: dict[str, Family] = {
    f.architecture: f
    for f in (
        Family("LlamaForCausalLM", "llama", _LLAMA_DEFAULTS),
        Family("MistralForCausalLM", "mistral", _LLAMA_DEFAULTS, qkv_bias=False, o_bias=False),
        Family("Qwen2ForCausalLM", "qwen2", _LLAMA_DEFAULTS, "qwen", qkv_bias=True, o_bias=False),
        Family("Qwen3ForCausalLM", "qwen3", _LLAMA_DEFAULTS, "qwen", qk_norm=True),
        Family("Gemma3ForCausalLM", "gemma3_text", _GEMMA3_DEFAULTS, **_GEMMA3),
        Family(
            "Gemma3ForConditionalGeneration",  # Gemma 3 4B and up as published: text only
            "gemma3",
            _GEMMA3_DEFAULTS,
            **_GEMMA3,
            text_config=True,
            renames=(
                ("language_model.model.", "model."),
                ("model.language_model.", "model."),
                ("language_model.lm_head.", "lm_head."),
            ),
            ignored=(
                "vision_tower.",
                "multi_modal_projector.",
                "model.vision_tower.",
                "model.multi_modal_projector.",
            ),
        ),
        Family(
            "Phi3ForCausalLM",
            "phi3",
            (("rope_theta", 10000.0), ("rms_norm_eps", 1e-5), ("hidden_act", "silu")),
            qkv_bias=False,
            o_bias=False,
        ),
    )
}

ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
}
_LAYER_TYPES: dict[str, LayerType] = {"full_attention": "full", "sliding_attention": "sliding"}


def family_of(cfg: dict[str, Any]) -> Family:
    """The family of config.json's first listed architecture we serve (by `model_type` where
    it lists none); ValueError naming the supported ones otherwise."""
    archs = cfg.get("architectures") or []
    for name in archs:
        if name in FAMILIES:
            return FAMILIES[name]
    by_type = {f.model_type: f for f in FAMILIES.values()}
    if not archs and cfg.get("model_type") in by_type:
        return by_type[cfg["model_type"]]
    raise ValueError(
        f"unsupported architecture {archs or cfg.get('model_type')!r}; "
        f"supported: {sorted(FAMILIES)}"
    )


def arch_from_hf(cfg: dict[str, Any], context: int | None = None) -> ModelArch:
    """The description of the model config.json describes (ValueError where we cannot)."""
    family = family_of(cfg)
    if family.text_config:  # the top level's tie_word_embeddings is the one transformers ties by
        tied = {"tie_word_embeddings": cfg.get("tie_word_embeddings", True)}
        cfg = {**(cfg.get("text_config") or {}), **tied}
    cfg = {**dict(family.defaults), **{k: v for k, v in cfg.items() if v is not None}}
    _refuse_unsupported(cfg)
    num_heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // num_heads
    max_position = cfg.get("max_position_embeddings", 4096)
    types = _layer_types(cfg, family)
    sliding = "sliding" in types
    rope = rope_spec(cfg, "full_attention", head_dim, max_position, family.local_rope_base)
    local = rope_spec(cfg, "sliding_attention", head_dim, max_position, family.local_rope_base)
    if rope.kind == "longrope":
        # its short factors within the original context; its long ones where the served
        # `context` (--max-model-len) asks for more
        if context is not None and context > rope.original_max_position and rope.long_factor:
            rope = replace(rope, long_context=True)
        else:
            max_position = min(max_position, rope.original_max_position)
    if rope.kind == "yarn":  # what YaRN stretches the original context to (as vLLM serves it)
        max_position = max(max_position, int(rope.original_max_position * rope.factor))
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelArch(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=rope.theta,
        max_position=max_position,
        tie_word_embeddings=cfg.get("tie_word_embeddings", False),
        attention_bias=attention_bias if family.qkv_bias is None else family.qkv_bias,
        sliding_window=cfg["sliding_window"] if sliding else None,
        architecture=family.architecture,
        rope=rope,
        local_rope=local if sliding and local != rope else None,
        layer_types=types if len(set(types)) > 1 else (),
        o_bias=attention_bias if family.o_bias is None else family.o_bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        norm=family.norm,
        sandwich_norms=family.sandwich_norms,
        qk_norm=family.qk_norm,
        activation=_activation(cfg),
        embed_scale=cfg["hidden_size"] ** 0.5 if family.scaled_embeddings else 1.0,
        query_pre_attn_scalar=cfg.get("query_pre_attn_scalar"),
        final_logit_softcap=cfg.get("final_logit_softcapping"),
    )


def checkpoint_name(arch: ModelArch, name: str) -> str | None:
    """A checkpoint tensor's name as transformers' text model spells it (`model.layers...`);
    None for a tensor of what is not served."""
    family = FAMILIES.get(arch.architecture)
    if family is None:
        return name
    if name.startswith(family.ignored):
        return None
    for theirs, ours in family.renames:
        if name.startswith(theirs):
            return ours + name.removeprefix(theirs)
    return name


def _refuse_unsupported(cfg: dict[str, Any]) -> None:
    if cfg.get("attn_logit_softcapping") is not None:
        raise ValueError("attn_logit_softcapping in config.json is not supported")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention in config.json is not supported")


def _activation(cfg: dict[str, Any]) -> Activation:
    name = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if name not in ACTIVATIONS:
        raise ValueError(
            f"unsupported activation {name!r} in config.json; supported: {sorted(ACTIVATIONS)}"
        )
    return ACTIVATIONS[name]


def _layer_types(cfg: dict[str, Any], family: Family) -> tuple[LayerType, ...]:
    """Each layer's attention: config.json's `layer_types`, else the family's rule."""
    n, window = cfg["num_hidden_layers"], cfg.get("sliding_window")
    listed = cfg.get("layer_types")
    if listed is not None:
        unknown = sorted(set(listed) - set(_LAYER_TYPES))
        if unknown or len(listed) != n:
            raise ValueError(
                f"layer_types in config.json: {unknown or len(listed)} (supported: "
                f"{sorted(_LAYER_TYPES)}, one per layer)"
            )
        types = tuple(_LAYER_TYPES[t] for t in listed)
    elif family.windows == "gemma":
        pattern = cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6
        types = tuple("full" if (i + 1) % pattern == 0 else "sliding" for i in range(n))
    elif family.windows == "qwen" and cfg.get("use_sliding_window", False):
        first = cfg.get("max_window_layers", n)
        types = tuple("sliding" if i >= first else "full" for i in range(n))
    else:
        types = ("full" if family.windows == "qwen" else "sliding",) * n
    if window is None:
        if "sliding" in types and family.windows != "all":
            raise ValueError("sliding layers in config.json without a sliding_window")
        return ("full",) * n
    return types


__all__ = ["FAMILIES", "Family", "RopeSpec", "arch_from_hf", "checkpoint_name", "family_of"]
