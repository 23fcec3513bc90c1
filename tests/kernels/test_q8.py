"""The q8 block kernels: activation quantisation, each vector path (AVX2, and AVX512-VNNI where
the CPU has it) against the scalar reference bit for bit, rows independent of M, and the
product close to float32's."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.gguf_blocks import _f32_bound, _q8_bound
from tests.kernels.blocks import coded_blocks, width_for
from tests.kernels.test_ggml import quantised

X8_KINDS = [kind for kind in ggml.GGUF_KINDS if kind.has_x8]  # all but Q4_0 and Q5_0
BLOCK_SUM_KINDS = [BlockKind.Q4_1, BlockKind.Q8_0]  # x8.c's own arithmetic per block
OnPath = Literal["widest", "avx2"]  # "widest": what runs by default

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected


def random_blocks(kind: BlockKind, out_features: int, in_features: int, seed: int) -> torch.Tensor:
    """Random codes over each kind's whole range (every nibble, int8 -128 included) with finite
    fp16 scales, in `kind`'s layout (interleaved kinds: the plain rows, then interleaved)."""
    plain = coded_blocks(kind.plain, out_features, in_features, seed).torch_blocks
    return ggml.repack_x8(plain, kind.plain, in_features) if kind.interleaved else plain


def outputs(kind: BlockKind, out_features: int) -> int:
    """`out_features`, rounded up to whole groups of eight rows for an interleaved kind."""
    return -(-out_features // ggml.X8_ROWS) * ggml.X8_ROWS if kind.interleaved else out_features


def quantised_as(
    kind: BlockKind, out_features: int, in_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`quantised`'s blocks and float32 weights, the blocks in `kind`'s layout."""
    blocks, weight = quantised(kind.plain, out_features, in_features)
    if kind.interleaved:
        blocks = ggml.repack_x8(blocks, kind.plain, in_features)
    return blocks, weight


def activations(rows: int, width: int, seed: int) -> torch.Tensor:
    """Normal rows at mixed scales, one all-zero 32-block, one huge value."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, width, generator=gen) * torch.rand(rows, 1, generator=gen) * 8
    x[0, :32] = 0.0  # amax 0: d = 0, every q = 0
    x[-1, -1] = 3e4
    return x


def reference_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """d, s, q of q8_dot.h's Q8A blocks for x [M, K], in numpy float32."""
    blocks = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(-1)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(blocks * inv[..., None]).astype(np.int8)  # rint: half to even
    s = d * q.sum(-1, dtype=np.int32).astype(np.float32)
    return d, s, q


def test_quantize_is_llama_cpps_q8_with_float_scales() -> None:
    x = activations(5, 96, seed=1)
    x[1, :32] = torch.arange(32) - 15.5  # exact halves: ties round to even
    got = ggml.quantize_q8(x).view(5, 3, ggml.Q8A_BYTES).numpy()
    d, s, q = reference_q8(x.numpy())
    assert np.array_equal(got[..., :4].copy().view(np.float32)[..., 0], d)
    assert np.array_equal(got[..., 4:8].copy().view(np.float32)[..., 0], s)
    assert np.array_equal(got[..., 8:].view(np.int8), q)
    with ggml.scalar_q8():
        assert torch.equal(ggml.quantize_q8(x), torch.from_numpy(got.reshape(5, -1)))


def widest_q8_path() -> str:
    """The path q8_matmul.c should pick on this CPU, from its flags as Linux lists them."""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return "vnni" if {"avx512_vnni", "avx512vl"} <= flags else "avx2"
    return "avx2"  # every machine that builds the kernels has AVX2


def on_path(path: OnPath) -> AbstractContextManager[None]:
    """The q8 kernels on `path` inside the block: "widest" (what runs by default) or "avx2"
    (forced: on a VNNI machine the narrower path)."""
    return nullcontext() if path == "widest" else ggml.forced_q8(path)


@pytest.mark.parametrize("path", ["widest", "avx2"])
@pytest.mark.parametrize("kind", list(BlockKind))
@pytest.mark.parametrize(
    ("rows", "out", "width"), [(1, 1, 32), (3, 37, 96), (9, 70, 608), (18, 16, 64)]
)
def test_each_path_is_bit_identical_to_the_scalar_reference(
    path: OnPath, kind: BlockKind, rows: int, out: int, width: int
) -> None:
    """Tiles of every size each path has (AVX2: 16 Q4_1 rows, 4 Q8_0; VNNI: 16 and 8) and
    their remainders; fused norm, bias, residual and SwiGLU around them."""
    widest = widest_q8_path()
    assert ggml.q8_path() == widest
    out, width = outputs(kind, out), width_for(kind, width)
    blocks, x = random_blocks(kind, out, width, seed=rows), activations(rows, width, seed=out)
    bias, residual = torch.randn(out), torch.randn(rows, out)
    norm = (torch.rand(width) + 0.5, 1e-5)
    gated = torch.randn(rows, 2 * width)

    def products() -> list[torch.Tensor]:
        return [
            ggml.matmul(x, blocks, kind, q8=True),
            ggml.matmul_fused(x, blocks, kind, width, norm=norm, bias=bias, residual=residual,
                              q8=True),
            ggml.matmul_fused(gated, blocks, kind, width, glu="silu", q8=True),
        ]  # fmt: skip

    with on_path(path):
        assert ggml.q8_path() == (widest if path == "widest" else path)
        fast = products()
    with ggml.scalar_q8():
        assert ggml.q8_path() == "scalar"
        reference = products()
    assert ggml.q8_path() == widest
    for got, want in zip(fast, reference, strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("path", ["widest", "avx2"])
@pytest.mark.parametrize("kind", [kind.x8 for kind in X8_KINDS])
def test_every_tile_size_is_the_scalar_reference(path: OnPath, kind: BlockKind) -> None:
    """M from 1 to 17 covers each tile an interleaved path compiles (one per row count) and a
    tile plus a remainder."""
    width = width_for(kind, 64)
    blocks, x = random_blocks(kind, 16, width, seed=2), activations(17, width, seed=3)
    for m in range(1, 18):
        with on_path(path):
            got = ggml.matmul(x[:m], blocks, kind, q8=True)
        with ggml.scalar_q8():
            assert torch.equal(got, ggml.matmul(x[:m], blocks, kind, q8=True)), m


def test_forcing_a_path_takes_only_the_narrower_ones() -> None:
    with pytest.raises(ValueError, match="must be one of"), ggml.forced_q8("vnni"):
        pass
    assert ggml.q8_path() == widest_q8_path()


@pytest.mark.parametrize("path", ["widest", "avx2"])
@pytest.mark.parametrize("kind", list(BlockKind))
def test_a_rows_q8_product_does_not_depend_on_m_or_its_position(
    path: OnPath, kind: BlockKind
) -> None:
    """Bit for bit, whatever the tile, chunk, thread count or neighbours: batch invariance."""
    width = width_for(kind, 96)
    blocks, _ = quantised_as(kind, outputs(kind, 37), width)
    x = torch.randn(512, width, generator=torch.Generator().manual_seed(7))
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(8))
    with on_path(path):
        alone = torch.cat([ggml.matmul(x[i : i + 1], blocks, kind, q8=True) for i in range(512)])
        for m in (1, 2, 5, 24, 25, 100, 512):
            for order in (torch.arange(512), perm, perm.flip(0)):
                rows = order[:m]
                for threads in (1, 2):
                    got = ggml.matmul(x[rows], blocks, kind, threads=threads, q8=True)
                    assert torch.equal(got, alone[rows]), (m, threads)


@pytest.mark.parametrize("kind", list(BlockKind))
def test_q8_product_is_within_the_quantisation_bound_of_float32(kind: BlockKind) -> None:
    blocks, weight = quantised_as(kind, 64, 256)
    x = torch.randn(33, 256, generator=torch.Generator().manual_seed(3)) * 3
    got, want = ggml.matmul(x, blocks, kind, q8=True), x @ weight.T
    error = (got - want).abs()
    assert bool((error <= _q8_bound(x, weight) + _f32_bound(x, weight)).all())
    plain, _ = quantised(kind.plain, 64, 256)
    assert not torch.equal(got, ggml.matmul(x, plain, kind.plain))  # it is another numeric
    if kind.block_values == ggml.QK:  # gguf-py's blocks of normal weights (not random codes)
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * float(want.abs().mean()))


def test_fused_q8_quantises_the_normed_or_gated_row() -> None:
    blocks, _ = quantised(BlockKind.Q4_1, 24, 96)
    x, residual = torch.randn(4, 192) * 4, torch.randn(4, 24)
    got = ggml.matmul_fused(x, blocks, BlockKind.Q4_1, 96, glu="silu", residual=residual,
                            q8=True)  # fmt: skip
    gate, up = x.chunk(2, dim=-1)
    steps = residual + ggml.matmul(F.silu(gate) * up, blocks, BlockKind.Q4_1, q8=True)
    # silu's e^x is simd.h's polynomial (2 ulp), so the quantised row may round differently
    torch.testing.assert_close(got, steps, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("kind", X8_KINDS)
def test_interleaved_rows_hold_the_same_weights(kind: BlockKind) -> None:
    """Interleaving reorders bytes and nothing else: every row decodes and gathers as before."""
    width = width_for(kind, 96)
    blocks = random_blocks(kind, 24, width, seed=5)
    x8 = ggml.repack_x8(blocks, kind, width)
    assert x8.shape == blocks.shape and not torch.equal(x8, blocks)
    assert torch.equal(ggml.dequantize(x8, kind.x8, width), ggml.dequantize(blocks, kind, width))
    ids = torch.tensor([23, 0, 7, 8, 8, 15])
    assert torch.equal(ggml.gather_rows(x8, kind.x8, ids, width), blocks[ids])
    assert torch.equal(ggml.gather_rows(blocks, kind, ids, width), blocks[ids])
    with pytest.raises(IndexError):
        ggml.gather_rows(x8, kind.x8, torch.tensor([24]), width)
    with pytest.raises(ValueError, match="cannot interleave"):
        ggml.repack_x8(blocks[:20].contiguous(), kind, width)  # not whole groups of eight
    with pytest.raises(ValueError, match="q8 numerics only"):
        ggml.matmul(torch.randn(2, width), x8, kind.x8)  # the float32 kernel reads plain rows


@pytest.mark.parametrize("kind", BLOCK_SUM_KINDS)
def test_interleaved_q8_product_is_the_scalar_sum_per_block(kind: BlockKind) -> None:
    """The interleaved kernel's arithmetic, written out in numpy: per block, the exact integer
    sum, then fma(d_w * d_a, s, acc) (and fma(m_w, s_a, acc) for Q4_1), in block order."""
    blocks = random_blocks(kind, 8, 96, seed=9)
    x = activations(3, 96, seed=4)
    got = ggml.matmul(x, ggml.repack_x8(blocks, kind, 96), kind.x8, q8=True).numpy()
    d_a, s_a, q_a = reference_q8(x.numpy())
    raw = blocks.numpy().reshape(8, 3, kind.block_bytes)
    scales = raw[..., :4].copy().view(np.float16).astype(np.float32)  # d (and m for Q4_1)
    if kind is BlockKind.Q4_1:
        nibbles = raw[..., 4:]
        q_w = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.int32)
    else:
        q_w = raw[..., 2:].view(np.int8).astype(np.int32)
    f32 = np.float32
    for m in range(3):
        for n in range(8):
            acc = f32(0)
            for blk in range(3):
                s = int((q_w[n, blk] * q_a[m, blk].astype(np.int32)).sum())
                acc = _fma(f32(scales[n, blk, 0] * d_a[m, blk]), f32(s), acc)
                if kind is BlockKind.Q4_1:
                    acc = _fma(scales[n, blk, 1], s_a[m, blk], acc)
            assert got[m, n] == acc, (m, n)


def _fma(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """float32 fma: the product is exact in float64; the sum rounds to float64 and then to
    float32, which can differ from one rounding only when the float64 sum lands exactly on a
    float32 rounding tie (not in these few hundred operations)."""
    return np.float32(np.float64(a) * np.float64(b) + np.float64(c))
