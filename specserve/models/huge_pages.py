"""The GGUF block weights and the KV cache on transparent huge pages, where the kernel allows.

A decode step streams every projection's blocks once (~90 MB for the embedded model) and reads
each sequence's cached keys and values in every layer. On 4 KiB pages that is a TLB miss every
64 cache lines, and a step's weights evict every other translation, so the work after the
layers starts cold as well. One mapping advised `MADV_HUGEPAGE` takes 2 MiB pages (Linux THP in
`always` or `madvise` mode) and needs 512x fewer translations. What it gains is measured with
`python -m benchmarks.engine_verify --sides "q8,q8 4K pages"` (docs/benchmarks.md): the two
layouts in one process, steps alternating; the numbers are the same bit for bit, since only
where the bytes live changes. Where the kernel gives no huge pages (THP `never`, another OS)
the weights still sit in one mapping and nothing else changes.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages): a PMD-sized page
ALIGN = 64  # each tensor starts on a cache line, as torch's allocator places them
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_on = True


def thp_mode() -> str | None:
    """Linux's transparent huge page mode (`always`, `madvise` or `never`); None elsewhere."""
    try:
        found = re.search(r"\[(\w+)\]", THP_SETTING.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


@contextmanager
def small_pages() -> Iterator[None]:
    """Models and KV caches built inside stay where torch allocates them (benchmarks: the layout
    before, side by side; not thread-safe)."""
    global _on
    _on = False
    try:
        yield
    finally:
        _on = True


def arena(nbytes: int) -> tuple[torch.Tensor, bool]:
    """A zeroed uint8 tensor of `nbytes` whose first byte is 2 MiB-aligned, backed by a private
    anonymous mapping advised to use huge pages; and whether the advice was taken. Falls back
    to torch's allocator where the OS has no such mapping."""
    private, anonymous = getattr(mmap, "MAP_PRIVATE", None), getattr(mmap, "MAP_ANONYMOUS", None)
    if private is None or anonymous is None:
        return torch.zeros(nbytes, dtype=torch.uint8), False
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=private | anonymous)
    advised = False
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            region.madvise(advice)
            advised = True
        except OSError:  # a kernel built without THP
            pass
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start : start + nbytes], advised


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype) on the CPU, in an arena of its own (inside `small_pages()`:
    torch.zeros itself). Every page is touched here, as torch.zeros touches them, so that no
    step pays for faulting one in."""
    if not _on:
        return torch.zeros(shape, dtype=dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    memory, _ = arena(nbytes)
    memory.zero_()
    return memory.view(dtype).view(shape)


def pack_blocks(modules: Iterable[nn.Module]) -> None:
    """Move the `blocks` buffer of each module that has one into a single arena (a buffer two
    modules share stays shared); the old tensors are freed once nothing else holds them."""
    if not _on:
        return
    owners: dict[int, list[nn.Module]] = {}
    tensors: dict[int, torch.Tensor] = {}
    for module in modules:
        blocks = module._buffers.get("blocks")
        if isinstance(blocks, torch.Tensor) and blocks.device.type == "cpu":
            owners.setdefault(id(blocks), []).append(module)
            tensors[id(blocks)] = blocks
    offsets, total = {}, 0
    for key, t in tensors.items():
        offsets[key] = total
        total += -(-t.numel() * t.element_size() // ALIGN) * ALIGN
    if not total:
        return
    memory, _ = arena(total)
    for key, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        dst = memory[offsets[key] : offsets[key] + nbytes].view(t.dtype).view(t.shape)
        dst.copy_(t)
        for module in owners[key]:
            module._buffers["blocks"] = dst


def trim_heap() -> bool:
    """Give the heap's free pages back to the system (glibc's malloc_trim): loading leaves
    tens of MB free there (block rows copied while they are interleaved and packed) that the
    process would otherwise keep resident. False where there is no glibc."""
    try:
        return bool(ctypes.CDLL(None).malloc_trim(0))
    except (OSError, AttributeError):
        return False
