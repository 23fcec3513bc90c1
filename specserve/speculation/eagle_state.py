"""What `EagleProposer` keeps per sequence and when it asks the head: the gate's constants and
running mean (`head_mean`, the hybrid's too), each sequence's head state across calls
(`HeadState`: the head's keys of verified positions and the pairs pending since) and one call's
chain of drafts (`Chain`: when to stop, sampled drafts as the engine's sampler would pick them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from specserve.request import History, Sequence
from specserve.runner.sampler import SampleRow, sample_row
from specserve.speculation.calibration import PerSequenceMean
from specserve.speculation.eagle_native import Lane
from specserve.speculation.proposer import Draft

# ------------------------------------------------------------------- when the head is asked
# When the head is asked to draft in a sequence: what a drafted token costs, and the running
# mean, per sequence, of what asking it has gained (`EagleProposer` gates itself on it;
# `HybridProposer` keeps its own over the drafts the head served).
#
# The head's cost per drafted token, in target tokens (one sequence's share of a decode step),
# as benchmarks/bench_eagle.py measures it on the Zen 4 with the target's step before each
# drafting step (as in the engine): 0.11 at batch 1 and 0.07 at 16 with the layer in one native
# call a token, 0.054-0.060 at batch 1 and 0.050-0.058 at 16 with a greedy drafting step in one
# call (the 2026-12-04 14:53 and 16:20 sections of `git show 9ebb6f8:docs/benchmarks.md`, raw
# files under docs/bench/ at that commit): rounded up. A sequence is
# drafted for while the head's drafts there have been gaining tokens (and now and then after,
# HEAD_RECHECK): a running mean, per draft, of the tokens verification accepted less drafted x
# this (a draft the policy does not verify, as under load, gains nothing).
HEAD_TOKEN_COST = 0.08
HEAD_PRIOR = 1.0  # tokens gained per head draft assumed before any outcome
HEAD_RATE = 0.2  # weight of each new outcome in a sequence's running mean
# A new sequence starts from a running mean over every sequence's outcomes (each weighing
# this), floored at HEAD_EXPLORE: once the head stops paying on the server's traffic, a new
# sequence tries it about twice (alone), or (in the hybrid) only where the lookup expects less
# than this, instead of about six times from HEAD_PRIOR, each first try catching the head up
# over the whole prompt.
HEAD_SHARED_RATE = 0.05
HEAD_EXPLORE = 0.1

# A sequence whose mean is not above zero is asked again after this many steps it sat out
# (doubling while asking again does not pay, up to HEAD_RECHECK_MAX): the text may have turned
# predictable. Sitting out costs nothing but keeping the last CATCH_UP_MAX pairs (`sync`, views
# of each step's rows, no copies); asking again runs them in the drafting call itself.
HEAD_RECHECK = 32
HEAD_RECHECK_MAX = 256

# Asked again after sitting out, the head catches up on at most this many of the pairs pending
# (the latest; its context starts over there, as after a gap). The whole window's would cost
# about as much as the target's step for each sequence (the shipped head: ~50 us a pair, up to
# 127 pairs): at 16 at once an exploring step then took 24-78 ms beside ~30 ms steps (an ad hoc
# probe, 2026-12-06), for drafts the payoff mostly did not verify. 16 bounds it to 16 pairs a
# sequence; the first draft after sitting out sees 16 positions of context instead of up to 127
# (not measured apart: outputs never depend on it, and benchmarks.md's EAGLE cells include it).
CATCH_UP_MAX = 16


def head_mean() -> PerSequenceMean:
    """Per sequence, what asking the head gained (see HEAD_PRIOR .. HEAD_EXPLORE)."""
    return PerSequenceMean(HEAD_PRIOR, HEAD_RATE, HEAD_EXPLORE, HEAD_SHARED_RATE)


# ---------------------------------------------------------------------------- what it keeps
# Draft another token only while the head gives the chain so far at least this probability of
# being accepted whole: below it, the next token's expected gain (its probability times this)
# is worth less than drafting and verifying it (bench_eagle: ~0.1-0.2 of a target step each).
CONTINUE_ABOVE = 0.35


@dataclass
class HeadState:
    """One sequence's, across `propose` calls: the head's keys of verified positions and the
    pairs pending since, trimmed to the window."""

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
    sat_out: int = 0  # steps not asked since its gate closed (HEAD_RECHECK)
    recheck: int = HEAD_RECHECK  # steps to sit out before asking again (doubling)

    def recheck_due(self) -> bool:
        """Count a step its closed gate kept the head from drafting; True on the step it has
        sat out `recheck` of them (then the next wait doubles)."""
        self.sat_out += 1
        if self.sat_out < self.recheck:
            return False
        self.sat_out, self.recheck = 0, min(2 * self.recheck, HEAD_RECHECK_MAX)
        return True

    def start_over(self, keep: int) -> None:
        """Keep only the last `keep` pending pairs and forget the head's keys before them: the
        history starts over at the first pair kept (its lane, if any, is reused)."""
        self.drop_unseen(keep)
        self.keys = self.values = self.positions = None

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
            rows = first.shape[0]
            if rows > excess:
                self.features[0] = first[excess:]
                break
            self.features.pop(0)
            excess -= rows


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
