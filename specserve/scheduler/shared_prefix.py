"""One prefix computed once: which blocks running prompts are computing and have not committed
yet, by chain key (kv_blocks.py), so that the scheduler holds back a waiting prompt whose next
block to compute is one of them (the same tokens after the same prefix, under the same salt).

Two prompts that share a long prefix (a system prompt, a document quoted twice, the turns of a
conversation) otherwise both compute it when their prefills overlap: the prefix cache serves only
blocks already committed. Held, the later one starts from the cache once the earlier has committed
the block. The wait ends at the latest when that prompt's prefill passes the block (running
prompts move every step) or when it leaves the running set; a prompt whose blocks cannot be
cached (`cache_broken`) holds nobody.
"""

from __future__ import annotations

from specserve.request import Sequence
from specserve.scheduler.kv_blocks import BlockAllocator, PrefixMatch


class SharedPrefixes:
    def __init__(self, allocator: BlockAllocator) -> None:
        self.allocator = allocator
        # seq_id -> the chain keys of a running prompt's whole blocks, while some are uncommitted
        self._keys: dict[int, list[int]] = {}
        self._computing: set[int] = set()  # the keys running prompts compute, as of this step

    def refresh(self, running: list[Sequence]) -> None:
        """At a step's start: the keys `running` prompts are computing and have not committed."""
        self._computing = set()
        for seq in running:
            keys = self._keys.get(seq.seq_id)
            if keys is None:
                continue
            if seq.cached_blocks >= len(keys):
                del self._keys[seq.seq_id]  # all committed
            elif not seq.cache_broken:
                self._computing.update(keys[seq.cached_blocks :])

    def started(self, seq: Sequence) -> None:
        """`seq` was admitted (its cached prefix shared): its other whole blocks are computing."""
        if not self.allocator.caching:
            return
        tokens = seq.token_slice(0, seq.num_tokens)
        keys = self.allocator.chain_keys(tokens, seq.params.cache_salt)
        if seq.cached_blocks < len(keys):
            self._keys[seq.seq_id] = keys
            self._computing.update(keys[seq.cached_blocks :])

    def forget(self, seq: Sequence) -> None:
        """`seq` left the running set (finished, aborted or preempted)."""
        self._keys.pop(seq.seq_id, None)

    def holds(self, match: PrefixMatch) -> bool:
        """Whether a prompt whose cached prefix is `match` would next compute a block that a
        running prompt is computing."""
        return match.next_key is not None and match.next_key in self._computing
