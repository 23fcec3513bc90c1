"""The GGUF block kernels against gguf-py's reference (de)quantisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models.gguf_blocks import _f32_bound
from tests.kernels.blocks import coded_blocks, width_for

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected

GGML_TYPES = {kind: GGMLQuantizationType[kind.name] for kind in ggml.GGUF_KINDS}


def quantised(
    kind: BlockKind, out_features: int, in_features: int, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks [out, row_bytes] and gguf-py's float32 decoding of them: normal weights quantised
    by gguf-py, or for the K-quants (which it cannot quantise) random codes and scales."""
    if kind.block_values == ggml.QK:
        rng = np.random.default_rng(seed)
        weights = rng.standard_normal((out_features, in_features)).astype(np.float32)
        blocks = quants.quantize(weights, GGML_TYPES[kind])
    else:
        # scales so that the weights are about as large as gguf-py's quantised N(0, 1) ones
        scale = {BlockKind.Q4_K: 2e-3, BlockKind.Q5_K: 1e-3, BlockKind.Q6_K: 5e-4}[kind]
        blocks = coded_blocks(kind, out_features, in_features, seed, scale).blocks
    reference = quants.dequantize(blocks, GGML_TYPES[kind])
    return torch.from_numpy(blocks), torch.from_numpy(reference)


@pytest.mark.parametrize("kind", ggml.GGUF_KINDS)
def test_dequantize_is_bit_exact(kind: BlockKind) -> None:
    width = width_for(kind, 96)
    blocks, reference = quantised(kind, 48, width)
    assert blocks.shape == (48, kind.row_bytes(width))
    assert torch.equal(ggml.dequantize(blocks, kind, width), reference)


@pytest.mark.parametrize("kind", ggml.GGUF_KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31])
def test_matmul_matches_float32_product(kind: BlockKind, rows: int) -> None:
    width = width_for(kind, 128)
    blocks, reference = quantised(kind, 40, width, seed=rows)
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(rows))
    got = ggml.matmul(x, blocks, kind).double()
    error = (got - x.double() @ reference.double().T).abs()
    assert bool((error <= _f32_bound(x, reference)).all())  # float32 summation order only


def test_rejects_malformed_blocks() -> None:
    blocks, _ = quantised(BlockKind.Q4_1, 8, 64)
    with pytest.raises(ValueError, match="multiple of 32"):
        ggml.matmul(torch.zeros(1, 48), blocks, BlockKind.Q4_1)
    with pytest.raises(ValueError, match=r"Q8_0 blocks must be uint8 \[out, 68\]"):
        ggml.matmul(torch.zeros(1, 64), blocks, BlockKind.Q8_0)
    with pytest.raises(ValueError, match="float32"):
        ggml.matmul(torch.zeros(1, 64, dtype=torch.float64), blocks, BlockKind.Q4_1)


def test_quantise_q8_0_writes_ggmls_bytes() -> None:
    from specserve.models.block_linear import q8_linear, quantise_q8_0

    rng = np.random.default_rng(3)
    weights = rng.standard_normal((24, 96)).astype(np.float32)
    weights[3, :32] = 0.0  # an all-zero block: scale 0, every q 0
    want = quants.quantize(weights, GGMLQuantizationType.Q8_0)
    assert torch.equal(quantise_q8_0(torch.from_numpy(weights)), torch.from_numpy(want))
    layer = torch.nn.Linear(96, 24, bias=False)
    layer.weight.data = torch.from_numpy(weights)
    blocks = q8_linear(layer)
    x = torch.randn(3, 96)
    torch.testing.assert_close(blocks(x), x @ layer.weight.T, atol=0.3, rtol=0.05)
    with pytest.raises(ValueError, match="multiple of 32"):
        quantise_q8_0(torch.zeros(2, 48))
