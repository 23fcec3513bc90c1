"""Decoders running on GGUF blocks: the layers, the q/k row order, and the swap into a model."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import quants
from safetensors.torch import load_file, save_file

from specserve.config import Numerics
from specserve.engine.engine import Engine
from specserve.kernels import ggml
from specserve.kernels.ggml import BlockKind
from specserve.models import block_linear
from specserve.models.block_linear import (
    BlockEmbedding,
    BlockLinear,
    block_kinds,
    block_numerics,
)
from specserve.models.gguf_blocks import BLOCKS_FILE, _f32_bound, _q8_bound
from specserve.models.gguf_weights import hf_name, unpermute_rows
from specserve.models.llama import RMSNorm, project
from specserve.models.registry import build_model
from specserve.request import SamplingParams
from tests.engine.helpers import make_engine, mixed_prompts, run_all
from tests.kernels.test_ggml import GGML_TYPES, quantised
from tests.tiny import make_model_dir

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected
CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "rows", [1, block_linear.DIRECT_MAX_ROWS, block_linear.DIRECT_MAX_ROWS + 9]
)
@pytest.mark.parametrize("numerics", ["exact", "q8"])
def test_block_linear_equals_linear_on_decoded_weights(rows: int, numerics: Numerics) -> None:
    blocks, weights = quantised(BlockKind.Q4_1, 24, 64)
    bias = torch.randn(24)
    layer = BlockLinear(blocks, BlockKind.Q4_1, 64, bias, numerics)
    x = torch.randn(2, rows, 64)
    got, want = layer(x), F.linear(x, weights, bias)
    if numerics == "exact":
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    else:  # within the error of quantising each 32-value block of x (and float32 rounding)
        flat = x.reshape(-1, 64)
        bound = _q8_bound(flat, weights) + _f32_bound(flat, weights) + 1e-5
        assert bool(((got - want).reshape(-1, 24).abs() <= bound).all())
    assert torch.equal(layer.weight, weights)


@pytest.mark.parametrize("kind", ggml.GGUF_KINDS)
@pytest.mark.parametrize("out", [40, 37])  # rows interleaved eight at a time; plain rows
def test_q8_rows_do_not_depend_on_m_through_the_layer(kind: BlockKind, out: int) -> None:
    """A row's projection, plain and fused (RMSNorm + residual, SwiGLU), bit-identical for every
    M, on both sides of DIRECT_MAX_ROWS: the q8 layer never switches kernels."""
    k = kind.block_values * (2 if kind.block_values == 32 else 1)  # 64, or a K-quant block
    blocks, weights = quantised(kind, out, k)
    layer = BlockLinear(blocks, kind, k, torch.randn(out), "q8")
    assert layer.kind is (kind.x8 if out % 8 == 0 and kind.has_x8 else kind)
    assert torch.equal(layer.weight, weights)  # whatever the layout
    norm = RMSNorm(k, 1e-5)
    x, gated = torch.randn(512, k), torch.randn(512, 2 * k)
    residual = torch.randn(512, out)

    def forms(rows: torch.Tensor) -> list[torch.Tensor]:
        return [
            layer(x[rows]),
            project(layer, x[rows], norm=norm, residual=residual[rows]),
            project(layer, gated[rows], glu="silu"),
        ]

    each = [forms(torch.tensor([i])) for i in range(512)]
    alone = [torch.cat(parts) for parts in zip(*each, strict=True)]
    perm = torch.randperm(512, generator=torch.Generator().manual_seed(1))
    for m in (1, 2, 5, 24, 25, 100, 512):
        for got, want in zip(forms(perm[:m]), alone, strict=True):
            assert torch.equal(got, want[perm[:m]]), m


def test_unpermuting_block_rows_commutes_with_decoding() -> None:
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    blocks, weights = quantised(BlockKind.Q4_1, 32, 64)  # 4 heads of head_dim 8
    processor = LlamaTensorProcessor(config={"num_attention_heads": 4, "num_key_value_heads": 4})
    expected = processor._reverse_permute_weights(weights.numpy(), 4, 4)
    rows = torch.from_numpy(unpermute_rows(blocks.numpy(), 4).copy())
    assert np.array_equal(ggml.dequantize(rows, BlockKind.Q4_1, 64).numpy(), expected)


def test_gguf_names_map_to_transformers_names() -> None:
    assert hf_name("blk.3.attn_k.weight") == "model.layers.3.self_attn.k_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert hf_name("blk.0.attn_norm.weight") == "model.layers.0.input_layernorm.weight"
    assert hf_name("blk.0.ffn_norm.weight", "gemma3") == (
        "model.layers.0.pre_feedforward_layernorm.weight"
    )
    assert hf_name("blk.0.ffn_up.weight", "phi3") == "model.layers.0.mlp.gate_up_proj.weight"
    assert hf_name("rope_freqs.weight") is None


def blockify(model_dir: Path) -> Path:
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
    """Exact numerics: the dense engine's tokens, with speculation on and off."""
    model_dir = blockify(make_model_dir(tmp_path, "llama", tied=tied))
    model = build_model(model_dir, CPU, numerics="exact")
    layer = model.layers[0]
    assert isinstance(layer.qkv_proj, BlockLinear) and isinstance(layer.down_proj, BlockLinear)
    assert layer.qkv_proj.numerics == "exact"
    assert isinstance(model.lm_head, BlockLinear) == tied  # untied lm_head stays float32 here
    assert isinstance(model.embed_tokens, BlockEmbedding)
    if tied:  # one copy of the Q8_0 rows serves both
        assert isinstance(model.lm_head, BlockLinear)
        assert model.embed_tokens.blocks.data_ptr() == model.lm_head.blocks.data_ptr()
    dense = build_model(model_dir, CPU, gguf_blocks=False)
    assert not isinstance(dense.layers[0].qkv_proj, BlockLinear)
    assert (block_numerics(model), block_numerics(dense)) == ("exact", None)  # /info's

    prompts = mixed_prompts(6)
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    exact = partial(make_engine, model_dir, numerics="exact")
    on_blocks = run_all(exact(), prompts, params)
    assert on_blocks == run_all(exact(dense_weights=True), prompts, params)
    assert on_blocks == run_all(exact(speculate=3), prompts, params)


