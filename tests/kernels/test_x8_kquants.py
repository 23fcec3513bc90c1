"""Interleaved K-quant and Q5_1 rows (`x8_layout.h`, `x8_kquants.c`): the same bytes as the
plain rows, and in the q8 numerics the plain rows' product bit for bit, on the scalar reference
and AVX2, for every M, whatever the row's neighbours."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from tests.kernels.blocks import coded_blocks
from tests.kernels.test_gguf_types import bits
from tests.kernels.test_q8 import activations

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected

# The interleaved kinds with the plain rows' arithmetic (Q4_1_X8 and Q8_0_X8 have their own).
KINDS = [k for k in ggml.GGUF_KINDS if k.has_x8 and k not in (BlockKind.Q4_1, BlockKind.Q8_0)]
OUT = 72  # nine groups of eight rows, enough for dequantize to decode them in parallel


def width(kind: BlockKind) -> int:
    """Three super-blocks; Q5_1: 25 blocks, three spans of eight and one more (x8_kquants.c)."""
    return 800 if kind.block_values == ggml.QK else 768


def blocks_and_x8(kind: BlockKind, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    plain = coded_blocks(kind, OUT, width(kind), seed=seed).torch_blocks
    return plain, ggml.repack_x8(plain, kind, width(kind))


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_the_interleaved_kind_names_the_same_blocks(kind: BlockKind) -> None:
    x8 = kind.x8
    assert x8 is not kind and x8.interleaved and x8.has_x8 and x8.x8 is x8
    assert x8.plain is kind and not kind.interleaved and kind.plain is kind
    assert (x8.block_bytes, x8.block_values) == (kind.block_bytes, kind.block_values)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_repacked_rows_gather_and_decode_as_the_plain_rows(kind: BlockKind) -> None:
    plain, x8 = blocks_and_x8(kind, seed=1)
    assert x8.shape == plain.shape and not torch.equal(x8, plain)
    ids = torch.arange(OUT).flip(0)
    assert torch.equal(ggml.gather_rows(x8, kind.x8, ids, width(kind)), plain[ids])
    want = quants.dequantize(plain.numpy(), GGMLQuantizationType[kind.name])
    assert OUT >= ggml.SERIAL_DEQUANT_ROWS
    for rows in (x8, x8[:8].contiguous()):  # in parallel; a few rows in the caller's thread
        got = ggml.dequantize(rows, kind.x8, width(kind))
        assert np.array_equal(bits(got), bits(want[: rows.shape[0]]))


@pytest.mark.parametrize("path", ["scalar", "avx2"])
@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_x8_product_is_the_plain_rows_bit_for_bit(path: ggml.Q8Path, kind: BlockKind) -> None:
    """Against the plain rows' scalar reference, for M = 1..13 (every tile and remainder) and
    a prefill-sized 70 (chunks of 64); fused norm, bias and residual around it too."""
    plain, x8 = blocks_and_x8(kind, seed=2)
    k = width(kind)
    x = activations(70, k, seed=3)
    with ggml.scalar_q8():
        want = bits(ggml.matmul(x, plain, kind, q8=True))
    for m in [*range(1, 14), 70]:
        with ggml.forced_q8(path):
            got = ggml.matmul(x[:m], x8, kind.x8, q8=True)
        assert np.array_equal(bits(got), want[:m]), m
    norm, bias, residual = (torch.rand(k) + 0.5, 1e-5), torch.randn(OUT), torch.randn(9, OUT)
    with ggml.forced_q8(path):
        fused = [
            ggml.matmul_fused(x[:9], rows, as_kind, k, norm=norm, bias=bias, residual=residual,
                              q8=True)
            for rows, as_kind in ((plain, kind), (x8, kind.x8))
        ]  # fmt: skip
    assert torch.equal(fused[0], fused[1])


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_a_rows_x8_product_does_not_depend_on_m_or_its_position(kind: BlockKind) -> None:
    _, x8 = blocks_and_x8(kind, seed=4)
    x = torch.randn(100, width(kind), generator=torch.Generator().manual_seed(5))
    alone = torch.cat([ggml.matmul(x[i : i + 1], x8, kind.x8, q8=True) for i in range(100)])
    perm = torch.randperm(100, generator=torch.Generator().manual_seed(6))
    for m in (2, 3, 4, 5, 9, 64, 65, 100):
        for order in (torch.arange(100), perm):
            rows = order[:m]
            for threads in (1, 2):
                got = ggml.matmul(x[rows], x8, kind.x8, threads=threads, q8=True)
                assert torch.equal(got, alone[rows]), (m, threads)


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.name)
def test_exact_numerics_refuse_interleaved_rows(kind: BlockKind) -> None:
    _, x8 = blocks_and_x8(kind, seed=7)
    with pytest.raises(ValueError, match="q8 numerics only"):
        ggml.matmul_fused(torch.randn(2, width(kind)), x8, kind.x8, width(kind))
