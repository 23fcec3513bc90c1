"""`SuffixProposer`: drafts from a suffix index over the request's own context and over the
outputs of recent requests, finished and in flight (after SuffixDecoding, Oliaro et al. 2024).

Two token arenas (speculation/suffix_index.py):
- per request, its prompt and output (built when it first drafts, appended as it commits);
- one global arena, bounded to `cache_tokens`, of every request's *output* as it is committed
  (outputs carry what other requests will repeat: the same file edited again, the same
  documents answered about again). Full, it evicts whole requests, oldest first. What the
  sequences committed since it was last read goes in at once (`TokenArena.append_many`) before
  the next lookup, the arena as the appends one by one would build it.

Each step, for each drafting sequence, the context's last `max_depth` tokens are matched in
both arenas (longest suffix with a continuation; the global one skips the sequence's own
chain, which its own arena already holds). Each match yields a greedy, frequency-ranked
continuation of at most min(k, ceil(spec_factor * depth)) tokens, stopping where the best next
token's share falls below `min_share`; each token is scored with `match_confidence` (n-gram's
score: continuation frequency and match length). The candidate with the larger expected
accepted length sum_i prod_{j<=i} conf_j is proposed.

A request with a `cache_salt` neither reads nor feeds the global arena: what it drafts from
other requests would let a client test a guess of another tenant's output by its acceptance.

The proposer is deterministic given what was committed before, so verification keeps greedy and
seeded outputs identical with it on and off, across requests too.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specserve.request import Sequence
from specserve.speculation.ngram import match_confidence
from specserve.speculation.proposer import Draft, IndexStats, Loaded, Proposer, Registration
from specserve.speculation.suffix_index import TokenArena

DEFAULT_CACHE_TOKENS = 1 << 16


class SuffixProposer(Proposer):
    name = "suffix"

    def __init__(
        self,
        cache_tokens: int = DEFAULT_CACHE_TOKENS,
        max_depth: int = 32,
        spec_factor: float = 1.0,
        min_share: float = 0.1,
    ) -> None:
        if max_depth < 1 or spec_factor <= 0 or not 0 <= min_share <= 1:
            raise ValueError(
                f"need max_depth >= 1, spec_factor > 0, 0 <= min_share <= 1, "
                f"got {max_depth}, {spec_factor}, {min_share}"
            )
        self.global_index = TokenArena(cache_tokens)
        self.max_depth, self.spec_factor, self.min_share = max_depth, spec_factor, min_share
        self._own: dict[int, TokenArena] = {}  # seq_id -> its prompt + output
        self._shared: dict[int, int] = {}  # seq_id -> output tokens in the global arena
        self._unshared: dict[int, Sequence] = {}  # committed since the arena was last read
        self.drafts_from = {"own": 0, "shared": 0}  # proposed drafts by the arena they came from

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        for seq, k in zip(seqs, ks, strict=True):
            if k:  # a proposer swapped in mid-request has seen none of its syncs
                self._mark(seq)
        self._flush()
        return [self._draft(seq, k) if k else Draft([]) for seq, k in zip(seqs, ks, strict=True)]

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """Share the new output before the next lookup (`_flush`); the sequence's own arena
        catches up when it next drafts (`_own_index`), holding the same chain as if appended
        here step by step."""
        del hidden
        self._mark(seq)

    def release(self, seq: Sequence) -> None:
        """Finished: its output stays in the global arena. Preempted: its own arena is rebuilt
        when it next drafts; what it shared stays."""
        self._own.pop(seq.seq_id, None)
        if seq.is_finished:  # its last tokens came with no sync
            self._mark(seq)
        self._flush()
        if seq.is_finished:
            self._shared.pop(seq.seq_id, None)

    def reset(self) -> bool:
        """Forget every request's output (the global arena); own contexts are kept."""
        self.global_index = TokenArena(self.global_index.capacity)
        self._shared = {sid: 0 for sid in self._shared}
        return True

    def index_stats(self) -> IndexStats:
        self._flush()
        index = self.global_index
        return IndexStats(
            tokens=index.num_tokens,
            capacity=index.capacity,
            bytes=index.nbytes,
            requests=len(index.owners()),
            drafts_own=self.drafts_from["own"],
            drafts_shared=self.drafts_from["shared"],
        )

    # ---------------------------------------------------------------- internals
    def _mark(self, seq: Sequence) -> None:
        """`seq`'s output not yet in the global arena goes there at the next `_flush`."""
        if seq.params.cache_salt is None:  # isolated: its output stays its own
            self._unshared[seq.seq_id] = seq

    def _flush(self) -> None:
        """Every marked sequence's unshared output into the global arena, in marking order."""
        if not self._unshared:
            return
        runs = []
        for seq in self._unshared.values():
            done = self._shared.get(seq.seq_id, 0)
            runs.append((seq.seq_id, seq.output_ids[done:]))
            self._shared[seq.seq_id] = len(seq.output_ids)
        self._unshared.clear()
        self.global_index.append_many(runs)

    def _own_index(self, seq: Sequence) -> TokenArena:
        own = self._own.get(seq.seq_id)
        if own is None:
            own = self._own[seq.seq_id] = TokenArena(max(64, 2 * seq.num_tokens), growable=True)
        own.append(seq.seq_id, seq.token_slice(own.num_tokens, seq.num_tokens))
        return own

    def _draft(self, seq: Sequence, k: int) -> Draft:
        n = seq.num_tokens
        query = np.asarray(seq.token_slice(max(0, n - self.max_depth), n), dtype=np.int32)
        own = self._candidate(self._own_index(seq), query, k, -1)
        if seq.params.cache_salt is not None:  # isolated: drafts from its own context only
            shared = Draft([])
        else:
            shared = self._candidate(self.global_index, query, k, seq.seq_id)
        source, best = ("own", own) if _expected(own) >= _expected(shared) else ("shared", shared)
        if best.tokens:
            self.drafts_from[source] += 1
        return best

    def _candidate(self, arena: TokenArena, query: np.ndarray, k: int, exclude: int) -> Draft:
        depth, ends = arena.match(query, exclude)
        if depth == 0:
            return Draft([])
        length = min(k, math.ceil(self.spec_factor * depth))
        c = arena.continuation(ends, length, self.min_share)
        return Draft(c.tokens.tolist(), confidence=match_confidence(c.agree, c.support, depth))


def _expected(draft: Draft) -> float:
    """Expected accepted tokens if the scores were probabilities."""
    return float(np.cumprod(draft.scores).sum()) if draft.tokens else 0.0


def _build(loaded: Loaded) -> SuffixProposer:
    return SuffixProposer(loaded.config.spec.suffix_cache_tokens)


REGISTRATION = Registration(
    "suffix",
    _build,
    settings=("suffix_cache_tokens",),
    summary="lookup in the request's own context and in recent requests' outputs",
)
