"""Suffix lookup over a token arena's arrays (`suffix_index.TokenArena` holds them).

Lookup of a query q (a context's last tokens, q[-1] the newest) finds the longest suffix of q
that occurred in a chain *with a continuation*, and its occurrences:

    S_1 = {e : tok[e] == q[-1], next[e] != nil}                   (one O(capacity) compare)
    S_j = {e in S_{j-1} : tok[prev^(j-1)(e)] == q[-j]}            (a gather over survivors)

The deepest non-empty S_j (depth j) is the match. Continuation is greedy by frequency: at each
step the token that most occurrences continue with (ties: the most recent occurrence's), keeping
only those occurrences. Every step over many occurrences is a vectorised compare or gather;
over a few, numpy's per-call cost would dominate, and they are walked in Python scalars.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

MAX_OCCURRENCES = 256  # continuation counts use at most this many (the most recent) occurrences
FEW = 4  # from this many surviving occurrences down, walk each one's links in Python scalars
FEW_CONTINUING = 16  # a continuation from this many occurrences down counts in Python too


@dataclass(frozen=True)
class Continuation:
    """A greedy continuation and the evidence for each of its tokens."""

    tokens: np.ndarray  # [k] int64
    support: np.ndarray  # [k] occurrences that reached token i (had an i-th continuation)
    agree: np.ndarray  # [k] of those, how many continued with tokens[i]


class ArenaLookup:
    """Match and continuation over the arrays a `TokenArena` keeps; see the module docstring."""

    tok: np.ndarray  # [capacity + 1] int32 token of each slot
    prev: np.ndarray  # [capacity + 1] int64 links
    next: np.ndarray
    owner: np.ndarray  # [capacity + 1] int64
    stamp: np.ndarray  # [capacity + 1] int64 append order
    nil: int  # the null slot
    _high: int  # slots [0, _high) have ever been used

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
