"""One step's plan: per sequence, what was scheduled, the draft it verifies and its rows of the
pass's outputs. Built once, after the policy has kept its prefixes; the run items, the prompt
log-probabilities, verification, emitted log-probabilities, the cost model's shape and the step's
record all read it.

Row order is the runner's: sequences in plan order. A sampling sequence owns k+1 rows of
`RunOutput.logits` / `.hidden`, `[last fed, d1..dk]` (row i predicts the token after draft i); a
sequence that does not sample owns none. A prompt_logprobs sequence owns rows of
`RunOutput.hidden_only`: the prompt positions its chunk computes, each predicting the prompt
token after it (the chunk's last position samples instead, if the chunk ends the prompt).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specserve.request import Sequence
from specserve.runner.cost import StepShape
from specserve.runner.model_runner import RunItem
from specserve.scheduler.batch import SeqWork
from specserve.speculation.proposer import Draft


def is_decode(w: SeqWork) -> bool:
    """A decode (or verify) sequence: one fed token that samples, drafts possibly after it."""
    return w.samples and w.num_tokens == 1


@dataclass(frozen=True)
class SeqPlan:
    """One sequence's part of a step."""

    work: SeqWork  # as the pass runs it: draft slots trimmed to the kept draft
    reserved: int  # draft slots the scheduler reserved before proposing
    proposed: Draft | None  # the proposer's draft (non-empty), before the policy
    draft: Draft | None  # the prefix of it the policy kept (non-empty): this pass verifies it
    logits: slice  # its rows of RunOutput.logits and .hidden (empty: it does not sample)
    prompt: slice  # its rows of RunOutput.hidden_only (empty: no prompt log-probabilities)
    runs: bool = True  # False: failed before the pass (by the proposer); no rows

    @property
    def seq(self) -> Sequence:
        return self.work.seq

    @property
    def draft_tokens(self) -> list[int]:
        return self.draft.tokens if self.draft is not None else []

    def run_item(self) -> RunItem:
        seq = self.seq
        fed = seq.token_slice(seq.num_computed, seq.num_computed + self.work.num_tokens)
        rows = self.logits.stop - self.logits.start
        return RunItem(
            fed + self.draft_tokens,
            seq.num_computed,
            seq.block_table,
            rows,
            self.prompt.stop - self.prompt.start,
            seq.window_table,
        )


@dataclass(frozen=True)
class StepPlan:
    num_running: int  # running sequences after scheduling (the load the policy saw)
    scheduled: list[SeqPlan]  # every scheduled sequence, in the scheduler's order

    @property
    def seqs(self) -> list[SeqPlan]:
        """The sequences the pass runs, in row order."""
        return [p for p in self.scheduled if p.runs]

    @property
    def sampling(self) -> list[SeqPlan]:
        return [p for p in self.seqs if p.work.samples]

    @property
    def num_tokens(self) -> int:
        """Tokens the pass scores, verified drafts included."""
        return sum(p.work.num_tokens + len(p.draft_tokens) for p in self.seqs)

    def run_items(self) -> list[RunItem]:
        return [p.run_item() for p in self.seqs]

    def shape(self) -> StepShape:
        """The step as the cost model sees it (runner/cost.py)."""
        decode = [p for p in self.seqs if is_decode(p.work)]
        return StepShape.of(
            [(1 + len(p.draft_tokens), p.seq.num_tokens) for p in decode],
            prefill=sum(p.work.num_tokens for p in self.seqs if not is_decode(p.work)),
        )


# A scheduled sequence -> its prompt rows this step (`Live.prompt_rows`).
PromptRows = Callable[[SeqWork], int]


def plan_step(
    num_running: int,
    scheduled: list[SeqWork],  # as scheduled: max_drafts = the slots reserved
    trimmed: list[SeqWork],  # the same, draft slots trimmed to the kept drafts
    proposed: list[Draft | None],  # per scheduled sequence
    kept: list[Draft | None],  # per scheduled sequence
    prompt_rows: PromptRows,
) -> StepPlan:
    """Lay the sequences still running out in rows (see the module docstring)."""
    seqs: list[SeqPlan] = []
    logit_row = prompt_row = 0
    for s, w, p, d in zip(scheduled, trimmed, proposed, kept, strict=True):
        if w.seq.is_finished:  # the proposer failed it
            seqs.append(SeqPlan(w, s.max_drafts, p, d, slice(0, 0), slice(0, 0), runs=False))
            continue
        n_logits = 1 + (len(d.tokens) if d is not None else 0) if w.samples else 0
        n_prompt = prompt_rows(w)
        logits = slice(logit_row, logit_row + n_logits)
        prompt = slice(prompt_row, prompt_row + n_prompt)
        seqs.append(SeqPlan(w, s.max_drafts, p, d, logits, prompt))
        logit_row, prompt_row = logits.stop, prompt.stop
    return StepPlan(num_running, seqs)
