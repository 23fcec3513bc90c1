"""Every GGUF kind the kernels read (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), in both
numerics: decoding is gguf-py's bit for bit; the exact product is float32's up to summation
order; the q8 product is its numpy transcription bit for bit on every path and every M, the
same for a row whatever M and its position, and within the quantisation bound of float64.

Measured q8 error (test_q8_error_against_float64: x ~ N(0, 9) [33, 512], 64 outputs; gguf-py's
quantisation of N(0, 1) weights for the 32-value kinds, uniform random codes for the K-quants):
the worst |q8 - float64| / sum_j |x_j w_j| over all outputs, and the RMS error over the RMS
output, per kind:
  Q4_0 1.19e-3 0.55 %   Q4_1 1.19e-3 0.55 %   Q5_0 1.21e-3 0.55 %   Q5_1 1.23e-3 0.55 %
  Q8_0 1.20e-3 0.55 %   Q4_K 1.53e-3 0.59 %   Q5_K 1.52e-3 0.59 %   Q6_K 1.72e-3 0.56 %
(at most 1/254 in theory: each activation moves by at most half a step, amax / 254, and the
weights are decoded exactly; Q8A per 32 values for every kind, K-quants included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.gguf_blocks import _f32_bound, _q8_bound
from tests.kernels.blocks import Coded, coded_blocks
from tests.kernels.test_q8 import activations, reference_q8

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected

KINDS = ggml.GGUF_KINDS
WIDTH = 512  # two K-quant super-blocks, sixteen 32-value blocks
# The worst |q8 - float64| / sum |x w| measured per kind (module docstring), with headroom.
Q8_RELATIVE = 2.5e-3


def gguf_type(kind: BlockKind) -> GGMLQuantizationType:
    return GGMLQuantizationType[kind.name]


def bits(a: torch.Tensor | np.ndarray) -> np.ndarray:
    """The float32 values as their bit patterns: -0.0 differs from 0.0."""
    return np.asarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("kind", KINDS)
def test_the_test_packing_is_ggmls(kind: BlockKind) -> None:
    """The codes, scales and offsets `coded_blocks` packs are what gguf-py reads back."""
    coded = coded_blocks(kind, 6, WIDTH, seed=1)
    assert coded.blocks.shape == (6, kind.row_bytes(WIDTH))
    want = quants.dequantize(coded.blocks, gguf_type(kind))
    assert np.array_equal(bits(coded.weights()), bits(want))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [5, 70])  # decoded in the caller's thread; in parallel
def test_dequantize_is_gguf_pys_bit_for_bit(kind: BlockKind, rows: int) -> None:
    coded = coded_blocks(kind, rows, WIDTH, seed=rows)
    got = ggml.dequantize(coded.torch_blocks, kind, WIDTH)
    assert np.array_equal(bits(got), bits(quants.dequantize(coded.blocks, gguf_type(kind))))
    if kind.block_values == ggml.QK:  # gguf-py quantises these: real weights' blocks too
        weights = np.random.default_rng(rows).standard_normal((rows, WIDTH)).astype(np.float32)
        blocks = quants.quantize(weights, gguf_type(kind))
        got = ggml.dequantize(torch.from_numpy(blocks), kind, WIDTH)
        assert np.array_equal(bits(got), bits(quants.dequantize(blocks, gguf_type(kind))))


@pytest.mark.parametrize("kind", KINDS)
def test_exact_product_is_float32s_up_to_summation_order(kind: BlockKind) -> None:
    coded = coded_blocks(kind, 37, WIDTH, seed=2)
    weight = torch.from_numpy(coded.weights())
    x = activations(13, WIDTH, seed=3)
    want = (x.double() @ weight.double().T).float()
    for rows in range(1, 14):  # every tile of the float32 kernel, and tile + remainder
        got = ggml.matmul(x[:rows], coded.torch_blocks, kind)
        assert bool(((got - want[:rows]).abs() <= _f32_bound(x[:rows], weight)).all()), rows
        assert torch.equal(got, ggml.matmul(x[:rows], coded.torch_blocks, kind, threads=2))
    bias, residual = torch.randn(37), torch.randn(13, 37)
    fused = ggml.matmul_fused(x, coded.torch_blocks, kind, WIDTH, bias=bias, residual=residual)
    assert torch.equal(fused, residual + (ggml.matmul(x, coded.torch_blocks, kind) + bias))


def fma32(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 fma, elementwise (as test_q8's _fma: exact float64 product, then the sum rounded
    to float64 and float32, which differs from one rounding only on an exact float32 tie)."""
    f64 = np.float64
    return (a.astype(f64) * b.astype(f64) + c.astype(f64)).astype(np.float32)


