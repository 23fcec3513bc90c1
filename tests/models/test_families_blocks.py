"""Each family with its projections as GGUF blocks (tests/models/test_block_linear.py's
blockify): where the native decoder implements the description (Llama 3's scaled RoPE, Qwen3's
q/k norm, Gemma 3's (1 + w) and sandwich norms, GELU-tanh, sliding and full layers with their
own RoPE, Phi-3's partial rotary), it runs and equals the Python loop bit for bit, and gives
the dense model's logits (exact numerics)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.config import KvDtype, Numerics
from specserve.models.block_linear import DIRECT_MAX_ROWS, BlockLinear
from specserve.models.layer import DecoderLayer, RMSNorm
from specserve.models.native_stack import NativeStack, python_layers
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.engine.helpers import assert_no_kv_held, make_engine, mixed_prompts, run_all
from tests.models.test_block_linear import blockify
from tests.models.test_families_engine import FAMILIES, LOOPY, greedy
from tests.models.test_native_stack import STEP_ROWS, native_calls, steps
from tests.tiny import make_model_dir

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("block_kernels", "attention_kernels")


# (family, numerics, kv dtype): each family the native decoder runs, Gemma 3 with its window
# (8) shorter than the steps' contexts; exact numerics hands the 80-row step to Python
NATIVE = [
    ("llama3", "q8", "float32"),
    ("qwen3", "q8", "float16"),
    ("qwen3", "exact", "float32"),
    ("gemma3", "q8", "float16"),
    ("gemma3", "exact", "float32"),
    ("phi3", "q8", "float16"),  # RoPE over half of each head
]


@pytest.mark.parametrize(("family", "numerics", "kv_dtype"), NATIVE)
def test_native_equals_the_python_layers_bit_for_bit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    family: str,
    numerics: Numerics,
    kv_dtype: KvDtype,
) -> None:
    arch, config = FAMILIES[family]
    model_dir = blockify(make_model_dir(tmp_path, arch, tied=True, config=config))
    model = build_model(model_dir, CPU, numerics=numerics)
    assert isinstance(model.native_stack, NativeStack) and model.native_refusal is None
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    # fresh norms are all alike (Gemma's all zero): random ones show one taken for another
    for i, norm in enumerate(norms):
        norm.weight.data.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(i))
    assert len(norms) == 1 + len(model.layers) * {"gemma3": 6, "qwen3": 4}.get(family, 2)
    first = model.layers[0]
    assert isinstance(first, DecoderLayer)
    assert (first.rotary_dim < first.head_dim) == (family == "phi3")
    calls = native_calls(monkeypatch)
    native = ModelRunner(model, 16, 16, CPU, kv_dtype=kv_dtype)
    got = steps(native)
    assert calls == [r for r in STEP_ROWS if numerics == "q8" or r <= DIRECT_MAX_ROWS]
    python = ModelRunner(model, 16, 16, CPU, kv_dtype=kv_dtype)
    with python_layers():
        want = steps(python)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.logits, w.logits) and torch.equal(g.hidden, w.hidden)
    assert torch.equal(native.kv, python.kv)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_native_on_blocks_gives_the_dense_models_logits(family: str, tmp_path: Path) -> None:
    """Exact numerics: the native decoder over the blocks computes the torch path's model (the
    dense one of the blocks' own float32 values) up to float32 summation order."""
    arch, config = FAMILIES[family]
    model_dir = blockify(make_model_dir(tmp_path, arch, config=config))
    model = build_model(model_dir, CPU, numerics="exact")
    assert isinstance(model.native_stack, NativeStack), model.native_refusal
    assert all(isinstance(layer.gate_up_proj, BlockLinear) for layer in model.layers)
    dense = build_model(model_dir, CPU, gguf_blocks=False)  # the blocks' own float32 values
    assert dense.native_stack is None
    ids = torch.randint(0, 320, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    table = [3, 1, 4, 0, 2, 5, 7, 6]
    got = ModelRunner(model, 8, 4, CPU).run([RunItem(ids, 0, table, num_logits=30)]).logits
    want = ModelRunner(dense, 8, 4, CPU).run([RunItem(ids, 0, table, num_logits=30)]).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_native_speculation_on_off_bit_identical(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each family on GGUF blocks through the engine, its layers native on both sides: greedy
    output the same with n-gram drafts verified (some kept, some rejected) and without."""
    arch, config = FAMILIES[family]
    model_dir = blockify(make_model_dir(tmp_path, arch, config=config))
    prompts = LOOPY + mixed_prompts(3, seed=4)
    calls = native_calls(monkeypatch)
    want = run_all(make_engine(model_dir), prompts, greedy())
    off = len(calls)
    engine = make_engine(model_dir, speculate=3, proposer="ngram", policy="static")
    assert isinstance(engine.model.native_stack, NativeStack)
    assert run_all(engine, prompts, greedy()) == want
    assert off > 0 and len(calls) > off  # both sides ran natively
    stats = engine.stats.proposer
    assert 0 < stats.accepted_tokens < stats.drafted_tokens
    assert_no_kv_held(engine)
