"""What `EagleProposer` (eagle_proposer.py) keeps while it drafts: per sequence across calls
(`HeadState`: the head's keys of verified positions and the pairs pending since, trimmed to
the window) and per
sequence within one `propose` call (`Chain`: the tokens drafted so far and when to stop).
Records apart from the proposer that fills them.

Greedy requests without penalties or logits processors draft the head's argmax. Others draft
what the engine's sampler would pick from the head's logits (-inf outside the draft
vocabulary) after the request's processors, penalties, temperature, top-k/p: for a sampled
request that is the Gumbel-max sample under the very noise the target's own sample will use
(a pure function of seed and output position). The draft is accepted iff the target samples the
same token, which is likely where the head's q is close to the target's p, and every output
stays the one the request gets without speculation (no rejection sampler, whose accepted tokens
are distributed right but are not the same tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specserve.request import History, Sequence
from specserve.runner.sampler import SampleRow, sample_row
from specserve.speculation.eagle_gate import HEAD_RECHECK, HEAD_RECHECK_MAX
from specserve.speculation.eagle_native import Lane
from specserve.speculation.proposer import Draft

# Draft another token only while the head gives the chain so far at least this probability of
# being accepted whole: below it, the next token's expected gain (its probability times this)
# is worth less than drafting and verifying it (bench_eagle: ~0.1-0.2 of a target step each).
CONTINUE_ABOVE = 0.35


@dataclass
class HeadState:
    num_tokens: int = 0  # seq.num_tokens when last synced
    features: list[torch.Tensor] = field(default_factory=list)  # pending pairs' [n, H] features
    tokens: list[int] = field(default_factory=list)  # pending pairs' tokens
    next_pos: int = 0  # output position of the next pending pair
    keys: torch.Tensor | None = None  # [kv_heads, L, D] of verified positions
    values: torch.Tensor | None = None
    positions: torch.Tensor | None = None  # [L]
    last: torch.Tensor | None = None  # the head's output at the newest verified position
    drafted: list[int] = field(default_factory=list)  # the last draft, until its outcome is seen
    lane: Lane | None = None  # its slots in the native path's cache (eagle_native.py)
    sat_out: int = 0  # steps not asked since its gate closed (eagle_gate.HEAD_RECHECK)
    recheck: int = HEAD_RECHECK  # steps to sit out before asking again (doubling)

    def recheck_due(self) -> bool:
        """Count a step its closed gate kept the head from drafting; True on the step it has
        sat out `recheck` of them (then the next wait doubles)."""
        self.sat_out += 1
        if self.sat_out < self.recheck:
            return False
        self.sat_out, self.recheck = 0, min(2 * self.recheck, HEAD_RECHECK_MAX)
        return True

    def drop_unseen(self, keep: int) -> None:
        """Drop the pending pairs no future query can see (all but the last `keep`): whole
        feature tensors from the front, then a view of the first one's tail. Without
        concatenating: a sequence the head is not asked for stays past the window every step,
        and joining its pending rows each time cost more than the rest of `sync` (a timing
        probe: ~12 of ~20 us)."""
        excess = len(self.tokens) - keep
        if excess <= 0:
            return
        self.next_pos += excess
        del self.tokens[:excess]
        while excess:
            first = self.features[0]
            if len(first) > excess:
                self.features[0] = first[excess:]
                break
            self.features.pop(0)
            excess -= len(first)


@dataclass
class Chain:
    """One sequence's drafts in a `propose` call."""

    seq: Sequence
    k: int  # the most tokens to draft
    tokens: list[int] = field(default_factory=list)
    confidence: list[float] = field(default_factory=list)
    dead: bool = False  # the request's processors allowed no draft id: nothing more to add
    reach: float = 1.0  # the head's probability of the whole chain so far

    @property
    def plain(self) -> bool:
        """Greedy with nothing that changes the argmax: the head's own top token."""
        p = self.seq.params
        return p.plain_greedy and not self.seq.logits_processors

    def add(self, token: int, confidence: float) -> None:
        self.tokens.append(token)
        self.confidence.append(confidence)
        self.reach *= confidence

    def done(self) -> bool:
        """Drafted k, or the chain is too unlikely to be accepted this far for another token
        to pay for its drafting (EAGLE-2's dynamic depth, on a chain)."""
        return self.dead or len(self.tokens) >= self.k or self.reach < CONTINUE_ABOVE

    def sample(self, logits: torch.Tensor, vocab: torch.Tensor, vocab_size: int, j: int) -> int:
        """The engine sampler's pick from the head's logits (see the module docstring)."""
        seq = self.seq
        full = torch.full((vocab_size,), float("-inf"), device=logits.device)
        full[vocab] = logits
        history = History(seq, list(self.tokens))  # a view: nothing of the context copied
        row = SampleRow(seq.params, history, len(seq.output_ids) + j, seq.logits_processors)
        picked = sample_row(full, row)
        if not math.isfinite(picked.logprob):  # the request allows no draft id: the chain ends
            self.dead = True
            return 0
        self.add(picked.token, math.exp(picked.logprob))
        return picked.token

    def draft(self) -> Draft:
        return Draft(tokens=self.tokens, confidence=self.confidence)
