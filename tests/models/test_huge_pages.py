"""The GGUF block weights in one huge-page arena: where they live, and that nothing else changes."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from specserve.models.block_linear import BlockEmbedding, BlockLinear
from specserve.models.huge_pages import ALIGN, HUGE_PAGE, arena, small_pages, thp_mode, zeros
from specserve.models.llama import DecoderLM
from specserve.models.registry import build_model
from specserve.runner.model_runner import ModelRunner, RunItem
from specserve.scheduler.kv_blocks import BlockAllocator
from tests.models.test_block_linear import blockify
from tests.tiny import make_model_dir

pytestmark = pytest.mark.usefixtures("block_kernels")  # skip, or fail where expected
CPU = torch.device("cpu")


def block_tensors(model: DecoderLM) -> dict[str, torch.Tensor]:
    return {
        name: module._buffers["blocks"]
        for name, module in model.named_modules()
        if isinstance(module._buffers.get("blocks"), torch.Tensor)
    }


def logits(model: DecoderLM, prompt: list[int]) -> torch.Tensor:
    """Prefill `prompt`, then one 3-row verify step after it: the logits of both passes."""
    runner = ModelRunner(model, 8, 16, CPU, kv_dtype="float16")
    table: list[int] = []
    BlockAllocator(8, 16).grow(table, len(prompt) + 3)
    first = runner.run([RunItem(prompt, 0, table, 1)]).logits
    then = runner.run([RunItem([5, 6, 7], len(prompt), table, 3)]).logits
    return torch.cat([first, then])


@pytest.mark.parametrize("tied", [False, True])
def test_blocks_sit_back_to_back_in_one_arena_and_the_logits_stay_bit_identical(
    tmp_path: Path, tied: bool
) -> None:
    model_dir = blockify(make_model_dir(tmp_path, "llama", tied=tied))
    packed = build_model(model_dir, CPU)
    with small_pages():
        loose = build_model(model_dir, CPU)
    got, ref = block_tensors(packed), block_tensors(loose)
    assert got.keys() == ref.keys() and len(got) >= 4 * len(packed.layers) + 1
    assert all(torch.equal(got[name], ref[name]) for name in got)
    if tied:  # still one copy for the lm_head and the embedding lookups
        assert isinstance(packed.lm_head, BlockLinear)
        assert isinstance(packed.embed_tokens, BlockEmbedding)
        assert packed.lm_head.blocks.data_ptr() == packed.embed_tokens.blocks.data_ptr()
    distinct = {t.data_ptr(): t.numel() * t.element_size() for t in got.values()}
    spans = sorted((start, start + size) for start, size in distinct.items())
    assert spans[0][0] % HUGE_PAGE == 0
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start % ALIGN == 0 and 0 <= start - end < ALIGN  # one allocation, in order

    prompt = list(range(3, 40))
    assert torch.equal(logits(packed, prompt), logits(loose, prompt))


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds `address` (Linux /proc)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(
    thp_mode() in (None, "never"),
    reason="the kernel has no transparent huge pages, or they are off",
)
def test_the_arena_is_advised_to_take_huge_pages() -> None:
    memory, advised = arena(3 * HUGE_PAGE)
    assert advised and memory.data_ptr() % HUGE_PAGE == 0
    assert "hg" in vm_flags(memory.data_ptr())  # MADV_HUGEPAGE took
    memory.fill_(1)  # writable, and every byte ours
    assert int(memory.sum()) == 3 * HUGE_PAGE


def test_the_kv_cache_is_zeroed_in_an_arena_of_its_own(tmp_path: Path) -> None:
    model = build_model(blockify(make_model_dir(tmp_path, "llama")), CPU)
    runner = ModelRunner(model, 8, 16, CPU, kv_dtype="float16")
    assert runner.kv.data_ptr() % HUGE_PAGE == 0 and runner.kv.dtype == torch.float16
    assert not runner.kv.any()  # masked slots must hold finite values
    with small_pages():  # torch's own zeros, the layout before
        plain = ModelRunner(model, 8, 16, CPU, kv_dtype="float16")
    assert plain.kv.shape == runner.kv.shape and not plain.kv.any()
    kv = zeros((4, 1000), torch.float32)
    assert kv.shape == (4, 1000) and kv.data_ptr() % HUGE_PAGE == 0 and not kv.any()
