"""What a scheduler step hands the engine: each sequence's share of the step (`SeqWork`) and
the step as a whole (`ScheduledBatch`); and the engine's callback for draft slots (`DraftCaps`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specserve.request import Sequence


@dataclass(frozen=True)
class SeqWork:
    """One sequence's share of a step."""

    seq: Sequence
    num_tokens: int  # uncomputed tokens fed this step (a prefill chunk, or 1 when decoding)
    samples: bool  # the chunk reaches the end of the sequence: the step samples its next token
    max_drafts: int = 0  # KV slots reserved for drafts after the fed tokens


@dataclass(frozen=True)
class ScheduledBatch:
    work: list[SeqWork]
    preempted: list[Sequence]
    num_running: int  # running sequences after scheduling (the load the policy sees)

    @property
    def num_tokens(self) -> int:
        return sum(w.num_tokens + w.max_drafts for w in self.work)

    @property
    def is_empty(self) -> bool:
        return not self.work


# (decode sequences of a step, running sequences, tokens scheduled so far) -> drafts each may
# propose, in the same order.
DraftCaps = Callable[[list[Sequence], int, int], list[int]]
