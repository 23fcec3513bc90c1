"""A row's attention output is bit-identical however its step is made up.

Random per-position q/k/v stand in for a model's: a row's output must not depend on whether it is
decoded alone, verified among k + 1 rows, batched beside other sequences, prefilled in a chunk of
any size, or attends to a prefix whose K/V another sequence's step wrote (the prefix cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from specserve.models.attention import build_ragged_metadata

CPU = torch.device("cpu")
HEADS, KV_HEADS, DIM, BLOCK = 6, 2, 64, 16
pytestmark = pytest.mark.usefixtures("attention_kernels")

Feed = tuple[str, int, int]  # sequence, first position, end position: rows start .. end - 1


class Sequences:
    """Per-position q/k/v of named sequences over one paged cache; a step feeds slices of them."""

    def __init__(self, dtype: torch.dtype, window: int | None, num_blocks: int = 160) -> None:
        # NaN until written: a row that read a key past its own position would turn NaN.
        self.cache = torch.full((2, KV_HEADS, num_blocks * BLOCK, DIM), float("nan"), dtype=dtype)
        self.window = window
        self.qkv: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.tables: dict[str, list[int]] = {}
        self.next_block = 0

    def add(
        self, name: str, n: int, seed: int, prefix_of: str | None = None, shared: int = 0
    ) -> None:
        """A sequence of n positions; its first `shared` blocks (and their positions' q/k/v)
        are those of `prefix_of`, as when the prefix cache hands it that sequence's blocks."""
        g = torch.Generator().manual_seed(seed)
        q, k, v = (torch.randn(n, h, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
        table = []
        if prefix_of is not None:
            upto = shared * BLOCK
            for mine, theirs in zip((q, k, v), self.qkv[prefix_of], strict=True):
                mine[:upto] = theirs[:upto]
            table = self.tables[prefix_of][:shared]
        own = -(-n // BLOCK) - len(table)
        self.tables[name] = table + list(range(self.next_block, self.next_block + own))[::-1]
        self.next_block += own
        self.qkv[name] = (q, k, v)

    def step(self, feeds: list[Feed]) -> list[torch.Tensor]:  # per feed [end - start, H, D]
        meta = build_ragged_metadata(
            [e - s for _, s, e in feeds], [e for _, _, e in feeds],
            [self.tables[n] for n, _, _ in feeds], BLOCK, CPU, self.window,
        )  # fmt: skip
        q, k, v = (torch.cat([self.qkv[n][i][s:e] for n, s, e in feeds]) for i in range(3))
        out = meta.attend(q, k, v, self.cache[0], self.cache[1], DIM**-0.5).view(-1, HEADS, DIM)
        return list(out.split([e - s for _, s, e in feeds]))

    def prefill(self, name: str, end: int, chunk: int, start: int = 0) -> torch.Tensor:
        """Rows start .. end - 1 fed `chunk` at a time: [end - start, H, D]."""
        bounds = range(start, end, chunk)
        return torch.cat([self.step([(name, a, min(a + chunk, end))])[0] for a in bounds])

    def clear(self) -> None:
        self.cache.fill_(float("nan"))


@contextmanager
def threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


DTYPES = [torch.float16, torch.float32]
WINDOWS = [None, 100]


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_prefill_rows_equal_whatever_the_chunking(dtype: torch.dtype, window: int | None) -> None:
    """One chunk of 600 rows (query blocks) against chunks of 1, 7, 16 and 33 rows (decode and
    verify tasks, then query blocks), splits of 256 keys crossed both ways."""
    seqs = Sequences(dtype, window)
    seqs.add("a", 600, seed=1)
    whole = seqs.prefill("a", 600, chunk=600)
    for chunk in (1, 7, 16, 33):
        seqs.clear()
        with threads(1 + chunk % 2):
            assert torch.equal(seqs.prefill("a", 600, chunk), whole), chunk


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_equal_with_their_prefix_from_the_prefix_cache(dtype: torch.dtype) -> None:
    """B shares A's first 16 blocks (256 positions): B's later rows over A's cached K/V equal B
    prefilled from scratch in blocks of its own."""
    seqs = Sequences(dtype, window=None)
    seqs.add("a", 400, seed=1)
    seqs.add("b", 600, seed=2, prefix_of="a", shared=16)
    seqs.add("b alone", 600, seed=2)
    seqs.qkv["b alone"] = seqs.qkv["b"]  # the same tokens, blocks of its own
    seqs.prefill("a", 400, chunk=64)
    cached = seqs.prefill("b", 600, chunk=600, start=256)
    seqs.clear()
    computed = seqs.prefill("b alone", 600, chunk=600)
    assert torch.equal(cached, computed[256:])


@pytest.mark.parametrize("window", WINDOWS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_row_equals_itself_batched_and_verified(
    dtype: torch.dtype, window: int | None
) -> None:
    seqs = Sequences(dtype, window)
    seqs.add("a", 640, seed=1)
    seqs.add("c", 300, seed=3)
    seqs.add("d", 90, seed=4)
    seqs.prefill("a", 600, chunk=600)
    seqs.prefill("c", 299, chunk=299)
    assert not seqs.prefill("a", 600, chunk=600).isnan().any()
    for p in (255, 256, 300, 511, 512, 599):
        with threads(1):
            alone = seqs.step([("a", p, p + 1)])[0]
        with threads(2):
            batched = seqs.step([("d", 0, 90), ("c", 299, 300), ("a", p, p + 1)])[2]
            verify_last = seqs.step([("a", p - 4, p + 1)])[0][-1:]
            verify_first = seqs.step([("a", p, p + 8)])[0][:1]
            in_a_chunk = seqs.step([("c", 200, 240), ("a", p - 20, p + 20)])[1][20:21]
        for got in (batched, verify_last, verify_first, in_a_chunk):
            assert torch.equal(got, alone), p
