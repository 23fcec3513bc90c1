"""One decoder layer as a `ModelArch` describes it: RMSNorms of its kind (pre-norms, and the
post-attention / post-MLP "sandwich" norms of Gemma 3), fused q/k/v, optional q/k norm per
head, RoPE over the first rotary_dim dims of each head, paged attention (within the layer's
window if it has one), and a gated MLP (SiLU or GELU-tanh) with fused gate/up.

Where the projections are GGUF blocks (`kernel_rows`), every step runs as a C kernel call,
the norms too (fused into a projection, or `kernels/norms.c` where one stands alone), in the
order and with the arguments the native decoder (`kernels/decoder.c`) uses, so the two give
the same bits; elsewhere, as torch ops."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specserve.kernels import attention as attention_kernel
from specserve.kernels import norms
from specserve.models.arch import Activation, ModelArch, NormKind
from specserve.models.attention import AttentionMetadata


class RMSNorm(nn.Module):
    """x / rms(x) * w, or * (1 + w) for kind rms_plus_one (Gemma's stored weights)."""

    def __init__(self, dim: int, eps: float, kind: NormKind = "rms") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.plain = kind == "rms"  # only a plain one may be fused into a block projection

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., dim] -> [..., dim]
        if self.plain:
            return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return F.rms_norm(x, (x.shape[-1],), None, self.eps) * (1.0 + self.weight)

    def kernel_weight(self) -> torch.Tensor:
        """What a C kernel's plain RMSNorm multiplies by to compute this norm: w, or 1 + w."""
        return self.weight if self.plain else 1.0 + self.weight


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, heads, D], cos/sin [T, 1, R <= D]: the first R dims rotated, the rest kept.
    # x*cos + rotate_half(x)*sin, rotate_half(a, b) = (-b, a)
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    half = r // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


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
    glu: Activation | None = None,
) -> torch.Tensor:
    """linear(input) (+ residual), where input is norm(x), or act(gate) * up for x = [gate,
    up] with `glu` the activation. A projection with a `fused` method (GGUF blocks) does it all
    in one kernel call where it can; otherwise, the same steps one by one."""
    fused = getattr(linear, "fused", None)
    if fused is not None:
        y: torch.Tensor | None = fused(x, norm, glu, residual)
        if y is not None:
            return y
    if glu is not None:
        gate, up = x.chunk(2, dim=-1)
        x = (F.silu(gate) if glu == "silu" else F.gelu(gate, approximate="tanh")) * up
    elif norm is not None:
        x = norm(x)
    y = linear(x)
    return y if residual is None else residual + y


def kernel_rows(linear: nn.Module, rows: int) -> bool:
    """Whether `linear` runs `rows` rows as one GGUF block kernel call (and so every step of
    the layer runs as a C kernel; see the module docstring)."""
    on_blocks = getattr(linear, "on_blocks", None)
    return on_blocks is not None and bool(on_blocks(rows))


def add_norm(x: torch.Tensor, y: torch.Tensor, norm: RMSNorm, kernel: bool) -> torch.Tensor:
    """x + norm(y): in one C call where the layer runs its steps as kernels (`kernel`)."""
    if kernel and x.dtype == torch.float32 and x.device.type == "cpu":
        return norms.rms_norm_add(x.contiguous(), y.contiguous(), norm.kernel_weight(), norm.eps)
    return x + norm(y)


