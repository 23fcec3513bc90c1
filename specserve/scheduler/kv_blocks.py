"""Paged KV block accounting: a free list and per-sequence block tables.

Invariant: a table of `n` blocks covers token positions [0, n * block_size). Every block id is
either on the free list or in exactly one table.
"""

from __future__ import annotations


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks, block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # LIFO free list: recently freed (cache-warm) blocks are reused first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def extra_needed(self, table: list[int], num_tokens: int) -> int:
        """Blocks to add so that `table` covers `num_tokens` positions."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        return self.extra_needed(table, num_tokens) <= len(self._free)

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Append blocks so `table` covers `num_tokens` positions."""
        need = self.extra_needed(table, num_tokens)
        if need > len(self._free):
            raise RuntimeError(f"out of KV blocks: need {need}, {len(self._free)} free")
        for _ in range(need):
            table.append(self._free.pop())

    def truncate(self, table: list[int], num_tokens: int) -> None:
        """Shrink to `num_tokens` positions, freeing blocks that became empty."""
        keep = blocks_for(num_tokens, self.block_size)
        while len(table) > keep:
            self._free.append(table.pop())

    def free(self, table: list[int]) -> None:
        self.truncate(table, 0)
