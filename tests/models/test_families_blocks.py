"""Each family with its projections as GGUF blocks (tests/models/test_block_linear.py's
blockify): where the native decoder implements the description (Llama 3's scaled RoPE comes
from Python), it runs and equals the Python loop bit for bit; where it does not (Qwen3, Gemma 3,
Phi-3), it is refused with the reason kept, and the Python loop over the blocks gives the dense
model's logits (exact numerics), Gemma's (1 + w) norms and GELU never fused into a kernel call
that would compute a plain norm or SiLU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.kernels import decoder
from specserve.models.block_linear import BlockLinear
from specserve.models.native_stack import NativeStack, python_layers
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.models.test_block_linear import blockify
from tests.models.test_families_engine import FAMILIES
from tests.models.test_native_stack import steps
from tests.tiny import make_model_dir

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("block_kernels", "attention_kernels")


def test_llama3_rope_runs_native_bit_for_bit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arch, config = FAMILIES["llama3"]
    model_dir = blockify(make_model_dir(tmp_path, arch, tied=True, config=config))
    model = build_model(model_dir, CPU)
    assert isinstance(model.native_stack, NativeStack) and model.native_refusal is None
    calls: list[object] = []
    real = decoder.run_layers

    def counted(*args: object) -> None:
        calls.append(args)
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(decoder, "run_layers", counted)
    got = steps(ModelRunner(model, 16, 16, CPU))
    assert len(calls) == 4  # every step ran natively
    with python_layers():
        want = steps(ModelRunner(model, 16, 16, CPU))
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.logits, w.logits)


@pytest.mark.parametrize(
    ("family", "missing"),
    [("qwen3", "q/k norm"), ("gemma3", "(1 + w) RMSNorm"), ("phi3", "partial rotary")],
)
def test_refused_natively_and_right_on_blocks(family: str, missing: str, tmp_path: Path) -> None:
    arch, config = FAMILIES[family]
    model_dir = blockify(make_model_dir(tmp_path, arch, config=config))
    model = build_model(model_dir, CPU, numerics="exact")
    assert model.native_stack is None
    assert model.native_refusal is not None and missing in model.native_refusal
    assert all(isinstance(layer.gate_up_proj, BlockLinear) for layer in model.layers)
    dense = build_model(model_dir, CPU, gguf_blocks=False)  # the blocks' own float32 values
    ids = torch.randint(0, 320, (30,), generator=torch.Generator().manual_seed(2)).tolist()
    table = [3, 1, 4, 0, 2, 5, 7, 6]
    got = ModelRunner(model, 8, 4, CPU).run([RunItem(ids, 0, table, num_logits=30)]).logits
    want = ModelRunner(dense, 8, 4, CPU).run([RunItem(ids, 0, table, num_logits=30)]).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
