"""Fused layer kernels against the unfused torch steps they replace: RMSNorm/SwiGLU/bias/residual
around the block product, and in-place RoPE."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specserve.kernels import attention, ggml, norms
from specserve.kernels.ggml import BlockKind
from specserve.models.llama import RMSNorm, apply_rope
from tests.kernels.blocks import width_for
from tests.kernels.test_ggml import quantised

pytestmark = pytest.mark.usefixtures("block_kernels", "attention_kernels")


@pytest.mark.parametrize("kind", ggml.GGUF_KINDS)
@pytest.mark.parametrize("rows", [1, 3, 5, 9])
def test_norm_bias_residual_fused_equal_the_steps(kind: BlockKind, rows: int) -> None:
    width = width_for(kind, 64)
    blocks, weight = quantised(kind, 40, width)
    norm = RMSNorm(width, 1e-5)
    norm.weight.data = torch.rand(width) + 0.5
    gen = torch.Generator().manual_seed(rows)
    x, bias = torch.randn(rows, width, generator=gen) * 3, torch.randn(40, generator=gen)
    residual = torch.randn(rows, 40, generator=gen)
    got = ggml.matmul_fused(x, blocks, kind, width, norm=(norm.weight, norm.eps), bias=bias,
                            residual=residual)  # fmt: skip
    want = residual + (F.linear(norm(x), weight) + bias)
    # float32 sums in two orders: the tolerance grows with the width (256 for the K-quants)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * width / 64)
    plain = ggml.matmul_fused(x, blocks, kind, width)
    assert torch.equal(plain, ggml.matmul(x, blocks, kind))  # nothing fused: the plain product


@pytest.mark.parametrize("glu", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 4])
def test_gated_fused_equals_the_steps(rows: int, glu: str) -> None:
    blocks, weight = quantised(BlockKind.Q4_1, 24, 96)
    x, residual = torch.randn(rows, 192) * 4, torch.randn(rows, 24)
    x[0, :4] = torch.tensor([60.0, -60.0, 1e-4, 0.0])  # saturated, tiny and zero gates
    got = ggml.matmul_fused(x, blocks, BlockKind.Q4_1, 96, glu=glu, residual=residual)
    gate, up = x.chunk(2, dim=-1)
    act = F.silu(gate) if glu == "silu" else F.gelu(gate, approximate="tanh")
    want = residual + F.linear(act * up, weight)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_norms_outside_a_projection_equal_torch() -> None:
    """q/k norm per head in place, and x + norm(y) (kernels/norms.c)."""
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(5, 8 * 16, generator=gen) * 3
    w = torch.rand(16, generator=gen) + 0.5
    want = qkv.clone()
    want[:, 32:96] = F.rms_norm(qkv[:, 32:96].unflatten(1, (4, 16)), (16,), w, 1e-6).flatten(1)
    norms.rms_norm_heads(qkv, 2, 4, 16, w, 1e-6)  # heads 2..5 of 8
    torch.testing.assert_close(qkv, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(qkv[:, :32], want[:, :32]) and torch.equal(qkv[:, 96:], want[:, 96:])
    x, y, w = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen), torch.rand(64)
    got = norms.rms_norm_add(x, y, w, 1e-6)
    torch.testing.assert_close(got, x + F.rms_norm(y, (64,), w, 1e-6), rtol=1e-6, atol=1e-6)


def test_fused_refuses_wrong_widths() -> None:
    blocks, _ = quantised(BlockKind.Q8_0, 8, 64)
    with pytest.raises(ValueError, match=r"\[M, 128\]"):
        ggml.matmul_fused(torch.randn(2, 64), blocks, BlockKind.Q8_0, 64, glu="silu")
    with pytest.raises(ValueError, match="residual"):
        ggml.matmul_fused(torch.randn(2, 64), blocks, BlockKind.Q8_0, 64, residual=torch.ones(3))


@pytest.mark.parametrize(("head_dim", "rotary"), [(16, 16), (64, 64), (12, 12), (64, 32), (16, 8)])
def test_rope_in_place_is_bit_identical_to_apply_rope(head_dim: int, rotary: int) -> None:
    tokens, heads, extra = 7, 5, 3  # rotate 5 heads of each row, leave 3 (the v heads) alone
    qkv = torch.randn(tokens, (heads + extra) * head_dim)
    angles = torch.randn(tokens, rotary // 2) * 10
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    want = apply_rope(qkv[:, : heads * head_dim].view(tokens, heads, head_dim),
                      cos.unsqueeze(1), sin.unsqueeze(1))  # fmt: skip
    untouched = qkv[:, heads * head_dim :].clone()
    attention.rope_rotate_half(qkv, heads, cos, sin, head_dim=head_dim)
    assert torch.equal(qkv[:, : heads * head_dim].view(tokens, heads, head_dim), want)
    assert torch.equal(qkv[:, heads * head_dim :], untouched)


@pytest.mark.parametrize("kind", ggml.GGUF_KINDS)
def test_a_rows_product_does_not_depend_on_the_rows_beside_it(kind: BlockKind) -> None:
    """Bit for bit: what a verify step computes for a row is what a decode step computes."""
    width = width_for(kind, 96)
    blocks, _ = quantised(kind, 37, width)  # 37 outputs: every column grouping and remainder
    x = torch.randn(24, width)
    alone = torch.cat([ggml.matmul(x[i : i + 1], blocks, kind) for i in range(24)])
    for rows in (2, 3, 4, 5, 8, 9, 17, 24):
        assert torch.equal(ggml.matmul(x[:rows], blocks, kind), alone[:rows]), rows
    fused = ggml.matmul_fused(x[:5], blocks, kind, width, bias=torch.ones(37))
    assert torch.equal(fused, torch.cat([ggml.matmul_fused(x[i : i + 1], blocks, kind, width,
                                         bias=torch.ones(37)) for i in range(5)]))  # fmt: skip


@pytest.mark.parametrize("n", [64, 49_152, 1000, 33])
def test_token_mask_kernel_equals_the_torch_path(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(n)
    bits = torch.randint(-(2**31), 2**31 - 1, ((n + 31) // 32,), dtype=torch.int32)
    bits[0], bits[-1] = -1, 0  # a word of all ones and one of none
    logits = torch.randn(n)
    got, none = logits.clone(), logits.clone()
    allowed = attention.mask_logits(got, bits)
    assert attention.mask_logits(none, torch.zeros_like(bits)) == 0
    assert torch.equal(none, logits)  # nothing allowed: the row as it was
    half = logits.half()  # another dtype (as another device would): torch's path, same mask
    assert attention.mask_logits(half, bits) == allowed
    assert torch.equal(torch.isfinite(half), torch.isfinite(got))
    monkeypatch.setattr(attention, "library", lambda: None)
    want = logits.clone()
    assert attention.mask_logits(want, bits) == allowed == int(torch.isfinite(want).sum())
    assert torch.equal(got, want)
    assert torch.equal(got[torch.isfinite(got)], logits[torch.isfinite(want)])  # kept: untouched