def test_q8_engine_is_lossless_under_speculation_and_batching(tmp_path: Path) -> None:
    """The default numerics: greedy tokens and their logprobs bit-identical with speculation on
    and off, alone or in a batch, prefix cache off. Tied, so the lm_head runs on blocks too (an
    untied float32 lm_head is MKL, whose rows vary with M by ~1e-6); prefill chunking stays
    fixed (chunked attention is not yet invariant: ~5e-7)."""
    model_dir = blockify(make_model_dir(tmp_path, "llama", tied=True))
    model = build_model(model_dir, CPU)
    layer = model.layers[0].qkv_proj
    assert isinstance(layer, BlockLinear) and layer.numerics == "q8"  # the default
    assert layer.kind is BlockKind.Q4_1_X8 and model.lm_head.kind is BlockKind.Q8_0_X8
    # one copy of the interleaved rows serves the lm_head and the embedding lookups
    assert model.embed_tokens.blocks.data_ptr() == model.lm_head.blocks.data_ptr()
    assert block_kinds(model) == ["Q4_1", "Q8_0"]  # /info names the GGUF types
    prompts = mixed_prompts(6)
    params = SamplingParams(max_new_tokens=12, ignore_eos=True, logprobs=2)
    want = [logprobs(make_engine(model_dir), [p], params)[0] for p in prompts]
    assert logprobs(make_engine(model_dir), prompts, params) == want
    assert logprobs(make_engine(model_dir, speculate=3), prompts, params) == want
    engine = make_engine(
        model_dir, num_blocks=512, max_batch_tokens=1024, speculate=5, prefix_caching=False
    )  # room for all 12 prompts in one step: no chunk, no preemption
    assert logprobs(engine, prompts + prompts, params) == want + want
    assert engine.stats.proposer.accepted_tokens > 0


def test_default_path_rows_do_not_depend_on_chunks_cache_or_preemption(tmp_path: Path) -> None:
    """The default path end to end (q8 blocks, fp16 K/V, every row through the paged kernel):
    each request's tokens and logprobs bit-identical to it alone in a roomy engine, whatever
    size its prefill chunks are, whether its prefix came from the prefix cache, and when it was
    preempted and recomputed; with speculation on as well."""
    model_dir = blockify(make_model_dir(tmp_path, "llama", tied=True))
    prompts = mixed_prompts(8, seed=1)
    params = SamplingParams(max_new_tokens=24, ignore_eos=True, logprobs=2)
    roomy = partial(make_engine, model_dir, num_blocks=512, max_batch_tokens=1024)
    want = [logprobs(roomy(prefix_caching=False), [p], params)[0] for p in prompts]
    for budget in (1, 7, 16):  # prefill chunks of at most this many tokens a step
        engine = make_engine(model_dir, max_batch_tokens=budget, prefix_caching=False)
        assert logprobs(engine, prompts, params) == want, budget
    cached = roomy(speculate=3)
    assert logprobs(cached, prompts, params) == want
    assert logprobs(cached, prompts, params) == want  # now from cached prefixes
    assert cached.res.allocator.stats.hit_tokens > 0 and cached.stats.proposer.drafted_tokens > 0
    tight = make_engine(model_dir, num_blocks=24, speculate=3)  # 96 slots for 8 x up to 64
    assert logprobs(tight, prompts, params) == want
    assert tight.scheduler.num_preemptions > 0


def logprobs(
    engine: Engine, prompts: list[list[int]], params: SamplingParams
) -> list[list[tuple[int, float, list[tuple[int, float]]]]]:
    """Each request's (token, logprob, top) per output token, in prompt order."""
    ids = [engine.add_request(p, params) for p in prompts]
    got: dict[str, list[tuple[int, float, list[tuple[int, float]]]]] = {i: [] for i in ids}
    while engine.has_work():
        for out in engine.step():
            assert out.finish_reason != "error", out.error
            got[out.request_id] += [(e.token, e.logprob, list(e.top)) for e in out.logprobs or []]
    return [got[i] for i in ids]


def test_a_kernel_that_multiplies_wrong_falls_back_to_float32_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = blockify(make_model_dir(tmp_path, "llama"))
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
