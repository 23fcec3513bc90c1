"""Engine counters and the record of what one step ran."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.scheduler.scheduler import ScheduledBatch
from specserve.spec.proposer import Draft, ProposerStats


@dataclass
class EngineStats:
    steps: int = 0
    spec_steps: int = 0  # steps in which at least one sequence verified drafts
    nonspec_steps: int = 0
    tokens_emitted: int = 0
    proposer: ProposerStats = field(default_factory=ProposerStats)

    def count_step(self, batch: ScheduledBatch, drafts: dict[int, Draft]) -> StepRecord:
        self.steps += 1
        if drafts:
            self.spec_steps += 1
        else:
            self.nonspec_steps += 1
        return StepRecord(
            num_running=batch.num_running,
            num_tokens=sum(w.num_tokens for w in batch.work)
            + sum(len(d.tokens) for d in drafts.values()),
            drafts_reserved={w.seq.seq_id: w.max_drafts for w in batch.work if w.max_drafts},
            drafts_proposed={sid: len(d.tokens) for sid, d in drafts.items()},
        )


@dataclass(frozen=True)
class StepRecord:
    """What one step ran: the load the policy saw and the drafts it allowed."""

    num_running: int
    num_tokens: int  # tokens scored, drafts included
    drafts_reserved: dict[int, int]  # seq_id -> draft slots the policy granted
    drafts_proposed: dict[int, int]  # seq_id -> drafts actually proposed
