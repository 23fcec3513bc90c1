"""The sliding-window layers' pool: a table keeps only what its next rows see; the prefix cache's
full blocks carry their window blocks; the pool sized never to run out."""

from __future__ import annotations

import pytest

from specserve.engine.memory import split_kv
from specserve.scheduler.kv_blocks import BlockAllocator
from specserve.scheduler.window_blocks import NULL, WindowBlocks, window_pool_blocks

BS, WINDOW = 4, 8


def test_a_table_drops_what_falls_behind_the_window() -> None:
    pool = WindowBlocks(16, BS, WINDOW)
    table: list[int] = []
    pool.grow(table, 10)  # positions 0..9: blocks 0, 1, 2
    assert len(table) == 3 and NULL not in table and pool.num_used == 3
    pool.drop_behind(table, 10)  # row 10 sees 3..10: block 0 (0..3) still in view
    assert NULL not in table
    pool.drop_behind(table, 12)  # row 12 sees 5..12: block 0 goes
    assert table[0] == NULL and NULL not in table[1:] and pool.num_used == 2
    pool.grow(table, 30)
    pool.drop_behind(table, 29)  # sees 22..29: blocks 5..7 stay
    assert table[:5] == [NULL] * 5 and NULL not in table[5:] and pool.num_used == 3
    pool.truncate(table, 21)  # drafts rejected: back to 21 positions
    assert len(table) == 6 and pool.num_used == 1
    pool.free(table)
    assert pool.num_used == 0 and pool.num_free == 15  # the NULL block is never handed out


def test_prefix_hit_needs_the_window_before_it_attached() -> None:
    full = BlockAllocator(32, BS, caching=True)
    pool = WindowBlocks(32, BS, WINDOW)
    full.on_uncache = pool.detach
    tokens = list(range(100, 124))  # six blocks
    table: list[int] = []
    window: list[int] = []
    full.grow(table, 24)
    pool.grow(window, 24)
    for i in range(6):
        assert full.register(table, i, tuple(tokens[i * BS : (i + 1) * BS]))
        if i != 3:  # block 3's window block was never attached
            pool.attach(table[i], window[i])
    held = list(window)
    pool.drop_behind(window, 24)
    # hit of 5 blocks: row 20 sees 13..20, blocks 3 and 4: block 3 is missing, so the most is
    # 3 blocks (row 12 sees 5..12: blocks 1, 2)
    hit = full.match(tokens, 21, usable=pool.usable)
    assert len(hit.blocks) == 3
    assert len(full.match(tokens, 21).blocks) == 5  # without the window pool: all five
    other: list[int] = []
    pool.share(other, hit.blocks)
    assert other == [NULL, held[1], held[2]]
    pool.free(other)
    pool.free(window)
    full.free(table)
    assert pool.num_used == 0 and pool.num_attached == 5
    # attached blocks nobody holds stay until the pool needs them, then go oldest first
    assert pool.num_free == 31
    # a full block leaving the cache takes its window block's attachment with it
    full.reset_cache()
    assert pool.num_attached == 0 and pool.num_free == 31
    assert full.match(tokens, 21, usable=pool.usable).blocks == []


def test_the_pool_evicts_attached_blocks_when_it_needs_them() -> None:
    pool = WindowBlocks(4, BS, WINDOW)  # three blocks besides NULL
    table: list[int] = []
    pool.grow(table, 12)
    table_blocks = list(table)
    for i, block in enumerate(table):
        pool.attach(100 + i, block)
    pool.free(table)
    assert pool.num_free == 3 and pool.num_attached == 3
    again: list[int] = []
    pool.grow(again, 4)  # none free: the first released (the table's last block) is evicted
    assert pool.num_attached == 2 and again == table_blocks[-1:]
    with pytest.raises(RuntimeError, match="sized not to run out"):
        pool.grow(again, 20)


def test_pool_bound_and_split() -> None:
    # 16 running sequences, window 8, 4-token blocks, 64-token steps: NULL + 16 x 4 + 16
    assert window_pool_blocks(WINDOW, BS, 16, 64) == 81
    # bytes for 100 full blocks of 10 B and a window pool of 81 blocks of 50 B
    assert split_kv(100 * 10 + 81 * 50, 10, 50, 81, cap=1000) == (100, 81)
    # the pool never needs more than a block per full block (and NULL)
    assert split_kv(10_000, 10, 50, 81, cap=20) == (20, 21)
    # too few bytes for the bound: pools of equal blocks
    blocks, window = split_kv(600, 10, 50, 81, cap=1000)
    assert window == blocks + 1 and blocks * 10 + window * 50 <= 600
    assert split_kv(1000, 10, 0, 0, cap=1000) == (100, 0)  # no window pool
