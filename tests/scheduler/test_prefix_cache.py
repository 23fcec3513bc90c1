"""The prefix cache in the block allocator: reference counts, lookups that verify content,
least-recently-released eviction, and what a hash collision can (not) do."""

from __future__ import annotations

import pytest

from specserve.scheduler.kv_blocks import BlockAllocator

BS = 4


def cached_sequence(alloc: BlockAllocator, tokens: list[int]) -> list[int]:
    """A sequence that computed `tokens` and offered its full blocks to the cache."""
    table: list[int] = []
    alloc.grow(table, len(tokens))
    for i in range(len(tokens) // BS):
        assert alloc.register(table, i, tuple(tokens[i * BS : (i + 1) * BS]))
    return table


def test_a_prompt_reuses_the_full_blocks_it_shares_with_a_cached_one() -> None:
    alloc = BlockAllocator(16, BS, caching=True)
    first = cached_sequence(alloc, list(range(10)))  # blocks 0..3, 4..7 cached; 8, 9 partial
    match = alloc.match([0, 1, 2, 3, 4, 5, 6, 7, 99, 98], max_tokens=9)
    assert match.blocks == first[:2] and match.num_evictable == 0
    assert alloc.match([0, 1, 2, 3, 4, 5, 6, 99], max_tokens=8).blocks == first[:1]
    assert alloc.match(list(range(10)), max_tokens=7).blocks == first[:1]  # one token left
    assert alloc.match([5, 1, 2, 3], max_tokens=4).blocks == []


def test_shared_blocks_live_while_referenced_and_are_evicted_last_released_first() -> None:
    alloc = BlockAllocator(4, BS, caching=True)
    a = cached_sequence(alloc, list(range(8)))  # 2 cached blocks
    blocks = list(a)
    b: list[int] = []
    alloc.share(b, alloc.match([*list(range(8)), 50], max_tokens=8))
    assert b == a and alloc.num_used == 2
    alloc.free(a)
    assert alloc.num_used == 2  # b still holds both
    alloc.free(b)
    assert alloc.num_used == 0 and alloc.num_free == 4 and alloc.num_cached == 2
    again = alloc.match(list(range(8)), max_tokens=8)
    assert again.blocks == blocks and again.num_evictable == 2
    other: list[int] = []
    alloc.grow(other, 12)  # 2 plain free blocks, then one eviction: the tail (last released)
    assert alloc.stats.evicted_blocks == 1 and alloc.num_cached == 1
    assert alloc.match(list(range(8)), max_tokens=8).blocks == blocks[:1]
    first = other[0]
    alloc.free(other)
    with pytest.raises(RuntimeError, match="released more often"):
        alloc.free([first])  # a double free is an error, not a corrupted free list


def test_a_hash_collision_costs_a_miss_never_another_prompts_kv() -> None:
    alloc = BlockAllocator(16, BS, caching=True)
    alloc.hash_fn = lambda parent, tokens: 7  # every block collides with every other
    a = cached_sequence(alloc, [1, 2, 3, 4])
    assert alloc.match([9, 9, 9, 9, 5], max_tokens=4).blocks == []  # same key, other tokens
    assert alloc.match([1, 2, 3, 4, 5], max_tokens=4).blocks == a[:1]
    # Same first block, different second: the second's key collides, its tokens do not.
    b: list[int] = []
    alloc.grow(b, 8)
    assert alloc.register(b, 0, (8, 8, 8, 8))  # replaces a's entry (a collision, other tokens)
    assert alloc.match([1, 2, 3, 4, 5], max_tokens=4).blocks == []
    assert alloc.match([8, 8, 8, 8, 5], max_tokens=4).blocks == b[:1]


def test_children_of_an_evicted_parent_never_match_and_do_not_block_recaching() -> None:
    alloc = BlockAllocator(3, BS, caching=True)
    a = cached_sequence(alloc, list(range(8)))
    parent = a[0]
    alloc.truncate(a, 4)  # the child block becomes evictable ...
    alloc.free(a)  # ... then the parent
    x: list[int] = []
    alloc.grow(x, 8)  # the plain block, then the child (released first) is evicted
    alloc.free(x)
    assert alloc.num_cached == 1 and alloc.match(list(range(8)), max_tokens=8).blocks == [parent]
    y: list[int] = []
    alloc.grow(y, 12)  # evicts the parent too
    alloc.free(y)
    assert alloc.num_cached == 0
    z = cached_sequence(alloc, list(range(8)))  # the same content again, in other blocks
    assert alloc.match(list(range(8)), max_tokens=8).blocks == z[:2]


def test_without_caching_nothing_is_matched_or_registered() -> None:
    alloc = BlockAllocator(8, BS)
    table: list[int] = []
    alloc.grow(table, 8)
    alloc.free(table)
    assert alloc.match(list(range(8)), max_tokens=8).blocks == [] and alloc.num_cached == 0


def test_reset_forgets_every_prefix_and_keeps_blocks_in_use() -> None:
    alloc = BlockAllocator(8, BS, caching=True)
    a = cached_sequence(alloc, list(range(8)))
    b = cached_sequence(alloc, list(range(100, 108)))
    alloc.free(b)
    assert alloc.reset_cache() == 4 and alloc.num_cached == 0
    assert alloc.match(list(range(8)), max_tokens=8).blocks == []
    assert len(a) == 2 and alloc.num_used == 2 and alloc.num_free == 6
    alloc.free(a)
    assert alloc.num_free == 8


def test_blocks_are_reused_only_under_the_same_salt() -> None:
    alloc = BlockAllocator(16, BS, caching=True)
    tokens = list(range(9))
    plain = cached_sequence(alloc, tokens)
    assert alloc.match(tokens, max_tokens=8, salt="tenant-a").blocks == []
    salted: list[int] = []
    alloc.grow(salted, len(tokens))
    for i in range(2):
        assert alloc.register(salted, i, tuple(tokens[i * BS : (i + 1) * BS]), salt="tenant-a")
    assert alloc.match(tokens, max_tokens=8, salt="tenant-a").blocks == salted[:2]
    assert alloc.match(tokens, max_tokens=8, salt="tenant-b").blocks == []
    assert alloc.match(tokens, max_tokens=8).blocks == plain[:2]


def test_a_salt_cannot_be_forged_by_a_colliding_hash() -> None:
    alloc = BlockAllocator(16, BS, caching=True)
    alloc.hash_fn = lambda parent, tokens: 7  # every key collides
    salted: list[int] = []
    alloc.grow(salted, 4)
    assert alloc.register(salted, 0, (1, 2, 3, 4), salt="tenant-a")
    assert alloc.match([1, 2, 3, 4, 5], max_tokens=4).blocks == []  # same key and tokens
    assert alloc.match([1, 2, 3, 4, 5], max_tokens=4, salt="tenant-a").blocks == salted