def q8_transcription(coded: Coded, x: torch.Tensor) -> np.ndarray:
    """q8_dot.c's arithmetic in numpy, from the codes: per 32-value block the eight exact lane
    sums, acc[l] = fma(dv[l] * d_a, lane[l], acc[l]) and summ = fma(m, s_a, summ) in block
    order, then hsum8(acc) + summ."""
    d_a, s_a, q_a = reference_q8(x.numpy())  # [M, nb], [M, nb], [M, nb, 32]
    n, k = coded.q.shape
    q_w = coded.q.reshape(n, k // ggml.QK, 8, 4)
    lanes = np.einsum("nblj,mblj->mnbl", q_w, q_a.reshape(x.shape[0], -1, 8, 4).astype(np.int32))
    dv = coded.dv.reshape(n, -1, 8)  # [N, nb, 8]
    f32 = np.float32
    acc = np.zeros((x.shape[0], n, 8), dtype=f32)
    summ = np.zeros((x.shape[0], n), dtype=f32)
    for blk in range(k // ggml.QK):
        scale = (dv[None, :, blk, :] * d_a[:, None, blk, None]).astype(f32)
        acc = fma32(scale, lanes[:, :, blk].astype(f32), acc)
        if coded.m is not None:
            summ = fma32(coded.m[None, :, blk], s_a[:, None, blk], summ)
    a = acc
    total = ((a[..., 0] + a[..., 4]) + (a[..., 2] + a[..., 6])) + (
        (a[..., 1] + a[..., 5]) + (a[..., 3] + a[..., 7])
    )
    return (total + summ).astype(f32)


@pytest.mark.parametrize("kind", KINDS)
def test_q8_product_is_its_transcription_on_every_path_and_m(kind: BlockKind) -> None:
    """Scalar reference, AVX2 (tiles of 1-6 rows, chunks of 64) and the numpy transcription
    agree bit for bit for M = 1..13 and a prefill-sized 70, with 37 outputs."""
    coded = coded_blocks(kind, 37, WIDTH, seed=4)
    x = activations(70, WIDTH, seed=5)
    want = bits(q8_transcription(coded, x))
    for m in [*range(1, 14), 70]:
        with ggml.forced_q8("avx2"):
            avx2 = ggml.matmul(x[:m], coded.torch_blocks, kind, q8=True)
        with ggml.scalar_q8():
            scalar = ggml.matmul(x[:m], coded.torch_blocks, kind, q8=True)
        assert np.array_equal(bits(avx2), want[:m]), m
        assert np.array_equal(bits(scalar), want[:m]), m


@pytest.mark.parametrize("kind", KINDS)
def test_a_rows_q8_product_does_not_depend_on_m_or_its_position(kind: BlockKind) -> None:
    coded = coded_blocks(kind, 19, WIDTH, seed=6)
    x = torch.randn(100, WIDTH, generator=torch.Generator().manual_seed(7))
    alone = torch.cat([ggml.matmul(x[i : i + 1], coded.torch_blocks, kind, q8=True)
                       for i in range(100)])  # fmt: skip
    perm = torch.randperm(100, generator=torch.Generator().manual_seed(8))
    for m in (2, 5, 6, 7, 13, 64, 65, 100):
        for order in (torch.arange(100), perm):
            rows = order[:m]
            for threads in (1, 2):
                got = ggml.matmul(x[rows], coded.torch_blocks, kind, threads=threads, q8=True)
                assert torch.equal(got, alone[rows]), (m, threads)
    fused = ggml.matmul_fused(x[:7], coded.torch_blocks, kind, WIDTH, norm=(torch.ones(WIDTH),
                              1e-5), q8=True)  # fmt: skip
    for i in range(7):
        one = ggml.matmul_fused(x[i : i + 1], coded.torch_blocks, kind, WIDTH,
                                norm=(torch.ones(WIDTH), 1e-5), q8=True)  # fmt: skip
        assert torch.equal(fused[i : i + 1], one)


def q8_weights(kind: BlockKind) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks and their float32 weights: gguf-py's quantisation of normal weights where it has
    one, else random codes."""
    if kind.block_values == ggml.QK:
        weights = np.random.default_rng(9).standard_normal((64, WIDTH)).astype(np.float32)
        blocks = quants.quantize(weights, gguf_type(kind))
        weights = quants.dequantize(blocks, gguf_type(kind))
        return torch.from_numpy(blocks), torch.from_numpy(weights)
    coded = coded_blocks(kind, 64, WIDTH, seed=9)
    return coded.torch_blocks, torch.from_numpy(coded.weights())


@pytest.mark.parametrize("kind", KINDS)
def test_q8_error_against_float64(kind: BlockKind) -> None:
    """Within the quantisation bound, and the measured relative error (module docstring)."""
    blocks, weight = q8_weights(kind)
    x = torch.randn(33, WIDTH, generator=torch.Generator().manual_seed(3)) * 3
    got = ggml.matmul(x, blocks, kind, q8=True).double()
    want = x.double() @ weight.double().T
    error = (got - want).abs()
    assert bool((error <= (_q8_bound(x, weight) + _f32_bound(x, weight)).double()).all())
    scale = x.double().abs() @ weight.double().abs().T
    assert float((error / scale).max()) <= Q8_RELATIVE


@pytest.mark.parametrize("kind", KINDS)
def test_gathered_rows_decode_as_the_rows(kind: BlockKind) -> None:
    coded = coded_blocks(kind, 24, WIDTH, seed=10)
    ids = torch.tensor([23, 0, 7, 8, 8, 15])
    rows = ggml.gather_rows(coded.torch_blocks, kind, ids, WIDTH)
    assert torch.equal(rows, coded.torch_blocks[ids])
    assert torch.equal(ggml.dequantize(rows, kind, WIDTH),
                      ggml.dequantize(coded.torch_blocks, kind, WIDTH)[ids])  # fmt: skip
    with pytest.raises(IndexError):
        ggml.gather_rows(coded.torch_blocks, kind, torch.tensor([24]), WIDTH)


@pytest.mark.parametrize("kind", [k for k in KINDS if not k.has_x8])
def test_kinds_without_an_interleaved_form_say_so(kind: BlockKind) -> None:
    assert not kind.interleaved and kind.plain is kind
    with pytest.raises(ValueError, match="no interleaved form"):
        _ = kind.x8
    coded = coded_blocks(kind, 8, WIDTH)
    with pytest.raises(ValueError, match="cannot interleave"):
        ggml.repack_x8(coded.torch_blocks, kind, WIDTH)


@pytest.mark.parametrize("kind", [BlockKind.Q4_K, BlockKind.Q5_K, BlockKind.Q6_K])
def test_k_quants_need_whole_super_blocks(kind: BlockKind) -> None:
    coded = coded_blocks(kind, 4, 256)
    assert kind.block_values == 256 and kind.row_bytes(256) == kind.block_bytes
    with pytest.raises(ValueError, match="multiple of 256"):
        ggml.matmul(torch.randn(1, 128), coded.torch_blocks[:, :72].contiguous(), kind)
    with pytest.raises(ValueError, match="not whole"):  # the fused call checks no blocks
        ggml.matmul_fused(torch.randn(1, 96), coded.torch_blocks, kind, 96, q8=True)
