"""The Proposer protocol and the records proposers hand the engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from specserve.engine.request import Sequence

UNSCORED = 0.5  # the confidence assumed for a token whose proposer gave none


@dataclass(frozen=True)
class Draft:
    """Proposed tokens for one sequence in one step."""

    tokens: list[int]  # 0..k tokens; never padded
    # [len(tokens), vocab] draft distributions q the tokens were sampled from; None when the
    # proposer is deterministic (verification then accepts iff draft == the target's own pick).
    probs: torch.Tensor | None = None
    # [len(tokens)] the proposer's own estimate, in [0, 1], that token i is accepted given tokens
    # before it were (lookup: match length and continuation counts; Medusa: head probability;
    # draft model: q). Calibrated online before the policy trusts it. None: not scored.
    confidence: list[float] | None = None

    def __post_init__(self) -> None:
        if self.confidence is not None and len(self.confidence) != len(self.tokens):
            raise ValueError(
                f"{len(self.confidence)} confidences for {len(self.tokens)} draft tokens"
            )

    @property
    def scores(self) -> list[float]:
        """Per-token confidence, `UNSCORED` where the proposer gave none."""
        if self.confidence is None:
            return [UNSCORED] * len(self.tokens)
        return self.confidence

    def prefix(self, k: int) -> Draft:
        """The first k tokens (with their q rows and confidences)."""
        if k >= len(self.tokens):
            return self
        probs = self.probs[:k] if self.probs is not None else None
        conf = self.confidence[:k] if self.confidence is not None else None
        return Draft(tokens=self.tokens[:k], probs=probs, confidence=conf)


@dataclass
class ProposerStats:
    """Cumulative counters for one proposer."""

    drafts: int = 0  # (sequence, step) pairs that verified at least one drafted token
    drafted_tokens: int = 0  # drafted tokens verified
    accepted_tokens: int = 0
    proposed_tokens: int = 0  # drafted tokens, verified or not (the policy may keep a prefix)
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
