"""Memory budget: what is left for the target's KV cache once everything else is counted.

    kv_bytes = max_memory - weights (target + draft) - peak activation of the largest step
               (speculative shape B x (N+1) included, and the draft's own step)
    kv_tokens = kv_bytes / (target KV bytes per token + draft KV bytes per token)

Bytes per token count the cache's element size: an fp16 cache (`--kv-cache-dtype float16`)
holds twice the tokens of a float32 one in the same bytes.

The draft keeps a KV entry for every token the target does, so both pools are sized to the same
token count. Enabling speculation therefore shrinks the target pool instead of risking OOM.

A model with sliding-window layers beside full ones keeps those layers' K/V in a window pool
sized never to run out (scheduler/window_blocks.py): its bytes come off the top (`split_kv`),
and a token costs only the full layers' bytes in the rest.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from specserve.config_schema import BYTE_UNITS, parse_bytes
from specserve.models.native_stack import python_layers


def split_kv(
    budget: int, block_bytes: int, window_block_bytes: int, window_bound: int, cap: int
) -> tuple[int, int]:
    """(full-layer blocks, window-pool blocks) that `budget` bytes hold. The window pool
    needs at most `window_bound` blocks, and never more than one per full block (plus its NULL
    block): a live window block sits at positions whose full block is live. `cap`: full blocks
    beyond this are never used. Without a window pool (`window_bound` 0), (blocks, 0)."""
    if not window_bound:
        return max(0, min(budget // block_bytes, cap)), 0
    window = min(window_bound, cap + 1)
    blocks = (budget - window * window_block_bytes) // block_bytes
    if blocks + 1 < window:  # too few bytes for the bound: pools of equal blocks
        blocks = (budget - window_block_bytes) // (block_bytes + window_block_bytes)
    blocks = max(0, min(blocks, cap))
    return blocks, min(window_bound, blocks + 1)


@dataclass(frozen=True)
class MemoryBudget:
    max_memory: int
    target_weights: int
    draft_weights: int
    activation_peak: int
    # target, at its cache's element size (the full layers' only, where there is a window pool)
    kv_bytes_per_token: int
    draft_kv_bytes_per_token: int
    block_size: int
    window_block_bytes: int = 0  # one window-pool block over the sliding layers
    window_bound: int = 0  # window-pool blocks that never run out (0: no window pool)

    def _split(self) -> tuple[int, int]:
        per_block = (self.kv_bytes_per_token + self.draft_kv_bytes_per_token) * self.block_size
        budget = max(0, self.free_for_kv)
        return split_kv(budget, per_block, self.window_block_bytes, self.window_bound, 1 << 40)

    @property
    def kv_tokens(self) -> int:
        return self._split()[0] * self.block_size

    @property
    def window_blocks(self) -> int:
        return self._split()[1]

    @property
    def window_kv(self) -> int:
        return self.window_blocks * self.window_block_bytes

    @property
    def free_for_kv(self) -> int:
        return self.max_memory - self.target_weights - self.draft_weights - self.activation_peak

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    @property
    def target_kv(self) -> int:
        return self.kv_tokens * self.kv_bytes_per_token

    @property
    def draft_kv(self) -> int:
        return self.kv_tokens * self.draft_kv_bytes_per_token

    def check(self) -> None:
        if self.num_blocks < 1:
            raise ValueError(
                f"--max-memory {self.max_memory} B leaves no room for the KV cache: weights "
                f"{self.target_weights + self.draft_weights} B + peak activation "
                f"{self.activation_peak} B; raise --max-memory or lower --speculate / "
                "--max-batch-tokens"
            )

    def as_dict(self) -> dict[str, int]:
        return {
            "max_memory": self.max_memory,
            "target_weights": self.target_weights,
            "draft_weights": self.draft_weights,
            "activation_peak": self.activation_peak,
            "target_kv": self.target_kv,
            "draft_kv": self.draft_kv,
            "window_kv": self.window_kv,
            "kv_tokens": self.kv_tokens,
            "headroom": self.free_for_kv - self.target_kv - self.draft_kv - self.window_kv,
        }


def resolve_max_memory(value: str, device: torch.device) -> int:
    """Bytes ('8000000000', '8GiB', '512MiB') or a fraction of free memory ('0.8')."""
    text = value.strip().lower()
    if not text.endswith(tuple(BYTE_UNITS)):
        number = float(text)
        if 0 < number <= 1:
            return int(number * free_memory(device))
        if number <= 0:
            raise ValueError(f"--max-memory must be bytes or a fraction in (0, 1], got {value!r}")
    return parse_bytes(value)


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


class _LiveTensorBytes(TorchDispatchMode):
    """Counts bytes of tensor storages created inside the mode that are still alive."""

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # data_ptr -> [nbytes, tensors referencing it]
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self._track(t)
        return out

    def _track(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr == 0:
            return
        entry = self.live.get(ptr)
        if entry is None:
            entry = self.live[ptr] = [storage.nbytes(), 0]
            self.current += entry[0]
            self.peak = max(self.peak, self.current)
        entry[1] += 1
        weakref.finalize(t, self._drop, ptr)

    def _drop(self, ptr: int) -> None:
        entry = self.live.get(ptr)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[ptr]


def measure_peak(step: Callable[[], Any], device: torch.device) -> int:
    """Peak bytes allocated by `step()` beyond what existed before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return int(torch.cuda.max_memory_allocated(device) - base)
    # The Python layer loop runs here: its per-layer tensors are what the dispatch mode sees, and
    # they hold at least what the native stack allocates outside torch (qkv, attention out,
    # gate/up), so the pool left for KV is not overstated.
    with python_layers(), _LiveTensorBytes() as mode:
        step()
    return mode.peak
