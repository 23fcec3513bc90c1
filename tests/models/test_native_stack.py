"""The layers in one native call (models/native_stack.py) give the Python layer loop's outputs
bit for bit, and run wherever the loader attaches them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specserve.config import KvDtype, Numerics
from specserve.kernels import decoder
from specserve.models.block_linear import DIRECT_MAX_ROWS
from specserve.models.llama import DecoderLayer
from specserve.models.native_stack import NativeStack, python_layers
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem, RunOutput
from tests.models.test_block_linear import blockify
from tests.tiny import make_model_dir

CPU = torch.device("cpu")
BLOCK = 16
pytestmark = pytest.mark.usefixtures("block_kernels", "attention_kernels")


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def native_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rows (x's) of every native decoder call from now on, the calls still made."""
    calls: list[int] = []
    real = decoder.run_layers

    def counted(*args: object) -> None:
        calls.append(args[3].shape[0])  # type: ignore[attr-defined]  # x's rows
        real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(decoder, "run_layers", counted)
    return calls


STEP_ROWS = (50, 80, 6, 36)  # one over DIRECT_MAX_ROWS (64)


def steps(runner: ModelRunner) -> list[RunOutput]:
    """Steps of STEP_ROWS rows: a prefill in two chunks (beside another prompt), then a decode
    row with a 5-row verify, then both again beside a third prompt's prefill."""
    a, b, c = tokens(90, 1), tokens(40, 2), tokens(30, 3)
    ta, tb = [0, 1, 2, 3, 4, 5], [6, 7, 8, 11]
    return [
        runner.run([RunItem(a[:50], 0, ta, 1)]),
        runner.run([RunItem(a[50:], 50, ta, 4), RunItem(b, 0, tb, 2)]),
        runner.run([RunItem(tokens(1, 4), 90, ta, 1), RunItem(tokens(5, 5), 40, tb, 5)]),
        runner.run(
            [
                RunItem(tokens(1, 6), 91, ta, 1),
                RunItem(tokens(5, 7), 45, tb, 5),
                RunItem(c, 0, [9, 10], 3),
            ]
        ),
    ]


@pytest.mark.parametrize(
    ("arch", "numerics", "kv_dtype"),
    [
        ("llama", "q8", "float16"),
        ("llama", "exact", "float32"),
        ("qwen2", "q8", "float32"),  # q/k/v biases
        ("mistral", "q8", "float16"),  # a sliding window (24) shorter than the contexts
    ],
)
def test_native_layers_equal_the_python_layers_bit_for_bit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    arch: str,
    numerics: Numerics,
    kv_dtype: KvDtype,
) -> None:
    model = build_model(blockify(make_model_dir(tmp_path, arch, tied=True)), CPU, numerics=numerics)
    assert isinstance(model.native_stack, NativeStack)
    biases: list[torch.Tensor] = []
    for layer in model.layers:
        assert isinstance(layer, DecoderLayer)
        if layer.qkv_proj.bias is not None:
            biases.append(layer.qkv_proj.bias)
    assert len(biases) == (len(model.layers) if arch == "qwen2" else 0)
    for bias in biases:  # a fresh model's are zero, which would hide a bias left out
        bias.data.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
    calls = native_calls(monkeypatch)

    native = ModelRunner(model, 16, BLOCK, CPU, kv_dtype=kv_dtype)
    got = steps(native)
    python = ModelRunner(model, 16, BLOCK, CPU, kv_dtype=kv_dtype)
    with python_layers():
        want = steps(python)
    # exact numerics hands larger steps to the dense GEMM, which only Python runs
    assert calls == [rows for rows in STEP_ROWS if numerics == "q8" or rows <= DIRECT_MAX_ROWS]
    assert numerics == "q8" or len(calls) < len(STEP_ROWS)  # both paths seen in exact
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g.logits, w.logits) and torch.equal(g.hidden, w.hidden)
    assert torch.equal(native.kv, python.kv)  # the K/V written, fp16 rounding included


def test_only_models_on_blocks_get_the_native_stack(tmp_path: Path) -> None:
    model_dir = blockify(make_model_dir(tmp_path, "llama"))
    assert isinstance(build_model(model_dir, CPU).native_stack, NativeStack)
    assert build_model(model_dir, CPU, gguf_blocks=False).native_stack is None
