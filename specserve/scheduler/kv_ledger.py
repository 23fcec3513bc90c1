"""The scheduler's block side: what a running sequence holds in the KV pools and may still take,
kept to the rules in scheduler.py (1: a prompt's blocks at admission, one free block per running
sequence left; 3 and 4: a protected sequence's reservation, which nobody else counts as free).

`KVLedger` tracks the reservations in one number (`reserved`, recounted at each step's start and
moved by every grow, start and preemption), says whether a sequence fits and whether a waiting
one may start (sharing which cached prefix), grows, shares, truncates and frees its blocks in the
full-layer pool and, for a model with sliding-window layers, in their `WindowBlocks` pool, and
offers blocks full of committed tokens to the prefix cache.
"""

from __future__ import annotations

from specserve.request import Sequence
from specserve.scheduler.kv_blocks import NO_MATCH, BlockAllocator, PrefixMatch, blocks_for
from specserve.scheduler.window_blocks import WindowBlocks


class KVLedger:
    def __init__(
        self,
        allocator: BlockAllocator,
        max_model_len: int | None = None,
        window: WindowBlocks | None = None,
    ) -> None:
        self.allocator = allocator
        self.max_model_len = max_model_len  # caps a sequence's worst case (rule 3)
        # the sliding-window layers' pool (None: every layer's K/V in the allocator's blocks)
        self.window = window
        if window is not None:
            allocator.on_uncache = window.detach
        self.reserved = 0  # blocks protected running sequences may still grow into

    def worst_case_blocks(self, seq: Sequence) -> int:
        """Blocks `seq` holds at its longest: prompt + max_new_tokens, within the context."""
        total = len(seq.prompt_ids) + seq.params.max_new_tokens
        if self.max_model_len is not None:
            total = min(total, self.max_model_len)
        return blocks_for(total, self.allocator.block_size)

    def still_reserved(self, seq: Sequence) -> int:
        """Blocks a protected sequence may still take from its reservation (0 otherwise)."""
        if not seq.num_preemptions:
            return 0
        return max(0, self.worst_case_blocks(seq) - len(seq.block_table))

    def recount(self, running: list[Sequence]) -> None:
        self.reserved = sum(self.still_reserved(s) for s in running)

    def available(self, running: list[Sequence]) -> int:
        """Free blocks not reserved for protected running sequences."""
        return self.allocator.num_free - sum(self.still_reserved(s) for s in running)

    def fits(self, seq: Sequence, num_tokens: int) -> bool:
        """Can `seq` cover `num_tokens` positions? Its own reservation first, then free blocks
        nobody has reserved."""
        need = self.allocator.extra_needed(seq.block_table, num_tokens)
        own = min(need, self.still_reserved(seq))
        return need - own <= self.allocator.num_free - self.reserved

    def grow(self, seq: Sequence, num_tokens: int) -> None:
        """`seq`'s full-layer blocks for `num_tokens` positions (from its reservation first)."""
        before = self.still_reserved(seq)
        self.allocator.grow(seq.block_table, num_tokens)
        self.reserved -= before - self.still_reserved(seq)

    def grow_window(self, seq: Sequence, num_tokens: int) -> None:
        """The sliding layers' blocks for rows from `seq.num_computed` up to `num_tokens`,
        less those no row from there on sees."""
        if self.window is not None:
            self.window.drop_behind(seq.window_table, seq.num_computed)
            self.window.grow(seq.window_table, num_tokens)

    def truncate(self, seq: Sequence, num_tokens: int) -> None:
        """Shrink `seq`'s tables to `num_tokens` positions (drafts verification rejected)."""
        self.allocator.truncate(seq.block_table, num_tokens)
        if self.window is not None:
            self.window.truncate(seq.window_table, num_tokens)

    def free(self, seq: Sequence) -> None:
        self.allocator.free(seq.block_table)
        if self.window is not None:
            self.window.free(seq.window_table)

    def release(self, seq: Sequence) -> None:
        """Free a preempted sequence's blocks and its reservation; it recomputes from scratch."""
        self.reserved -= self.still_reserved(seq)
        self.free(seq)
        seq.num_computed = seq.cached_blocks = 0
        seq.cache_broken = False

    def admissible(self, seq: Sequence, num_running: int) -> PrefixMatch | None:
        """Rules 1 and 3, counting a cached prefix's blocks once: they need no new block, but
        unreferenced ones stop being free. The prefix to share, or None if `seq` must wait.
        With nothing running, whatever fits the pool is admitted."""
        match = self.prefix(seq)
        free = self.allocator.num_free - self.reserved - match.num_evictable
        whole = blocks_for(seq.num_tokens, self.allocator.block_size) - len(match.blocks)
        if not num_running:
            fits = whole <= free
        elif seq.num_preemptions:
            fits = self.worst_case_blocks(seq) - len(match.blocks) <= free
        else:
            fits = whole + num_running + 1 <= free
        return match if fits else None

    def prefix(self, seq: Sequence) -> PrefixMatch:
        """Cached blocks `seq` may start from: whole blocks, at least one token left to feed
        (its logits sample the next token)."""
        if seq.params.prompt_logprobs:  # its prompt's logits are wanted: compute every position
            return NO_MATCH
        tokens = seq.token_slice(0, seq.num_tokens)
        usable = self.window.usable if self.window is not None else None
        return self.allocator.match(tokens, seq.num_tokens - 1, seq.params.cache_salt, usable)

    def start(self, seq: Sequence, match: PrefixMatch) -> None:
        """`seq`'s blocks at admission: the shared prefix `match`, then the whole prompt's
        (rule 1), its reservation counted if it is protected."""
        if self.allocator.caching:
            stats = self.allocator.stats
            stats.queried_tokens += seq.num_tokens
            stats.hit_tokens += match.num_tokens(self.allocator.block_size)
        self.allocator.share(seq.block_table, match)
        if self.window is not None:
            self.window.share(seq.window_table, match.blocks)
        seq.cached_blocks = len(match.blocks)
        seq.num_computed = match.num_tokens(self.allocator.block_size)
        self.allocator.grow(seq.block_table, seq.num_tokens)
        self.reserved += self.still_reserved(seq)

    def cache_committed(self, seq: Sequence) -> None:
        """Offer `seq`'s blocks that are now full of committed tokens to the prefix cache."""
        if not self.allocator.caching or seq.cache_broken:
            return
        bs = self.allocator.block_size
        while seq.cached_blocks < seq.num_computed // bs:
            i = seq.cached_blocks
            tokens = tuple(seq.token_slice(i * bs, (i + 1) * bs))
            if not self.allocator.register(seq.block_table, i, tokens, seq.params.cache_salt):
                seq.cache_broken = True  # its later blocks cannot chain to this one
                return
            if self.window is not None:
                self.window.attach(seq.block_table[i], seq.window_table[i])
            seq.cached_blocks += 1
