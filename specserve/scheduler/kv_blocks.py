"""Paged KV block accounting: reference-counted blocks, block tables, and the prefix cache.

Invariant: a table of `n` blocks covers token positions [0, n * block_size). A block is free
(on the free list), evictable (reference count 0 but holding cached content), or referenced by
one or more tables (its count says how many).

Prefix cache (when `caching`): a block full of committed tokens can be registered under a key
chained from its parent's, key_i = hash((key_{i-1}, tokens of block i)). A later sequence whose
tokens start the same way takes those blocks instead of recomputing them. A lookup trusts no
hash: each hit must also match the block's own tokens and its parent's identity (block id and
generation, bumped whenever a block is evicted), so a collision can only cost a miss, never
hand one prompt's KV to another. Registered blocks nobody references stay cached until the pool
needs them, evicted least-recently-released first. A registered block is never written again:
sequences only write at positions past their cached prefix.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

ROOT = 0  # the parent key of a sequence's first block (no salt)


def blocks_for(num_tokens: int, block_size: int) -> int:
    return -(-num_tokens // block_size)


def block_hash(parent: int, tokens: tuple[int, ...]) -> int:
    return hash((parent, tokens))


# What a block's content check compares besides its tokens: its parent block (and that block's
# generation), or for a first block its salt.
_Identity = tuple[int, int] | tuple[str, str] | None


def _root(salt: str | None) -> tuple[int, _Identity]:
    """The parent key and parent identity of a first block: its salt's, so that blocks of
    different salts never match, by key or by the content check."""
    return (ROOT, None) if salt is None else (hash(("salt", salt)), ("salt", salt))


@dataclass(frozen=True)
class PrefixMatch:
    blocks: list[int]  # cached blocks holding the prefix, in order
    num_evictable: int  # of those, unreferenced ones: taking them uses up free capacity
    # the chain key of the first whole block after the prefix, where the sequence would
    # compute one (None: none left to compute, or no cache)
    next_key: int | None = None

    def num_tokens(self, block_size: int) -> int:
        return len(self.blocks) * block_size


@dataclass
class CacheStats:
    queried_tokens: int = 0  # tokens of admitted sequences looked up in the cache
    hit_tokens: int = 0  # of those, found cached
    evicted_blocks: int = 0


NO_MATCH = PrefixMatch([], 0)


class BlockAllocator:
    def __init__(self, num_blocks: int, block_size: int, caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks, block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks, self.block_size, self.caching = num_blocks, block_size, caching
        # LIFO free list: recently freed (cache-warm) blocks are reused first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest release first
        self._key: list[int | None] = [None] * num_blocks
        self._gen = [0] * num_blocks
        # block -> (parent identity (block, generation) or None, its tokens), for lookups
        self._content: dict[int, tuple[_Identity, tuple[int, ...]]] = {}
        self._by_key: dict[int, int] = {}
        self.hash_fn: Callable[[int, tuple[int, ...]], int] = block_hash
        # told each block that leaves the cache (the sliding-window pool's attachments)
        self.on_uncache: Callable[[int], None] | None = None
        self.stats = CacheStats()

    @property
    def num_free(self) -> int:
        """Blocks a table can take now: free ones plus unreferenced cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used(self) -> int:
        """Blocks referenced by some table."""
        return self.num_blocks - self.num_free

    @property
    def num_cached(self) -> int:
        """Blocks holding registered prefix content (referenced or not)."""
        return len(self._by_key)

    def extra_needed(self, table: list[int], num_tokens: int) -> int:
        """Blocks to add so that `table` covers `num_tokens` positions."""
        return max(0, blocks_for(num_tokens, self.block_size) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        return self.extra_needed(table, num_tokens) <= self.num_free

    def grow(self, table: list[int], num_tokens: int) -> None:
        """Append fresh blocks so `table` covers `num_tokens` positions."""
        need = self.extra_needed(table, num_tokens)
        if need > self.num_free:
            raise RuntimeError(f"out of KV blocks: need {need}, {self.num_free} free")
        for _ in range(need):
            block = self._free.pop() if self._free else self._evict()
            self._refs[block] = 1
            table.append(block)

    def truncate(self, table: list[int], num_tokens: int) -> None:
        """Shrink to `num_tokens` positions, releasing the blocks that became empty."""
        keep = blocks_for(num_tokens, self.block_size)
        while len(table) > keep:
            self._release(table.pop())

    def free(self, table: list[int]) -> None:
        """Release every block, last first: a prefix's tail is evicted before its head."""
        self.truncate(table, 0)

    # ------------------------------------------------------------------ prefix cache
    def match(
        self,
        tokens: list[int],
        max_tokens: int,
        salt: str | None = None,
        usable: Callable[[list[int]], int] | None = None,
    ) -> PrefixMatch:
        """The longest cached run of whole blocks at the start of `tokens`, covering at most
        `max_tokens` of them, cached under the same `salt`; `usable` cuts it to the blocks a
        sequence can start from (the sliding layers' window). Pure: takes no reference."""
        if not self.caching:
            return NO_MATCH
        blocks: list[int] = []
        keys: list[int] = []  # of the matched blocks, then of the first one not matched
        key, parent = _root(salt)
        bs = self.block_size
        for i in range(min(max_tokens, len(tokens)) // bs):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            key = self.hash_fn(key, chunk)
            keys.append(key)
            block = self._by_key.get(key)
            if block is None or self._content[block] != (parent, chunk):
                break
            blocks.append(block)
            parent = (block, self._gen[block])
        if usable is not None:
            del blocks[usable(blocks) :]
        next_key = keys[len(blocks)] if len(keys) > len(blocks) else None
        return PrefixMatch(blocks, sum(self._refs[b] == 0 for b in blocks), next_key)

    def chain_keys(self, tokens: list[int], salt: str | None = None) -> list[int]:
        """The chain keys of `tokens`' whole blocks, as `register` would file them."""
        key, _ = _root(salt)
        bs, keys = self.block_size, []
        for i in range(len(tokens) // bs):
            key = self.hash_fn(key, tuple(tokens[i * bs : (i + 1) * bs]))
            keys.append(key)
        return keys

    def share(self, table: list[int], match: PrefixMatch) -> None:
        """Start an empty `table` with the matched blocks (one more reference each)."""
        if table:
            raise ValueError("a prefix is shared into an empty block table only")
        for block in match.blocks:
            if self._refs[block] == 0:
                del self._evictable[block]
            self._refs[block] += 1
            table.append(block)

    def register(
        self, table: list[int], index: int, tokens: tuple[int, ...], salt: str | None = None
    ) -> bool:
        """Offer full block `table[index]`, holding `tokens`, to the cache under `salt`. False
        when it cannot be cached: its parent is not cached, or the same content is cached in
        another block (then its successors are not cached either)."""
        block = table[index]
        if self._key[block] is not None:
            return True  # already cached (a shared prefix block)
        parent = None if index == 0 else table[index - 1]
        root_key, root_identity = _root(salt)
        parent_key = root_key if parent is None else self._key[parent]
        if parent_key is None:
            return False
        key = self.hash_fn(parent_key, tokens)
        identity = root_identity if parent is None else (parent, self._gen[parent])
        holder = self._by_key.get(key)
        if holder is not None:
            if self._content[holder] == (identity, tokens):
                return False  # the same content, cached by another sequence
            self._uncache(holder)  # an orphan of an evicted parent, or a hash collision
        self._by_key[key] = block
        self._key[block] = key
        self._content[block] = (identity, tokens)
        return True

    def reset_cache(self) -> int:
        """Forget every cached prefix (blocks in use stay with their sequences, unshared); the
        number of blocks that held one."""
        held = list(self._by_key.values())
        for block in held:
            self._uncache(block)
        return len(held)

    def _release(self, block: int) -> None:
        if self._refs[block] <= 0:
            raise RuntimeError(f"KV block {block} released more often than it was taken")
        self._refs[block] -= 1
        if self._refs[block] > 0:
            return
        if self._key[block] is not None:
            self._evictable[block] = None
        else:
            self._free.append(block)

    def _evict(self) -> int:
        block, _ = self._evictable.popitem(last=False)
        self._uncache(block)
        self.stats.evicted_blocks += 1
        return block

    def _uncache(self, block: int) -> None:
        """Forget `block`'s cached content; unreferenced, it becomes a plain free block."""
        key = self._key[block]
        if key is not None:
            del self._by_key[key]
            del self._content[block]
            self._key[block] = None
            if self.on_uncache is not None:
                self.on_uncache(block)
        self._gen[block] += 1  # cached children naming this block as parent no longer match
        if block in self._evictable:
            del self._evictable[block]
            self._free.append(block)
