"""A model's architecture as data: what the decoder, the KV cache and the heads read.

One `ModelArch` describes one checkpoint: its shapes, and where Llama-like families differ
(norms, activation, q/k norm, RoPE and attention window per layer, scales, soft-cap, biases).
`models/hf_config.py` reads it from config.json; the torch decoder (`models/llama.py`) runs
what it says, and the native decoder (`models/native_stack.py`) refuses what it does not run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

# x / rms(x) * w, or * (1 + w) (Gemma, whose checkpoints store the norm weights minus one)
NormKind = Literal["rms", "rms_plus_one"]
# the MLP's gate: silu(gate) * up (SwiGLU) or gelu_tanh(gate) * up (GeGLU)
Activation = Literal["silu", "gelu_tanh"]
RopeKind = Literal["default", "linear", "llama3", "yarn", "longrope"]
# full: attends to the whole context; sliding: to the last `sliding_window` positions
LayerType = Literal["full", "sliding"]


@dataclass(frozen=True)
class RopeSpec:
    """Rotate-half RoPE over the first `rotary_dim` dims of each head (the rest pass through).

    Inverse frequencies theta^(-2i/rotary_dim), then per `kind` (transformers'
    modeling_rope_utils): linear divides them all by `factor`; llama3 divides the low ones
    (wavelength > original / low_freq_factor) by `factor`, keeps the high ones (wavelength <
    original / high_freq_factor) and blends between; yarn blends interpolated (/ factor) and
    extrapolated frequencies by a ramp over the dims between beta_fast and beta_slow rotations;
    longrope divides frequency i by short_factor[i], or by long_factor[i] where the served
    context is longer than the original (`long_context`: chosen once, for every position, as
    llama.cpp does; transformers switches per forward by its length, which a cache of earlier
    positions' keys cannot follow). cos and sin are then multiplied by
    `attention_factor` (YaRN's and LongRoPE's magnitude correction; 1 otherwise).
    """

    theta: float
    rotary_dim: int
    kind: RopeKind = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    attention_factor: float = 1.0
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()
    long_context: bool = False  # longrope: the long factors serve

    def __post_init__(self) -> None:
        if self.rotary_dim <= 0 or self.rotary_dim % 2:
            raise ValueError(f"RoPE over {self.rotary_dim} dims: must be even and positive")
        if self.kind == "longrope" and len(self.short_factor) != self.rotary_dim // 2:
            raise ValueError(f"longrope needs {self.rotary_dim // 2} short_factor values")
        if self.long_context and len(self.long_factor) != self.rotary_dim // 2:
            raise ValueError(f"longrope needs {self.rotary_dim // 2} long_factor values")


@dataclass(frozen=True)
class ModelArch:
    """The description of one model (see the module docstring). The fields up to
    `sliding_window` are the ones every family has; the rest default to Llama's behaviour."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float  # the full-attention layers' RoPE base (also in `rope`)
    max_position: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # biases on q, k and v
    sliding_window: int | None = None  # the window of the layers `layer_types` marks sliding
    architecture: str = "LlamaForCausalLM"  # the HF class this describes (config.json)
    rope: RopeSpec | None = None  # full-attention layers; None: default RoPE of rope_theta
    local_rope: RopeSpec | None = None  # sliding layers, where theirs differs (Gemma 3)
    layer_types: tuple[LayerType, ...] = ()  # per layer, where layers differ; () = all alike
    o_bias: bool = False  # a bias on the attention output projection
    mlp_bias: bool = False  # biases on gate, up and down
    norm: NormKind = "rms"  # every RMSNorm's kind, q/k norms included
    sandwich_norms: bool = False  # also a norm on the attention's and the MLP's outputs (Gemma 3)
    qk_norm: bool = False  # RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
    activation: Activation = "silu"
    embed_scale: float = 1.0  # embeddings multiplied by it (Gemma: sqrt(hidden_size))
    query_pre_attn_scalar: float | None = None  # attention scale its -1/2 power; else head_dim's
    final_logit_softcap: float | None = None  # logits = cap * tanh(logits / cap)

    def __post_init__(self) -> None:
        if self.layer_types and len(self.layer_types) != self.num_layers:
            raise ValueError(f"{len(self.layer_types)} layer_types for {self.num_layers} layers")
        if "sliding" in self.layer_types and self.sliding_window is None:
            raise ValueError("sliding layers without a sliding_window")
        if self.rope is None:
            object.__setattr__(self, "rope", RopeSpec(self.rope_theta, self.head_dim))

    @property
    def attention_scale(self) -> float:
        return float((self.query_pre_attn_scalar or self.head_dim) ** -0.5)

    def layer_type(self, layer: int) -> LayerType:
        if self.layer_types:
            return self.layer_types[layer]
        return "full" if self.sliding_window is None else "sliding"

    def window(self, layer: int) -> int | None:
        """How many positions back `layer` attends (itself included); None: all of them."""
        return self.sliding_window if self.layer_type(layer) == "sliding" else None

    def layer_rope(self, layer: int) -> RopeSpec:
        if self.layer_type(layer) == "sliding" and self.local_rope is not None:
            return self.local_rope
        return self.full_rope

    @property
    def full_rope(self) -> RopeSpec:
        assert self.rope is not None  # set in __post_init__
        return self.rope

    def identity(self) -> dict[str, Any]:
        """What decides the hidden states, for fingerprints: the class and the fields, those
        after `sliding_window` only where they differ from a plain Llama of the same shapes,
        so a plain Llama's identity (and every fingerprint recorded from it) stays the one it
        had before those fields existed."""
        mine, plain = asdict(self), asdict(_plain(self))
        later = [f.name for f in fields(self)][_SHARED_FIELDS:]
        out = {k: v for k, v in mine.items() if k not in later or v != plain[k]}
        out.pop("architecture", None)
        return {"class": self.architecture, **out}

    @property
    def kv_bytes_per_token(self) -> int:
        """fp32 bytes of K and V for one token across all layers."""
        return self.kv_bytes(4)

    def kv_bytes(self, element_size: int) -> int:
        """Bytes of K and V for one token across all layers, `element_size` bytes each."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element_size


_SHARED_FIELDS = 13  # vocab_size .. sliding_window


def _plain(arch: ModelArch) -> ModelArch:
    """`arch`'s shapes with every later field at its Llama default."""
    later = [f for f in fields(ModelArch)][_SHARED_FIELDS:]
    defaults: dict[str, Any] = {f.name: f.default for f in later}
    defaults["rope"] = RopeSpec(arch.rope_theta, arch.head_dim)
    return replace(arch, **defaults)
