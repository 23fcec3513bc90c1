"""Ragged attention (the paged kernel for every row) against the padded reference path."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from specserve.kernels import attention as kernel
from specserve.models import attention
from specserve.models.attention import build_ragged_metadata
from specserve.models.attention_reference import build_metadata
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem

CPU = torch.device("cpu")
# The kernel runs a sequence feeding more rows than this by query blocks (paged_attention.c).
SPLIT_QUERY = 32
pytestmark = pytest.mark.usefixtures("attention_kernels")


def attend_both(
    q_lens: list[int],
    ctx_lens: list[int],
    heads: tuple[int, int, int] = (9, 3, 64),
    block_size: int = 16,
    window: int | None = None,
    spare_blocks: int = 2,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both paths on one random step over shuffled block tables (with unused slots at the end)."""
    num_heads, num_kv, dim = heads
    rng = random.Random(seed)
    torch.manual_seed(seed)
    need = sum(-(-c // block_size) + spare_blocks for c in ctx_lens)
    free = list(range(need))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-c // block_size) + rng.randint(0, spare_blocks))]
              for c in ctx_lens]  # fmt: skip
    total = sum(q_lens)
    q = torch.randn(total, num_heads + num_kv, dim)[:, :num_heads]  # a strided view, as in a layer
    k, v = torch.randn(total, num_kv, dim), torch.randn(total, num_kv, dim)
    cache = torch.randn(2, num_kv, need * block_size, dim)
    outs = []
    for build in (build_ragged_metadata, build_metadata):
        kc, vc = cache[0].clone(), cache[1].clone()
        meta = build(q_lens, ctx_lens, tables, block_size, CPU, window)
        outs.append(meta.attend(q, k, v, kc, vc, dim**-0.5))
    return outs[0], outs[1]


CASES = {
    "one decode row, one key": ([1], [1]),
    "decode at a block boundary": ([1, 1, 1], [16, 17, 32]),
    "long single context (key splits)": ([1], [3000]),
    "verify rows": ([5, 9, 2], [400, 90, 33]),
    "ragged decode batch": ([1] * 16, [7 * i + 1 for i in range(16)]),
    "prefill from scratch": ([100], [100]),
    "later prefill chunk": ([64], [200]),
    "prefill chunk beside decode and verify rows": ([1, 40, 3, 1, 300], [800, 40, 64, 5, 700]),
    "largest split-task query beside the smallest query-block one": (
        [SPLIT_QUERY, SPLIT_QUERY + 1],
        [SPLIT_QUERY, SPLIT_QUERY + 50],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_ragged_equals_reference(case: str) -> None:
    q_lens, ctx_lens = CASES[case]
    got, want = attend_both(q_lens, ctx_lens)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("q_lens", "ctx_lens", "window"),
    [([1, 4], [100, 50], 24), ([60], [60], 24), ([50], [300], 64), ([1, 9], [4000, 33], 256)],
)
def test_sliding_window_equals_reference(
    q_lens: list[int], ctx_lens: list[int], window: int
) -> None:
    got, want = attend_both(q_lens, ctx_lens, window=window)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("heads", [(4, 4, 16), (4, 2, 16), (8, 1, 128), (6, 3, 96), (2, 1, 256)])
def test_head_layouts_equal_reference(heads: tuple[int, int, int]) -> None:
    got, want = attend_both([1, 3, 50], [300, 17, 80], heads=heads, block_size=4)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_two_threads_split_long_contexts_the_same() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got, want = attend_both([1, 2], [2500, 1200])
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_kernel_refuses_shapes_it_cannot_run() -> None:
    assert not kernel.supports(12, 4, 2)  # head_dim not a multiple of 8
    assert not kernel.supports(64, 6, 4)  # heads not a multiple of KV heads
    q = torch.randn(1, 4, 12)
    cache = torch.zeros(2, 16, 12)
    with pytest.raises(RuntimeError, match="refused"):
        kernel.paged_attention(
            q, cache, cache, torch.empty_like(q), torch.tensor([[0, 1, 1]]),
            torch.zeros(1, 1, dtype=torch.int32), 16, 1.0, None,
        )  # fmt: skip


def test_runner_uses_the_reference_without_the_kernel(
    tiny_llama: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_model(tiny_llama, CPU)
    assert ModelRunner(model, 8, 4, CPU).ragged
    assert not ModelRunner(model, 8, 4, CPU, attention="reference").ragged
    monkeypatch.setattr(attention.kernel, "library", lambda: None)
    assert not ModelRunner(model, 8, 4, CPU).ragged


def test_model_logits_equal_on_a_mixed_step(tiny_llama: Path) -> None:
    """A whole forward pass (2 layers) over prefill chunks beside decode/verify rows."""
    model = build_model(tiny_llama, CPU)
    g = torch.Generator().manual_seed(2)
    # (fed tokens, start): decode, verify, first prefill chunk, later prefill chunk
    shapes = [(1, 60), (4, 37), (45, 0), (40, 41)]
    items = []
    for i, (n, start) in enumerate(shapes):
        ids = torch.randint(0, 320, (n,), generator=g).tolist()
        table = list(range(32 * i, 32 * i + -(-(start + n) // 4)))
        items.append(RunItem(ids, start, table, num_logits=n))
    logits = []
    for impl in ("auto", "reference"):
        runner = ModelRunner(model, 128, 4, CPU, attention=impl)
        torch.manual_seed(3)
        runner.kv.normal_()  # the cached context both paths read
        logits.append(runner.run(items).logits)
    torch.testing.assert_close(logits[0], logits[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("ctx", "window"), [(40, None), (700, None), (1030, None), (600, 100)])
def test_a_verify_row_equals_the_same_row_decoded_alone_bit_for_bit(
    ctx: int, window: int | None
) -> None:
    """Whatever the rows, sequences and threads beside it: chunks and key splits sit at
    absolute positions, so speculation on or off computes the same attention for a row."""
    torch.manual_seed(1)
    heads, kv, dim, bs = 9, 3, 64, 16
    table = list(range(ctx // bs + 2))[::-1]
    other = list(range(len(table), len(table) + 4))  # a 50-token neighbour's blocks
    kc, vc = torch.randn(2, kv, (len(table) + 4) * bs, dim)
    q = torch.randn(5, heads, dim)

    def attend(
        q_lens: list[int], ctxs: list[int], tables: list[list[int]], rows: torch.Tensor
    ) -> torch.Tensor:
        meta = build_ragged_metadata(q_lens, ctxs, tables, bs, CPU, window)
        slots = meta.slot_mapping  # the step writes back what the cache holds: no change
        k_new, v_new = kc[:, slots].transpose(0, 1), vc[:, slots].transpose(0, 1)
        return meta.attend(rows, k_new, v_new, kc, vc, dim**-0.5).view(-1, heads, dim)

    together = attend([5], [ctx], [table], q)
    threads = torch.get_num_threads()
    try:
        for i in range(5):
            torch.set_num_threads(1 + i % 2)
            alone = attend([1], [ctx - 4 + i], [table], q[i : i + 1])
            beside = attend(
                [3, 1], [50, ctx - 4 + i], [other, table], torch.cat([q[:3], q[i : i + 1]])
            )
            assert torch.equal(together[i], alone[0]), i
            assert torch.equal(beside[3], alone[0]), i
    finally:
        torch.set_num_threads(threads)
