"""The Proposer protocol and the n-gram (prompt lookup) proposer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from specserve.engine.request import Sequence
from specserve.spec.ngram import ngram_propose


@dataclass(frozen=True)
class Draft:
    """Proposed tokens for one sequence in one step."""

    tokens: list[int]  # 0..k tokens; never padded
    # [len(tokens), vocab] draft distributions q the tokens were sampled from; None when the
    # proposer is deterministic (verification then accepts iff draft == the target's own pick).
    probs: torch.Tensor | None = None


@dataclass
class ProposerStats:
    """Cumulative counters for one proposer."""

    drafts: int = 0  # (sequence, step) pairs that proposed at least one token
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: steps accepting > i

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted == 0:
            return
        self.drafts += 1
        self.drafted_tokens += num_drafted
        self.accepted_tokens += num_accepted
        grow = num_drafted - len(self.accepted_per_position)
        self.accepted_per_position += [0] * max(0, grow)
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1


class Proposer(Protocol):
    """Proposes up to k tokens per sequence. Implementations may keep per-sequence state
    (a draft KV cache); the engine calls `sync` after every step that changed a sequence's
    tokens and `release` when a sequence finishes, aborts or is preempted."""

    name: str

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """One Draft per sequence, with len(draft.tokens) <= k. Must not mutate `seqs`."""
        ...

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        """The sequence's committed tokens changed (tokens accepted, rejected ones dropped).
        `hidden` [hidden_size] is the target's final hidden state at the row that produced the
        last committed token, from the same forward pass that verified (Medusa heads read it)."""
        ...

    def release(self, seq: Sequence) -> None:
        """Forget all state for `seq`."""
        ...


class NgramProposer:
    """Context lookup: continue the latest earlier occurrence of the context's suffix."""

    name = "ngram"

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        out = []
        for seq, k in zip(seqs, ks, strict=True):
            tokens = np.asarray(seq.token_ids, dtype=np.int64)
            found = ngram_propose(tokens, k, self.ngram_min, self.ngram_max)
            out.append(Draft(tokens=found.tolist()))
        return out

    def sync(self, seq: Sequence, hidden: torch.Tensor) -> None:
        del seq, hidden

    def release(self, seq: Sequence) -> None:
        del seq
