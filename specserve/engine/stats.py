"""Engine counters and the record of what each step ran."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.engine.plan import StepPlan, is_decode
from specserve.request import Sequence
from specserve.speculation.proposer import Draft, ProposerStats


@dataclass
class EngineStats:
    steps: int = 0
    spec_steps: int = 0  # steps in which at least one sequence verified drafts
    nonspec_steps: int = 0
    tokens_emitted: int = 0
    proposer: ProposerStats = field(default_factory=ProposerStats)
    forced: ProposerStats = field(default_factory=ProposerStats)  # drafts of grammar-forced text

    def record_draft(self, seq: Sequence, draft: Draft, accepted: int) -> None:
        """A verified draft's outcome: the request's counts and the proposer's (the policy
        records its own, for its calibration)."""
        k = len(draft.tokens)
        seq.spec.drafted += k
        seq.spec.accepted += accepted
        seq.spec.steps += 1
        (self.forced if draft.forced else self.proposer).record(k, accepted)

    def count_step(self, plan: StepPlan) -> StepRecord:
        scheduled = plan.scheduled
        verified = {p.seq.seq_id: len(p.draft.tokens) for p in plan.seqs if p.draft is not None}
        self.steps += 1
        if verified:
            self.spec_steps += 1
        else:
            self.nonspec_steps += 1
        proposed = {p.seq.seq_id: p.proposed for p in scheduled if p.proposed is not None}
        self.proposer.proposed_tokens += sum(
            len(d.tokens) for d in proposed.values() if not d.forced
        )
        self.forced.proposed_tokens += sum(len(d.tokens) for d in proposed.values() if d.forced)
        return StepRecord(
            num_running=plan.num_running,
            num_tokens=plan.num_tokens,
            drafts_reserved={p.seq.seq_id: p.reserved for p in scheduled if p.reserved},
            drafts_proposed={sid: len(d.tokens) for sid, d in proposed.items()},
            drafts_verified=verified,
            prefill_tokens=sum(p.work.num_tokens for p in plan.seqs if not is_decode(p.work)),
        )


@dataclass(frozen=True)
class StepRecord:
    """What one step ran: the load the policy saw and the drafts it allowed."""

    num_running: int
    num_tokens: int  # tokens scored, verified drafts included
    drafts_reserved: dict[int, int]  # seq_id -> draft slots reserved before proposing
    drafts_proposed: dict[int, int]  # seq_id -> drafts the proposer returned (non-empty only)
    drafts_verified: dict[int, int]  # seq_id -> drafts the policy kept and the pass verified
    prefill_tokens: int = 0  # prompt tokens computed beside the decode rows