class DecoderLayer(nn.Module):
    q_norm: RMSNorm | None
    k_norm: RMSNorm | None
    pre_feedforward_layernorm: RMSNorm | None
    post_feedforward_layernorm: RMSNorm | None

    def __init__(self, arch: ModelArch, index: int) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            arch.num_heads,
            arch.num_kv_heads,
            arch.head_dim,
        )
        self.q_size = arch.num_heads * arch.head_dim
        self.kv_size = arch.num_kv_heads * arch.head_dim
        self.scale = arch.attention_scale
        self.window = arch.window(index)
        self.rotary_dim = arch.layer_rope(index).rotary_dim
        self.activation: Activation = arch.activation

        def norm(dim: int) -> RMSNorm:
            return RMSNorm(dim, arch.rms_norm_eps, arch.norm)

        h = arch.hidden_size
        self.input_layernorm = norm(h)
        self.qkv_proj = nn.Linear(h, self.q_size + 2 * self.kv_size, bias=arch.attention_bias)
        self.q_norm = norm(arch.head_dim) if arch.qk_norm else None
        self.k_norm = norm(arch.head_dim) if arch.qk_norm else None
        self.o_proj = nn.Linear(self.q_size, h, bias=arch.o_bias)
        # a pre-MLP norm in Llama; the attention output's norm where norms are sandwiched
        self.post_attention_layernorm = norm(h)
        sandwich = arch.sandwich_norms
        self.pre_feedforward_layernorm = norm(h) if sandwich else None
        self.post_feedforward_layernorm = norm(h) if sandwich else None
        self.gate_up_proj = nn.Linear(h, 2 * arch.intermediate_size, bias=arch.mlp_bias)
        self.down_proj = nn.Linear(arch.intermediate_size, h, bias=arch.mlp_bias)

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, 1, rotary_dim]
        sin: torch.Tensor,
        kv: tuple[torch.Tensor, torch.Tensor],  # 2 x [Hkv, num_slots, head_dim]
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden]
        kernel = kernel_rows(self.qkv_proj, x.shape[0])
        qkv = project(self.qkv_proj, x, norm=self.input_layernorm)
        q, k, v = self._rotate_split(qkv, cos, sin, kernel)
        attn = meta.attend(q, k, v, kv[0], kv[1], self.scale, full=self.window is None)
        post_ffw = self.post_feedforward_layernorm
        if self.pre_feedforward_layernorm is None or post_ffw is None:
            x = project(self.o_proj, attn, residual=x)
            gate_up = project(self.gate_up_proj, x, norm=self.post_attention_layernorm)
            return project(self.down_proj, gate_up, residual=x, glu=self.activation)
        x = add_norm(x, project(self.o_proj, attn), self.post_attention_layernorm, kernel)
        gate_up = project(self.gate_up_proj, x, norm=self.pre_feedforward_layernorm)
        return add_norm(x, project(self.down_proj, gate_up, glu=self.activation), post_ffw, kernel)

    def _rotate_split(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kernel: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q/k norm and RoPE on the q and k heads of qkv [T, (H + 2 Hkv) * D]; q, k, v as
        [T, heads, D]. `kernel`: the q/k norms as C calls (see the module docstring)."""
        heads, dim = self.num_heads + self.num_kv_heads, self.head_dim
        if self.q_norm is not None and self.k_norm is not None and kernel and _rope_in_place(qkv):
            norms.rms_norm_heads(
                qkv, 0, self.num_heads, dim, self.q_norm.kernel_weight(), self.q_norm.eps
            )
            norms.rms_norm_heads(
                qkv,
                self.num_heads,
                self.num_kv_heads,
                dim,
                self.k_norm.kernel_weight(),
                self.k_norm.eps,
            )
        elif self.q_norm is not None and self.k_norm is not None:
            q, k = qkv[:, : self.q_size], qkv[:, self.q_size : self.q_size + self.kv_size]
            q.copy_(self.q_norm(q.unflatten(1, (self.num_heads, dim))).flatten(1))
            k.copy_(self.k_norm(k.unflatten(1, (self.num_kv_heads, dim))).flatten(1))
        if _rope_in_place(qkv):  # one call, rounding as apply_rope
            r = self.rotary_dim
            attention_kernel.rope_rotate_half(
                qkv, heads, cos.view(-1, r), sin.view(-1, r), head_dim=dim
            )
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            q, k = qk.split([self.q_size, self.kv_size], dim=-1)
            return (
                q.view(-1, self.num_heads, dim),
                k.view(-1, self.num_kv_heads, dim),
                v.view(-1, self.num_kv_heads, dim),
            )
        qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
        # RoPE on q and k heads in one go: [T, H + Hkv, D]
        qk = apply_rope(qk.reshape(-1, heads, dim), cos, sin)
        q, k = qk.split([self.num_heads, self.num_kv_heads], dim=1)
        return q, k, v.reshape(-1, self.num_kv_heads, dim)
