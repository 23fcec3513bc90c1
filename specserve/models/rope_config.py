"""A layer kind's RoPE from config.json, in either of transformers' forms.

The current form keeps everything in `rope_parameters` (nested per layer type where layers
differ, as Gemma 3's); the older one has `rope_theta`, `rope_scaling`, `partial_rotary_factor`
(and Gemma 3's `rope_local_base_freq`) at the top. Defaults are transformers' own
(modeling_rope_utils.py). RoPE whose frequencies depend on the length of the current input
(dynamic NTK) is refused: a row would not be computed the same whatever else shares its step.
"""

from __future__ import annotations

import math
from typing import Any

from specserve.models.arch import RopeKind, RopeSpec

ROPE_KINDS: tuple[RopeKind, ...] = ("default", "linear", "llama3", "yarn", "longrope")
_NESTED = ("full_attention", "sliding_attention")


def rope_spec(
    cfg: dict[str, Any], layer_type: str, head_dim: int, max_position: int, local_base: bool
) -> RopeSpec:
    """The RoPE of `layer_type` layers (full_attention / sliding_attention); ValueError for a
    type we do not implement, naming those we do."""
    params = _params(cfg, layer_type, local_base)
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind not in ROPE_KINDS:
        raise ValueError(
            f"unsupported rope type {kind!r} in config.json; supported: {list(ROPE_KINDS)}"
        )
    theta = float(params["rope_theta"])
    rotary_dim = int(head_dim * params.get("partial_rotary_factor", 1.0))
    if kind == "default":
        return RopeSpec(theta, rotary_dim)
    original = int(
        cfg.get("original_max_position_embeddings")  # Phi-3 keeps it here, and it wins
        or params.get("original_max_position_embeddings")
        or max_position
    )
    factor = float(params.get("factor") or max_position / original)
    if kind == "linear":
        return RopeSpec(theta, rotary_dim, "linear", factor=factor)
    if kind == "llama3":
        return RopeSpec(
            theta, rotary_dim, "llama3", factor=factor,
            low_freq_factor=float(params["low_freq_factor"]),
            high_freq_factor=float(params["high_freq_factor"]), original_max_position=original,
        )  # fmt: skip
    if kind == "yarn":
        return RopeSpec(
            theta, rotary_dim, "yarn", factor=factor, original_max_position=original,
            beta_fast=float(params.get("beta_fast") or 32),
            beta_slow=float(params.get("beta_slow") or 1),
            truncate=bool(params.get("truncate", True)),
            attention_factor=_yarn_attention_factor(params, factor),
        )  # fmt: skip
    short = tuple(float(f) for f in params["short_factor"])
    long = tuple(float(f) for f in params.get("long_factor") or ())
    attention = params.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return RopeSpec(
        theta, rotary_dim, "longrope", factor=factor, original_max_position=original,
        attention_factor=float(attention), short_factor=short, long_factor=long,
    )  # fmt: skip


def _params(cfg: dict[str, Any], layer_type: str, local_base: bool) -> dict[str, Any]:
    top = cfg.get("rope_parameters")
    if isinstance(top, dict) and any(k in top for k in _NESTED):
        params = dict(top.get(layer_type) or {})
    elif isinstance(top, dict) and top:
        params = dict(top)
    elif layer_type == "sliding_attention" and local_base:
        params = {}  # the older form's rope_scaling is the global layers' alone
    else:
        params = dict(cfg.get("rope_scaling") or {})
    if layer_type == "sliding_attention" and local_base:
        params.setdefault("rope_theta", cfg.get("rope_local_base_freq", 10_000.0))
    params.setdefault("rope_theta", cfg.get("rope_theta", 10_000.0))
    params.setdefault("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    return params


def _yarn_attention_factor(params: dict[str, Any], factor: float) -> float:
    """YaRN's cos/sin magnitude: 0.1 ln(factor) + 1, or the ratio of two such with mscales."""

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])
    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    if m and m_all:
        return mscale(factor, m) / mscale(factor, m_all)
    return mscale(factor)
