"""Engine counters, the record of what each step ran, and its shape for the cost model."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.engine.request import Sequence
from specserve.runner.cost import StepShape
from specserve.scheduler.scheduler import ScheduledBatch, SeqWork
from specserve.speculation.policy import SpeculationPolicy
from specserve.speculation.proposer import Draft, ProposerStats


def is_decode(w: SeqWork) -> bool:
    """A decode (or verify) sequence: one fed token that samples, drafts possibly after it."""
    return w.samples and w.num_tokens == 1


def step_shape(batch: ScheduledBatch, drafts: dict[int, Draft]) -> StepShape:
    """The step as the cost model sees it (runner/cost.py)."""
    decode = [w.seq for w in batch.work if is_decode(w)]
    rows = [1 + (len(drafts[s.seq_id].tokens) if s.seq_id in drafts else 0) for s in decode]
    return StepShape(
        num_decode=len(decode),
        rows=sum(rows),
        context=sum(s.num_tokens for s in decode),
        attention=sum(r * s.num_tokens for r, s in zip(rows, decode, strict=True)),
        prefill=sum(w.num_tokens for w in batch.work if not is_decode(w)),
    )


@dataclass
class EngineStats:
    steps: int = 0
    spec_steps: int = 0  # steps in which at least one sequence verified drafts
    nonspec_steps: int = 0
    tokens_emitted: int = 0
    proposer: ProposerStats = field(default_factory=ProposerStats)

    def record_draft(
        self,
        seq: Sequence,
        draft: Draft,
        accepted: int,
        policy: SpeculationPolicy | None,
    ) -> None:
        """A verified draft's outcome: the request's counts, the proposer's, the policy's
        calibration."""
        k = len(draft.tokens)
        seq.spec.drafted += k
        seq.spec.accepted += accepted
        seq.spec.steps += 1
        self.proposer.record(k, accepted)
        if policy is not None:
            policy.record(draft, accepted)

    def count_step(
        self,
        batch: ScheduledBatch,
        reserved: dict[int, int],
        proposed: dict[int, Draft],
        drafts: dict[int, Draft],
    ) -> StepRecord:
        self.steps += 1
        if drafts:
            self.spec_steps += 1
        else:
            self.nonspec_steps += 1
        self.proposer.proposed_tokens += sum(len(d.tokens) for d in proposed.values())
        return StepRecord(
            num_running=batch.num_running,
            num_tokens=sum(w.num_tokens for w in batch.work)
            + sum(len(d.tokens) for d in drafts.values()),
            drafts_reserved=reserved,
            drafts_proposed={sid: len(d.tokens) for sid, d in proposed.items()},
            drafts_verified={sid: len(d.tokens) for sid, d in drafts.items()},
        )


@dataclass(frozen=True)
class StepRecord:
    """What one step ran: the load the policy saw and the drafts it allowed."""

    num_running: int
    num_tokens: int  # tokens scored, verified drafts included
    drafts_reserved: dict[int, int]  # seq_id -> draft slots reserved before proposing
    drafts_proposed: dict[int, int]  # seq_id -> drafts the proposer returned (non-empty only)
    drafts_verified: dict[int, int]  # seq_id -> drafts the policy kept and the pass verified
