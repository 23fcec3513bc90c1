"""The paged attention kernel over float32 and fp16 caches against a float64 reference."""

from __future__ import annotations

import pytest
import torch

from specserve.kernels import attention as kernel

pytestmark = pytest.mark.usefixtures("attention_kernels")


def reference(
    q: torch.Tensor,  # [T, H, D]
    k_cache: torch.Tensor,  # [Hkv, slots, D], any dtype: read as it is stored
    v_cache: torch.Tensor,
    seqs: list[tuple[int, int, int]],  # (first row, q_len, ctx)
    tables: list[list[int]],
    block_size: int,
    window: int | None,
) -> torch.Tensor:  # [T, H, D] float64
    """softmax(q k^T / sqrt(D)) v per row in float64, over the keys the row may see."""
    num_heads, dim = q.shape[1], q.shape[2]
    group = num_heads // k_cache.shape[0]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for (first, q_len, ctx), table in zip(seqs, tables, strict=True):
        pos = torch.arange(ctx)
        slots = torch.tensor(table)[pos // block_size] * block_size + pos % block_size
        keys = k_cache[:, slots].double().repeat_interleave(group, 0)  # [H, ctx, D]
        values = v_cache[:, slots].double().repeat_interleave(group, 0)
        rows = q[first : first + q_len].double().transpose(0, 1)  # [H, q_len, D]
        scores = rows @ keys.transpose(1, 2) * dim**-0.5  # [H, q_len, ctx]
        q_pos = torch.arange(ctx - q_len, ctx)[:, None]
        visible = pos[None, :] <= q_pos
        if window is not None:
            visible &= pos[None, :] > q_pos - window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[first : first + q_len] = (scores.softmax(-1) @ values).transpose(0, 1)
    return out


def random_step(
    q_lens: list[int], ctx_lens: list[int], heads: tuple[int, int, int], block_size: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[int, int, int]], list[list[int]]]:
    """Queries, a float32 K/V cache [2, Hkv, slots, D] and reversed block tables."""
    num_heads, num_kv, dim = heads
    g = torch.Generator().manual_seed(seed)
    blocks = [-(-c // block_size) for c in ctx_lens]
    free = list(range(sum(blocks)))[::-1]
    tables = [[free.pop() for _ in range(n)][::-1] for n in blocks]
    q = torch.randn(sum(q_lens), num_heads, dim, generator=g)
    cache = torch.randn(2, num_kv, sum(blocks) * block_size, dim, generator=g)
    firsts = [sum(q_lens[:b]) for b in range(len(q_lens))]
    return q, cache, list(zip(firsts, q_lens, ctx_lens, strict=True)), tables


def run_kernel(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    seqs: list[tuple[int, int, int]],
    tables: list[list[int]],
    block_size: int,
    window: int | None,
) -> torch.Tensor:
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    out = torch.full_like(q, float("nan"))
    kernel.paged_attention(
        q, k_cache, v_cache, out, torch.tensor(seqs), padded, block_size, q.shape[-1] ** -0.5,
        window,
    )  # fmt: skip
    return out


STEPS = {
    "decode rows": ([1, 1, 1], [1, 17, 700]),
    "verify rows": ([5, 32], [300, 600]),
    "prefill chunks (query blocks)": ([33, 100], [33, 613]),
    "all at once": ([1, 300, 7], [1000, 300, 40]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize("step", STEPS)
def test_kernel_equals_the_float64_reference(
    step: str, window: int | None, dtype: torch.dtype
) -> None:
    """Each cache is read as it is stored: fp16 K/V widened exactly, then float32 arithmetic."""
    q_lens, ctx_lens = STEPS[step]
    q, cache, seqs, tables = random_step(q_lens, ctx_lens, (6, 2, 64), 16, seed=len(step))
    k_cache, v_cache = cache[0].to(dtype), cache[1].to(dtype)
    got = run_kernel(q, k_cache, v_cache, seqs, tables, 16, window)
    want = reference(q, k_cache, v_cache, seqs, tables, 16, window)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("heads", [(4, 4, 16), (8, 1, 128), (2, 1, 256)])
def test_fp16_cache_reads_every_head_layout(heads: tuple[int, int, int]) -> None:
    q, cache, seqs, tables = random_step([1, 40], [500, 300], heads, 4, seed=3)
    k_cache, v_cache = cache[0].half(), cache[1].half()
    got = run_kernel(q, k_cache, v_cache, seqs, tables, 4, None)
    want = reference(q, k_cache, v_cache, seqs, tables, 4, None)
    torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


def test_fp16_cache_stays_close_to_float32() -> None:
    """Rounding K/V to fp16 (11 significant bits) moves outputs by about 1e-3 of their scale."""
    q, cache, seqs, tables = random_step([1, 4, 200], [2000, 64, 500], (9, 3, 64), 16, seed=4)
    exact = run_kernel(q, cache[0], cache[1], seqs, tables, 16, None)
    half = run_kernel(q, cache[0].half(), cache[1].half(), seqs, tables, 16, None)
    torch.testing.assert_close(half, exact, atol=3e-3, rtol=0)
    assert not torch.equal(half, exact)


def test_kernel_refuses_other_cache_dtypes() -> None:
    q = torch.randn(1, 4, 16)
    cache = torch.zeros(2, 16, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="float32 or float16"):
        kernel.paged_attention(
            q, cache, cache, torch.empty_like(q), torch.tensor([[0, 1, 1]]),
            torch.zeros(1, 1, dtype=torch.int32), 16, 1.0, None,
        )  # fmt: skip
