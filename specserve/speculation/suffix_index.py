"""A token arena for suffix lookups: many token chains in fixed numpy arrays.

Each owner (a request) appends its tokens to its own chain; chains from many owners interleave
in the arena's slots, linked by `prev` / `next` pointers, so requests in flight can all grow
at once. Slot `nil` (one past the last) is the null pointer: its token is never a real one and
it links to itself, so a walk off a chain's end stops matching without a branch.

Lookup of a query q (a context's last tokens, q[-1] the newest) finds the longest suffix of q
that occurred in a chain *with a continuation*, and its occurrences:

    S_1 = {e : tok[e] == q[-1], next[e] != nil}                   (one O(capacity) compare)
    S_j = {e in S_{j-1} : tok[prev^(j-1)(e)] == q[-j]}            (a gather over survivors)

The deepest non-empty S_j (depth j) is the match. Continuation is greedy by frequency: at each
step the token that most occurrences continue with (ties: the most recent occurrence's), keeping
only those occurrences. Every step is a vectorised compare or gather; nothing walks tokens in
Python. Appending m tokens is O(m); evicting an owner is O(its tokens).

Memory is bounded by `capacity` slots; when full, whole owners are evicted oldest first
(by their first append). A growable arena (one request's own context) doubles instead.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

import numpy as np

MAX_OCCURRENCES = 256  # continuation counts use at most this many (the most recent) occurrences
FEW = 4  # from this many surviving occurrences down, walk each one's links in Python scalars
FEW_CONTINUING = 16  # a continuation from this many occurrences down counts in Python too
FEW_TOKENS = 4  # an append of this many tokens or fewer writes them as scalars
_NONE = -2  # the nil slot's token: never a real token id (free slots hold -1)


@dataclass
class _Chain:
    last: int  # slot of the chain's newest token
    slots: list[np.ndarray] = field(default_factory=list)  # every slot it holds, in runs
    size: int = 0


@dataclass(frozen=True)
class Continuation:
    """A greedy continuation and the evidence for each of its tokens."""

    tokens: np.ndarray  # [k] int64
    support: np.ndarray  # [k] occurrences that reached token i (had an i-th continuation)
    agree: np.ndarray  # [k] of those, how many continued with tokens[i]


class TokenArena:
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

    # --------------------------------------------------------------------- lookup
    def match(self, query: np.ndarray, exclude_owner: int = -1) -> tuple[int, np.ndarray]:
        """(depth, ends): the longest suffix of `query` found with a continuation, and the
        slots where its occurrences end; (0, empty) when even q[-1] is not found."""
        q = np.asarray(query, dtype=np.int32)
        if q.size == 0:
            return 0, np.empty(0, dtype=np.int64)
        ends = np.flatnonzero(self.tok[: self._high] == q[-1])
        keep = self.next[ends] != self.nil
        if exclude_owner >= 0:
            keep &= self.owner[ends] != exclude_owner
        ends = ends[keep]
        if ends.size == 0:
            return 0, ends
        depth, cur, j = 1, ends, 2
        while j <= q.size and cur.size > FEW:
            back = self.prev[cur]
            hit = self.tok[back] == q[-j]
            if not hit.any():
                return depth, ends
            ends, cur, depth, j = ends[hit], back[hit], j, j + 1
        if j > q.size:
            return depth, ends
        return self._finish_match(q.tolist(), ends, cur, j - 1)

    def _finish_match(
        self, q: list[int], ends: np.ndarray, cur: np.ndarray, depth: int
    ) -> tuple[int, np.ndarray]:
        """The last few occurrences (matched to `depth`), each followed back on its own."""
        tok, prev = self.tok, self.prev
        reach = []
        for slot in cur.tolist():
            d = depth
            while d < len(q):
                slot = int(prev[slot])
                if tok[slot] != q[-1 - d]:
                    break
                d += 1
            reach.append(d)
        best = max(reach)
        return best, ends[np.asarray(reach) == best]

    def continuation(self, ends: np.ndarray, k: int, min_share: float = 0.0) -> Continuation:
        """Up to k tokens, greedy by frequency from the occurrences ending at `ends`; stops
        early when the best token's share of the occurrences falls below `min_share`."""
        if ends.size > MAX_OCCURRENCES:
            ends = ends[np.argpartition(self.stamp[ends], -MAX_OCCURRENCES)[-MAX_OCCURRENCES:]]
        if ends.size == 1:
            return self._follow(int(ends[0]), k)
        if ends.size <= FEW_CONTINUING:
            return self._continue_few(ends.tolist(), k, min_share)
        tokens, support, agree = [], [], []
        cur = ends
        for _ in range(k):
            nxt = self.next[cur]
            nxt = nxt[nxt != self.nil]
            if nxt.size == 0:
                break
            t = self.tok[nxt]
            best = self._most_frequent(nxt, t)
            hit = t == best
            if hit.sum() < min_share * nxt.size:
                break
            tokens.append(best)
            support.append(nxt.size)
            agree.append(int(hit.sum()))
            cur = nxt[hit]
        return Continuation(
            np.asarray(tokens, dtype=np.int64),
            np.asarray(support, dtype=np.int64),
            np.asarray(agree, dtype=np.int64),
        )

    def _continue_few(self, ends: list[int], k: int, min_share: float) -> Continuation:
        """`continuation` over a few occurrences, in Python scalars (numpy's per-call cost is
        most of the time at this size): the same tokens, support and agreement."""
        nxt_of, tok, stamp, nil = self.next, self.tok, self.stamp, self.nil
        tokens, support, agree = [], [], []
        cur = ends
        for _ in range(k):
            nxt = [s for s in (int(nxt_of[c]) for c in cur) if s != nil]
            if not nxt:
                break
            t = [int(tok[s]) for s in nxt]
            counts = Counter(t)
            top = max(counts.values())
            # ties: the token of the newest slot among the most frequent
            newest = max(
                (int(stamp[s]), v) for s, v in zip(nxt, t, strict=True) if counts[v] == top
            )
            best = newest[1]
            if counts[best] < min_share * len(nxt):
                break
            tokens.append(best)
            support.append(len(nxt))
            agree.append(counts[best])
            cur = [s for s, v in zip(nxt, t, strict=True) if v == best]
        return Continuation(
            np.asarray(tokens, dtype=np.int64),
            np.asarray(support, dtype=np.int64),
            np.asarray(agree, dtype=np.int64),
        )

    def _follow(self, slot: int, k: int) -> Continuation:
        """One occurrence: its next k tokens (each supported by that one occurrence)."""
        tokens = []
        for _ in range(k):
            slot = int(self.next[slot])
            if slot == self.nil:
                break
            tokens.append(int(self.tok[slot]))
        ones = np.ones(len(tokens), dtype=np.int64)
        return Continuation(np.asarray(tokens, dtype=np.int64), ones, ones)

    def _most_frequent(self, slots: np.ndarray, t: np.ndarray) -> int:
        """The token most slots hold; ties go to the token of the newest slot among them."""
        if t.size == 1 or (t == t[0]).all():
            return int(t[0])
        _, inverse, counts = np.unique(t, return_inverse=True, return_counts=True)
        top = counts[inverse] == counts.max()
        return int(t[top][np.argmax(self.stamp[slots[top]])])
