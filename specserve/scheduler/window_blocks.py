"""KV blocks of the sliding-window layers (Gemma 3's five in six): a sequence holds only the
blocks its next rows can see.

A model whose layers are of two kinds keeps two pools. The full layers' blocks are the
`BlockAllocator`'s: the scheduler admits, preempts and caches prefixes by them, as for any
model. The sliding layers' blocks are a `WindowBlocks` pool. A sequence's window table has the
length of its block table, but a block whose every position lies behind the window of the next
row fed (row `p` sees keys `p - window + 1 .. p`) is given back, its entry becoming `NULL`:
block 0, never handed out and never read (attention starts at the window's first key; the
padded reference path reads it and masks it, and it stays zero).

The pool is sized so that it cannot run out (`window_pool_blocks`): every running sequence's
window plus the largest step's rows. So the scheduler never preempts for it, and its rules hold
as they are, counted in full-layer blocks.

Prefix cache: a full block the prefix cache holds may carry the sliding layers' block of the
same positions (`attach`, when the full block is registered). A prefix hit of n blocks is
usable up to the longest n' <= n whose window (the blocks the row at position n' * block_size
sees) is attached (`usable`); the rest is recomputed. Attached blocks nobody references stay
until the pool needs them, evicted least recently released first, and are dropped when their
full block leaves the cache (`detach`).
"""

from __future__ import annotations

from collections import OrderedDict

from specserve.scheduler.kv_blocks import blocks_for

NULL = 0  # the entry of a block behind the window: never allocated, never read


def window_pool_blocks(window: int, block_size: int, max_running: int, max_step_tokens: int) -> int:
    """Blocks that can never run out, the NULL block included. Between steps a sequence holds
    the blocks of positions `num_computed - window + 1 ..` (at most ceil((window - 1) / bs) + 1);
    during a step also its rows' (n rows span at most n / bs + 1 more), and a step's rows
    number at most `max_step_tokens` over all sequences."""
    per_seq = blocks_for(window - 1, block_size) + 2
    return 1 + max_running * per_seq + blocks_for(max_step_tokens, block_size)


class WindowBlocks:
    def __init__(self, num_blocks: int, block_size: int, window: int) -> None:
        if num_blocks < 2 or block_size < 1 or window < 1:
            raise ValueError(
                f"need num_blocks >= 2, block_size, window >= 1, got "
                f"{num_blocks}, {block_size}, {window}"
            )
        self.num_blocks, self.block_size, self.window = num_blocks, block_size, window
        self._free: list[int] = list(range(num_blocks - 1, NULL, -1))  # LIFO, NULL left out
        self._refs = [0] * num_blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()  # attached, oldest release first
        self._attached: dict[int, int] = {}  # full block -> the window block of its positions
        self._owner: dict[int, int] = {}  # window block -> the full block it is attached to
        self.peak_used = 0  # the most blocks tables held at once

    @property
    def num_free(self) -> int:
        """Blocks a table can take now: free ones plus unreferenced attached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks referenced by some table."""
        return self.num_blocks - 1 - self.num_free

    @property
    def num_attached(self) -> int:
        return len(self._attached)

    def first_seen(self, position: int) -> int:
        """The first block the row at `position` sees."""
        return max(0, position - self.window + 1) // self.block_size

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Append fresh blocks so `table` covers `num_tokens` positions."""
        need = blocks_for(num_tokens, self.block_size) - len(table)
        if need > self.num_free:
            raise RuntimeError(
                f"out of sliding-window KV blocks: need {need}, {self.num_free} free "
                "(the pool is sized not to run out: this is a bug)"
            )
        for _ in range(need):
            block = self._free.pop() if self._free else self._evict()
            self._refs[block] = 1
            table.append(block)
        self.peak_used = max(self.peak_used, self.num_used)

    def scratch(self, start: int, num_tokens: int) -> list[int]:
        """A table of fresh blocks for rows from `start` up to `num_tokens` and the window
        before them (the start-up cost probe's scratch sequences)."""
        table = [NULL] * self.first_seen(start)
        self.grow(table, num_tokens)
        return table

    def drop_behind(self, table: list[int], position: int) -> None:
        """Give back the blocks the row at `position` (and any later row) cannot see. Entries
        before them are NULL already, so this walks only what it drops."""
        i = min(self.first_seen(position), len(table)) - 1
        while i >= 0 and table[i] != NULL:
            self._release(table[i])
            table[i] = NULL
            i -= 1

    def truncate(self, table: list[int], num_tokens: int) -> None:
        """Shrink to `num_tokens` positions, releasing the blocks that became empty."""
        keep = blocks_for(num_tokens, self.block_size)
        while len(table) > keep:
            block = table.pop()
            if block != NULL:
                self._release(block)

    def free(self, table: list[int]) -> None:
        self.truncate(table, 0)

    # ------------------------------------------------------------------ prefix cache
    def attach(self, full_block: int, block: int) -> None:
        """`block` holds the sliding layers' K/V of the positions of cached `full_block`."""
        if block == NULL or full_block in self._attached or block in self._owner:
            return
        self._attached[full_block] = block
        self._owner[block] = full_block

    def detach(self, full_block: int) -> None:
        """`full_block` left the prefix cache: its window block no longer names cached
        positions (unreferenced, it is free again)."""
        block = self._attached.pop(full_block, None)
        if block is None:
            return
        del self._owner[block]
        if block in self._evictable:
            del self._evictable[block]
            self._free.append(block)

    def usable(self, full_blocks: list[int]) -> int:
        """Of a prefix hit (cached full blocks, in order), how many blocks a sequence can
        start from: the most whose window is attached."""
        n = len(full_blocks)
        attached = self._attached
        while n > 0:
            missing = next(
                (
                    i
                    for i in range(n - 1, self.first_seen(n * self.block_size) - 1, -1)
                    if full_blocks[i] not in attached
                ),
                None,
            )
            if missing is None:
                return n
            n = missing  # a hit ending at or before the missing block
        return 0

    def share(self, table: list[int], full_blocks: list[int]) -> None:
        """Start an empty `table` from a usable prefix hit: NULL behind the window of its next
        row, the attached blocks within it (one more reference each)."""
        if table:
            raise ValueError("a prefix is shared into an empty window table only")
        first = self.first_seen(len(full_blocks) * self.block_size)
        table.extend([NULL] * first)
        for full in full_blocks[first:]:
            block = self._attached[full]
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            table.append(block)

    def reset_cache(self) -> None:
        for full in list(self._attached):
            self.detach(full)

    def _release(self, block: int) -> None:
        if self._refs[block] <= 0:
            raise RuntimeError(f"window KV block {block} released more often than it was taken")
        self._refs[block] -= 1
        if self._refs[block] > 0:
            return
        if block in self._owner:
            self._evictable[block] = None
        else:
            self._free.append(block)

    def _evict(self) -> int:
        block, _ = self._evictable.popitem(last=False)
        del self._attached[self._owner.pop(block)]
        return block
