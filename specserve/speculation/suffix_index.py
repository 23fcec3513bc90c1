"""A token arena for suffix lookups: many token chains in fixed numpy arrays.

Each owner (a request) appends its tokens to its own chain; chains from many owners interleave
in the arena's slots, linked by `prev` / `next` pointers, so requests in flight can all grow
at once. Slot `nil` (one past the last) is the null pointer: its token is never a real one and
it links to itself, so a walk off a chain's end stops matching without a branch. The lookup over
these arrays is `suffix_lookup.ArenaLookup`. Appending m tokens is O(m); evicting an owner is
O(its tokens).

Memory is bounded by `capacity` slots; when full, whole owners are evicted oldest first
(by their first append). A growable arena (one request's own context) doubles instead.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from specserve.speculation.suffix_lookup import ArenaLookup

FEW_TOKENS = 4  # an append of this many tokens or fewer writes them as scalars
_NONE = -2  # the nil slot's token: never a real token id (free slots hold -1)


@dataclass
class _Chain:
    last: int  # slot of the chain's newest token
    slots: list[np.ndarray] = field(default_factory=list)  # every slot it holds, in runs
    size: int = 0


class TokenArena(ArenaLookup):
    """Token chains in fixed arrays; see the module docstring."""

    def __init__(self, capacity: int, growable: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.growable = growable
        self._alloc(capacity)
        self._chains: OrderedDict[int, _Chain] = OrderedDict()  # oldest first
        self._clock = 0

    def _alloc(self, capacity: int) -> None:
        self.capacity = capacity
        self.nil = capacity
        self.tok = np.full(capacity + 1, -1, dtype=np.int32)  # [capacity + 1]; -1 = free
        # int64 (intp) links: gathers through them need no index conversion
        self.prev = np.full(capacity + 1, capacity, dtype=np.int64)
        self.next = np.full(capacity + 1, capacity, dtype=np.int64)
        self.owner = np.full(capacity + 1, -1, dtype=np.int64)
        self.stamp = np.zeros(capacity + 1, dtype=np.int64)  # append order: larger = newer
        self.tok[capacity] = _NONE
        self._free = np.arange(capacity - 1, -1, -1, dtype=np.int32)  # stack, top at the end
        self._num_free = capacity
        self._high = 0  # slots [0, _high) have ever been used: the lookup scans only those

    # ---------------------------------------------------------------------- sizes
    @property
    def num_tokens(self) -> int:
        return self.capacity - self._num_free

    @property
    def nbytes(self) -> int:
        arrays = (self.tok, self.prev, self.next, self.owner, self.stamp, self._free)
        return sum(a.nbytes for a in arrays)

    def owners(self) -> list[int]:
        """Owners in eviction order (oldest first)."""
        return list(self._chains)

    def chain_size(self, owner: int) -> int:
        chain = self._chains.get(owner)
        return chain.size if chain is not None else 0

    # ------------------------------------------------------------------ ingestion
    def append(self, owner: int, tokens: np.ndarray | list[int]) -> None:
        """Append tokens to `owner`'s chain, evicting the oldest owners (possibly `owner`
        itself) when the arena is full; at most the newest `capacity` tokens are kept."""
        t = np.asarray(tokens, dtype=np.int32)
        if t.size == 0:
            return
        while self.growable and t.size > self._num_free:
            self._grow()
        t = t[-self.capacity :]
        while self._num_free < t.size:
            self.evict(next(iter(self._chains)))
        m = t.size
        slots = self._free[self._num_free - m : self._num_free][::-1].copy()
        self._num_free -= m
        self._high = max(self._high, int(slots.max()) + 1)
        chain = self._chains.get(owner)
        if chain is None:
            chain = self._chains[owner] = _Chain(last=self.nil)
        if m <= FEW_TOKENS:  # a step's token or few: scalar writes (numpy's calls cost more)
            self._link_few(chain, owner, t.tolist(), slots)
            return
        self.tok[slots] = t
        self.owner[slots] = owner
        self.stamp[slots] = self._clock + np.arange(m)
        self._clock += m
        self.prev[slots[0]] = chain.last
        self.prev[slots[1:]] = slots[:-1]
        self.next[slots[:-1]] = slots[1:]
        self.next[slots[-1]] = self.nil
        if chain.last != self.nil:
            self.next[chain.last] = slots[0]
        chain.last = int(slots[-1])
        chain.slots.append(slots)
        chain.size += m

    def _link_few(self, chain: _Chain, owner: int, tokens: list[int], slots: np.ndarray) -> None:
        """`append`'s writes for a few tokens into `slots`, one scalar at a time."""
        last, nil = chain.last, self.nil
        for token, slot in zip(tokens, slots.tolist(), strict=True):
            self.tok[slot], self.owner[slot] = token, owner
            self.stamp[slot] = self._clock
            self._clock += 1
            self.prev[slot], self.next[slot] = last, nil
            if last != nil:
                self.next[last] = slot
            last = slot
        chain.last = last
        chain.slots.append(slots)
        chain.size += len(tokens)

    def append_many(self, runs: list[tuple[int, list[int]]]) -> None:
        """`append` of each (owner, tokens) in turn, distinct owners, with each array written
        once for all of them (one step's new tokens of every sequence): the same slots, links
        and stamps as the appends one by one, which it falls back to where one would evict or
        grow."""
        runs = [(owner, tokens) for owner, tokens in runs if len(tokens)]
        sizes = [len(tokens) for _, tokens in runs]
        m = sum(sizes)
        owners = [owner for owner, _ in runs]
        if len(runs) < 2 or m > self._num_free or len(set(owners)) < len(owners):
            for owner, tokens in runs:
                self.append(owner, tokens)
            return
        slots = self._free[self._num_free - m : self._num_free][::-1].copy()
        self._num_free -= m
        self._high = max(self._high, int(slots.max()) + 1)
        ends = np.cumsum(sizes)
        starts = ends - sizes
        chains = [self._chains.setdefault(o, _Chain(last=self.nil)) for o in owners]
        lasts = np.array([c.last for c in chains], dtype=np.int64)
        self.tok[slots] = np.concatenate([np.asarray(t, dtype=np.int32) for _, t in runs])
        self.owner[slots] = np.repeat(owners, sizes)
        self.stamp[slots] = self._clock + np.arange(m)
        self._clock += m
        prev = np.empty(m, dtype=np.int64)
        prev[1:] = slots[:-1]
        prev[starts] = lasts
        nxt = np.empty(m, dtype=np.int64)
        nxt[:-1] = slots[1:]
        nxt[ends - 1] = self.nil
        self.prev[slots], self.next[slots] = prev, nxt
        linked = lasts != self.nil
        self.next[lasts[linked]] = slots[starts[linked]]
        for chain, a, b in zip(chains, starts.tolist(), ends.tolist(), strict=True):
            chain.last = int(slots[b - 1])
            chain.slots.append(slots[a:b])
            chain.size += b - a

    def evict(self, owner: int) -> None:
        """Drop `owner`'s chain and free its slots."""
        chain = self._chains.pop(owner, None)
        if chain is None:
            return
        slots = np.concatenate(chain.slots)
        self.tok[slots] = -1
        self.prev[slots] = self.nil
        self.next[slots] = self.nil
        self.owner[slots] = -1
        self._free[self._num_free : self._num_free + slots.size] = slots[::-1]
        self._num_free += slots.size

    def _grow(self) -> None:
        """Double the capacity, keeping every chain (slot ids do not change)."""
        old_tok, old_prev, old_next = self.tok, self.prev, self.next
        old_owner, old_stamp, old_nil = self.owner, self.stamp, self.nil
        used, free = self._high, self._free[: self._num_free].copy()
        self._alloc(2 * old_nil)
        self.tok[:used], self.owner[:used], self.stamp[:used] = (
            old_tok[:used],
            old_owner[:used],
            old_stamp[:used],
        )
        for new, old in ((self.prev, old_prev), (self.next, old_next)):
            new[:used] = np.where(old[:used] == old_nil, self.nil, old[:used])
        for chain in self._chains.values():
            chain.last = self.nil if chain.last == old_nil else chain.last
        # New slots go below the old free ones on the stack: those are popped first.
        fresh = np.arange(self.capacity - 1, old_nil - 1, -1, dtype=np.int32)
        self._num_free = fresh.size + free.size
        self._free[: self._num_free] = np.concatenate([fresh, free])
        self._high = used
