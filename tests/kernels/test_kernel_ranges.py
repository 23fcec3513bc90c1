"""The C kernels refuse indices outside what they were given (issue 54, item 10): a sequence's
context past its block table, a table entry past the KV pool, more query rows than context, a
new row's cache slot past the pool. Today's callers are consistent; these checks keep a future
mistake an error instead of a read or write past the cache."""

from __future__ import annotations

import pytest
import torch

from specserve.kernels import attention as kernel
from specserve.kernels import decoder

BS, HEADS, DIM = 16, (2, 1, 8), 8  # block size; (H, Hkv, D)
POOL_BLOCKS = 4


def attend(seqs: list[tuple[int, int, int]], tables: list[list[int]]) -> torch.Tensor:
    num_heads, num_kv, dim = HEADS
    rows = max(first + q_len for first, q_len, _ in seqs)
    q = torch.randn(rows, num_heads, dim)
    cache = torch.randn(2, num_kv, POOL_BLOCKS * BS, dim)
    out = torch.zeros_like(q)
    kernel.paged_attention(
        q, cache[0], cache[1], out, torch.tensor(seqs), torch.tensor(tables, dtype=torch.int32),
        BS, dim**-0.5, None,
    )  # fmt: skip
    return out


@pytest.mark.usefixtures("attention_kernels")
def test_paged_attention_refuses_indices_out_of_range() -> None:
    assert attend([(0, 2, 20)], [[3, 0]]).abs().sum() > 0  # in range: computed
    bad = {
        "a block past the pool": ([(0, 2, 20)], [[3, POOL_BLOCKS]]),
        "a negative block": ([(0, 1, 5)], [[-1, 0]]),
        "a context past its table": ([(0, 1, 40)], [[0, 1]]),
        "more rows than context": ([(0, 3, 2)], [[0, 1]]),
    }
    for name, (seqs, tables) in bad.items():
        with pytest.raises(RuntimeError, match="refused"):
            attend(seqs, tables)
            pytest.fail(f"accepted {name}")


@pytest.mark.usefixtures("block_kernels")
def test_decoder_stack_refuses_a_slot_past_the_pool() -> None:
    """No layer is needed to see it: the slots are checked before the first one writes K/V."""
    num_heads, num_kv, dim = HEADS
    shape = decoder.Shape(num_heads * dim, 16, num_heads, num_kv, dim, 1e-5, dim**-0.5, 1)
    x = torch.zeros(1, num_heads * dim)
    cos = sin = torch.zeros(1, dim)
    seqs = torch.tensor([[0, 1, 1]])
    tables = torch.zeros(1, 1, dtype=torch.int32)
    for slot, ok in ((BS - 1, True), (BS, False), (-1, False)):
        slots = torch.tensor([slot])
        batch = decoder.Batch(
            slots.data_ptr(), seqs.data_ptr(), tables.data_ptr(), 1, 1, BS, 0, BS, 4
        )
        if ok:
            decoder.run_layers(
                (decoder.Layer * 0)(), shape, decoder.batches(batch), x, [(cos, sin)]
            )
            continue
        with pytest.raises(RuntimeError, match="layer 0"):
            decoder.run_layers(
                (decoder.Layer * 0)(), shape, decoder.batches(batch), x, [(cos, sin)]
            )
