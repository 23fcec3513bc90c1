"""Llama-family decoder (Llama, SmolLM2; Qwen2 and Mistral are variants of it).

Our own modules: fused QKV and gate/up projections, RMSNorm, rotary embeddings with positions
given per token, and paged attention. The forward pass takes a flat ragged batch and returns
hidden states; logits are computed only for the rows the caller asks for.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from specserve.kernels import attention as attention_kernel
from specserve.models.arch import ModelArch
from specserve.models.attention import AttentionMetadata
from specserve.models.weight_report import WeightReport


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [T, dim] -> [T, dim]
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Rotary(nn.Module):
    """cos/sin tables for rotate-half RoPE (the HF tensor layout)."""

    cos: torch.Tensor  # [max_position, head_dim]
    sin: torch.Tensor

    def __init__(self, head_dim: int, theta: float, max_position: int) -> None:
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_position, dtype=torch.float64), inv_freq)
        emb = torch.cat([angles, angles], dim=-1)  # [max_position, head_dim]
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # positions [T] -> cos, sin [T, 1, head_dim], broadcast over heads
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, heads, D]: x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class DecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
        )
        self.q_size = arch.num_heads * arch.head_dim
        self.kv_size = arch.num_kv_heads * arch.head_dim
        self.scale = 1.0 / math.sqrt(arch.head_dim)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.qkv_proj = nn.Linear(
            arch.hidden_size, self.q_size + 2 * self.kv_size, bias=arch.attention_bias
        )
        self.o_proj = nn.Linear(self.q_size, arch.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.gate_up_proj = nn.Linear(arch.hidden_size, 2 * arch.intermediate_size, bias=False)
        self.down_proj = nn.Linear(arch.intermediate_size, arch.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],  # 2 x [Hkv, num_slots, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        qkv = project(self.qkv_proj, x, norm=self.input_layernorm)
        q, k, v = self._rotate_split(qkv, cos, sin)
        attn = meta.attend(q, k, v, kv[0], kv[1], self.scale)
        x = project(self.o_proj, attn, residual=x)
        gate_up = project(self.gate_up_proj, x, norm=self.post_attention_layernorm)
        return project(self.down_proj, gate_up, residual=x, swiglu=True)

    def _rotate_split(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE on the q and k heads of qkv [T, (H + 2 Hkv) * D]; q, k, v as [T, heads, D]."""
        heads, dim = self.num_heads + self.num_kv_heads, self.head_dim
        if _rope_in_place(qkv):  # one kernel call, rounding as apply_rope does
            attention_kernel.rope_rotate_half(qkv, heads, cos.view(-1, dim), sin.view(-1, dim))
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            q, k = qk.split([self.q_size, self.kv_size], dim=-1)
            return (
                q.view(-1, self.num_heads, dim),
                k.view(-1, self.num_kv_heads, dim),
                v.view(-1, self.num_kv_heads, dim),
            )
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # RoPE on q and k heads in one go: [T, H + Hkv, D]
        qk = apply_rope(qk.view(-1, heads, dim), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, v.view(-1, self.num_kv_heads, dim)


# The in-place RoPE kernel takes rows whose width (the fused q, k, v) is a multiple of this.
ROPE_KERNEL_WIDTH = 16


def _rope_in_place(qkv: torch.Tensor) -> bool:
    return (
        qkv.device.type == "cpu"
        and qkv.dtype == torch.float32
        and qkv.is_contiguous()
        and qkv.shape[-1] % ROPE_KERNEL_WIDTH == 0
        and attention_kernel.library() is not None
    )


def project(
    linear: nn.Module,
    x: torch.Tensor,
    norm: RMSNorm | None = None,
    residual: torch.Tensor | None = None,
    swiglu: bool = False,
) -> torch.Tensor:
    """linear(input) (+ residual), where input is norm(x), or silu(gate) * up for x = [gate,
    up]. A projection with a `fused` method (GGUF blocks) does it all in one kernel call where
    it can; otherwise, the same steps one by one."""
    fused = getattr(linear, "fused", None)
    if fused is not None:
        y: torch.Tensor | None = fused(x, norm, swiglu, residual)
        if y is not None:
            return y
    if swiglu:
        gate, up = x.chunk(2, dim=-1)
        x = F.silu(gate) * up
    elif norm is not None:
        x = norm(x)
    y = linear(x)
    return y if residual is None else residual + y


class LayerStack(Protocol):
    """Runs a model's whole layer loop some other way (models/native_stack.py)."""

    def run(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
    ) -> bool:
        """x through every layer, in place; False (x untouched) where it cannot."""
        ...


class LlamaForCausalLM(nn.Module):
    """Decoder stack. `forward` returns final-normed hidden states; `logits` projects rows."""

    default_attention_bias = False
    # nn.Embedding / nn.Linear, or their GGUF-block counterparts (models/block_linear.py)
    embed_tokens: nn.Module
    lm_head: nn.Module
    # Why the GGUF blocks this model has are not used (their start-up check failed); else None.
    block_kernel_fallback: str | None = None
    # A GGUF's tensors by type and how they run (models/gguf_weights.py); None for a checkpoint.
    weight_report: WeightReport | None = None
    # The layers in one native call where the weights allow it (set by the loader); else None.
    native_stack: LayerStack | None = None

    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.arch = arch
        self.embed_tokens = nn.Embedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(arch) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.rotary = Rotary(arch.head_dim, arch.rope_theta, arch.max_position)
        self.lm_head = nn.Linear(arch.hidden_size, arch.vocab_size, bias=False)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    @classmethod
    def arch_from_hf(cls, cfg: dict[str, Any]) -> ModelArch:
        return ModelArch.from_hf(cfg, attention_bias=cls.default_attention_bias)

    def forward(
        self,
        input_ids: torch.Tensor,  # [T]
        positions: torch.Tensor,  # [T]
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],  # per layer, 2 x [Hkv, slots, D]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        x = self.embed_tokens(input_ids)
        cos, sin = (t.to(x.dtype) for t in self.rotary(positions))  # tables stay float32
        native = self.native_stack
        if native is None or not native.run(x, cos, sin, kv_caches, meta):
            for layer, kv in zip(self.layers, kv_caches, strict=True):
                x = layer(x, cos, sin, kv, meta)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab]
        return self.lm_head(hidden)

    def load_hf_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors in, fusing q/k/v and gate/up. Missing tensors are an error."""
        params = dict(self.named_parameters())
        expected = {f"{n}:{s}" for n in params for s in self._shards_of(n)}
        loaded: set[str] = set()
        for hf_name, tensor in weights:
            name = hf_name.removeprefix("model.").replace(".self_attn.", ".").replace(".mlp.", ".")
            if "rotary_emb" in name or (name == "lm_head.weight" and self.arch.tie_word_embeddings):
                continue
            prefix, proj, kind = ([*name.rsplit(".", 2), "", ""])[:3]
            if proj in _FUSED:
                fused_name, index = _FUSED[proj]
                target = f"{prefix}.{fused_name}.{kind}"
                sizes = self._shard_sizes(fused_name)
                offset = sum(sizes[:index])
                params[target].data[offset : offset + sizes[index]].copy_(tensor)
                loaded.add(f"{target}:{proj}")
            elif name in params:
                params[name].data.copy_(tensor)
                loaded.add(f"{name}:")
            else:
                raise ValueError(f"unexpected tensor {hf_name!r} in checkpoint")
        missing = sorted(expected - loaded)
        if missing:
            raise ValueError(f"checkpoint is missing tensors: {missing[:6]}")

    def _shard_sizes(self, fused_name: str) -> list[int]:
        a = self.arch
        if fused_name == "gate_up_proj":
            return [a.intermediate_size, a.intermediate_size]
        return [a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_kv_heads * a.head_dim]

    @staticmethod
    def _shards_of(param_name: str) -> list[str]:
        module = param_name.split(".")[-2]
        return [p for p, (f, _) in _FUSED.items() if f == module] or [""]


# HF projection name -> (our fused module, index of its shard along the output dim)
_FUSED: dict[str, tuple[str, int]] = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
