"""Decoders running on GGUF blocks: the layers, the q/k row order, and the swap into a model."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import quants
from safetensors.torch import load_file, save_file

from specserve.engine.request import SamplingParams
from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models import block_linear
from specserve.models.block_linear import BlockEmbedding, BlockLinear
from specserve.models.gguf_blocks import BLOCKS_FILE, _unpermute_rows, hf_name
from specserve.models.registry import build_model
from tests.engine.helpers import make_engine, mixed_prompts, run_all
from tests.kernels.test_ggml import GGML_TYPES, quantised
from tests.tiny import make_model_dir

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "rows", [1, block_linear.DIRECT_MAX_ROWS, block_linear.DIRECT_MAX_ROWS + 9]
)
def test_block_linear_equals_linear_on_decoded_weights(rows: int) -> None:
    blocks, weights = quantised(BlockKind.Q4_1, 24, 64)
    bias = torch.randn(24)
    layer = BlockLinear(blocks, BlockKind.Q4_1, 64, bias)
    x = torch.randn(2, rows, 64)
    torch.testing.assert_close(layer(x), F.linear(x, weights, bias), rtol=1e-5, atol=1e-4)
    assert torch.equal(layer.weight, weights)


def test_unpermuting_block_rows_commutes_with_decoding() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    blocks, weights = quantised(BlockKind.Q4_1, 32, 64)  # 4 heads of head_dim 8
    processor = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 4})
    expected = processor._reverse_permute_weights(weights.numpy(), 4, 4)
    rows = torch.from_numpy(_unpermute_rows(blocks.numpy(), 4).copy())
    assert np.array_equal(ggml.dequantize(rows, BlockKind.Q4_1, 64).numpy(), expected)


def test_gguf_names_map_to_transformers_names() -> None:
    assert hf_name("blk.3.attn_k.weight") == "model.layers.3.self_attn.k_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.0.attn_norm.weight") is None


def _blockify(model_dir: Path) -> Path:
    """Quantise a tiny model's projections to Q4_1 (embeddings Q8_0), as a GGUF conversion
    would leave its cache directory: decoded float32 weights plus the blocks file."""
    tensors = load_file(str(model_dir / "model.safetensors"))
    blocks, kinds = {}, {}
    for name, weight in tensors.items():
        is_embedding = name == "model.embed_tokens.weight"
        if not (name.endswith("_proj.weight") or is_embedding):
            continue
        kind = BlockKind.Q8_0 if is_embedding else BlockKind.Q4_1
        rows = quants.quantize(weight.numpy(), GGML_TYPES[kind])
        blocks[name] = torch.from_numpy(rows)
        tensors[name] = torch.from_numpy(quants.dequantize(rows, GGML_TYPES[kind]))
        kinds[name] = kind.name
    save_file(tensors, str(model_dir / "model.safetensors"))
    save_file(
        blocks, str(model_dir / BLOCKS_FILE), metadata={"specserve.block_kinds": json.dumps(kinds)}
    )
    return model_dir


@pytest.mark.parametrize("tied", [False, True])
def test_engine_on_blocks_gives_the_dense_engine_tokens(tmp_path: Path, tied: bool) -> None:
    model_dir = _blockify(make_model_dir(tmp_path, "llama", tied=tied))
    model = build_model(model_dir, CPU)
    layer = model.layers[0]
    assert isinstance(layer.qkv_proj, BlockLinear) and isinstance(layer.down_proj, BlockLinear)
    assert isinstance(model.lm_head, BlockLinear) == tied  # untied lm_head stays float32 here
    assert isinstance(model.embed_tokens, BlockEmbedding)
    if tied:  # one copy of the Q8_0 rows serves both
        assert model.embed_tokens.blocks.data_ptr() == model.lm_head.blocks.data_ptr()
    dense = build_model(model_dir, CPU, gguf_blocks=False)
    assert not isinstance(dense.layers[0].qkv_proj, BlockLinear)

    prompts = mixed_prompts(6)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    on_blocks = run_all(make_engine(model_dir), prompts, params)
    assert on_blocks == run_all(make_engine(model_dir, dense_weights=True), prompts, params)
    assert on_blocks == run_all(make_engine(model_dir, speculate=3), prompts, params)


def test_a_kernel_that_multiplies_wrong_falls_back_to_float32_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = _blockify(make_model_dir(tmp_path, "llama"))
    real = ggml.matmul

    def off_by_a_little(*args: object, **kwargs: object) -> torch.Tensor:
        return real(*args, **kwargs) * (1 + 1e-4)  # type: ignore[arg-type]

    monkeypatch.setattr(ggml, "matmul", off_by_a_little)
    with caplog.at_level("WARNING", logger="specserve.models.registry"):
        model = build_model(model_dir, CPU)
    assert not isinstance(model.layers[0].qkv_proj, BlockLinear)
    assert "float32 bound" in (model.block_kernel_fallback or "")
    assert caplog.text.count("GGUF block kernels off, running float32 weights") == 1
    monkeypatch.setattr(ggml, "matmul", real)
    assert build_model(model_dir, CPU).block_kernel_fallback is None  # the real kernel passes
