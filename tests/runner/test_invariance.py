"""A row's logits are bit-identical however the runner's step is made up (tiny random model).

What this checks is what attention controls: every projection here runs one row at a time (a
row-by-row nn.Linear), so the rest of the model is row-invariant by construction. With the plain
dense projections (torch/MKL matmuls whose blocking depends on M) or the GGUF block kernels, the
same equalities hold only once those kernels are row-invariant too.
"""

from __future__ import annotations

from typing import Protocol

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specserve.config import KvDtype
from specserve.models.llama import DecoderLM
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from tests.tiny import make_tiny_model

CPU = torch.device("cpu")
BLOCK = 16
pytestmark = pytest.mark.usefixtures("attention_kernels")


class LinearForward(Protocol):
    """nn.Linear.forward's signature, its parameter's name included."""

    def __call__(self, input: torch.Tensor) -> torch.Tensor: ...


def row_by_row(linear: nn.Linear) -> LinearForward:
    def forward(input: torch.Tensor) -> torch.Tensor:  # [M, in] -> [M, out], each row alone
        rows = [F.linear(input[i : i + 1], linear.weight, linear.bias) for i in range(len(input))]
        return torch.cat(rows)

    return forward


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> DecoderLM:
    model = build_model(make_tiny_model(tmp_path_factory.mktemp("tiny")), CPU)
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = row_by_row(module)  # type: ignore[method-assign]
    return model


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def prefill(
    runner: ModelRunner, ids: list[int], table: list[int], chunk: int, start: int = 0
) -> torch.Tensor:
    """Logits of every row fed, `chunk` rows a step: [len(ids) - start, vocab]."""
    out = []
    for a in range(start, len(ids), chunk):
        piece = ids[a : a + chunk]
        out.append(runner.run([RunItem(piece, a, table, num_logits=len(piece))]).logits)
    return torch.cat(out)


KV_DTYPES: list[KvDtype] = ["float16", "float32"]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_prefill_logits_equal_whatever_the_chunking(model: DecoderLM, kv_dtype: KvDtype) -> None:
    ids, table = tokens(300, seed=1), list(range(19))[::-1]
    runner = ModelRunner(model, 64, BLOCK, CPU, kv_dtype=kv_dtype)
    assert runner.kv.dtype == getattr(torch, kv_dtype)
    whole = prefill(runner, ids, table, chunk=300)
    for chunk in (1, 7, 16):
        runner.kv.zero_()
        assert torch.equal(prefill(runner, ids, table, chunk), whole), chunk


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_logits_equal_with_the_prefix_from_the_prefix_cache(
    model: DecoderLM, kv_dtype: KvDtype
) -> None:
    """B starts with A's first 256 tokens and takes A's 16 blocks for them, as the prefix cache
    hands them out; its later rows equal B computed from scratch."""
    a, b = tokens(300, seed=2), tokens(300, seed=2)[:256] + tokens(64, seed=3)
    runner = ModelRunner(model, 64, BLOCK, CPU, kv_dtype=kv_dtype)
    table_a = list(range(19))
    prefill(runner, a, table_a, chunk=100)
    cached = prefill(runner, b, [*table_a[:16], 40, 41, 42, 43], chunk=64, start=256)
    computed = prefill(runner, b, list(range(44, 64)), chunk=320)
    assert torch.equal(cached, computed[256:])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES)
def test_decode_logits_equal_alone_batched_and_verified(
    model: DecoderLM, kv_dtype: KvDtype
) -> None:
    ids, more = tokens(300, seed=4), tokens(8, seed=5)
    table, other, third = list(range(20)), list(range(20, 40)), list(range(40, 48))
    runner = ModelRunner(model, 64, BLOCK, CPU, kv_dtype=kv_dtype)
    prefill(runner, ids, table, chunk=300)
    prefill(runner, tokens(100, seed=6), other, chunk=100)
    alone = [runner.run([RunItem([t], 300 + i, table, 1)]).logits for i, t in enumerate(more)]
    neighbours = [
        RunItem(tokens(1, seed=7), 100, other, 1),
        RunItem(tokens(50, seed=8), 0, third, 1),
    ]
    batched = runner.run([neighbours[0], RunItem(more[:1], 300, table, 1), neighbours[1]]).logits
    verified = runner.run([RunItem(more, 300, table, len(more))]).logits
    assert torch.equal(batched[1:2], alone[0])
    for i in range(len(more)):
        assert torch.equal(verified[i : i + 1], alone[i]), i
