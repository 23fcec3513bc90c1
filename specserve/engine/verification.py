"""One forward pass's logits -> each sampling sequence's verified tokens.

Every sampling sequence owns a span of logits rows: `[last, d1..dk]`, k+1 rows. The sampler turns
the rows into the target's own picks in one batched call; each sequence then verifies its span
alone (deterministic drafts against the picks, sampled drafts by rejection sampling), so that a
fault in one span (a non-finite row, an exception) is charged to that request only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specserve.runner.sampler import SampleRow, processed_logits, sample
from specserve.scheduler.scheduler import SeqWork
from specserve.speculation.proposer import Draft
from specserve.speculation.verify import VerifyResult, verify_deterministic, verify_sampled

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Span:
    """One sampling sequence's share of the pass's logits rows."""

    work: SeqWork
    draft: Draft | None
    start: int  # first row: the position after the sequence's last fed token
    stop: int  # start + k + 1

    @property
    def rows(self) -> slice:
        return slice(self.start, self.stop)


def sample_rows(
    work: list[SeqWork], drafts: dict[int, Draft]
) -> tuple[list[SampleRow], list[Span]]:
    """The rows to sample, in logits order, and each sampling sequence's span of them."""
    rows: list[SampleRow] = []
    spans: list[Span] = []
    for w in (w for w in work if w.samples):
        seq, d = w.seq, drafts.get(w.seq.seq_id)
        extra = d.tokens if d else []
        # Only a repetition penalty reads the history: skip copying the context otherwise.
        ctx = seq.token_ids if seq.params.repetition_penalty != 1.0 else []
        spans.append(Span(w, d, len(rows), len(rows) + len(extra) + 1))
        for i in range(len(extra) + 1):
            history = ctx + extra[:i] if ctx else []
            rows.append(SampleRow(seq.params, history, len(seq.output_ids) + i))
    return rows, spans


def finite_rows(logits: torch.Tensor) -> list[bool]:  # logits: [rows, vocab]
    """Per row: no NaN or inf (a model fault; sampling it would emit garbage silently)."""
    return torch.isfinite(logits).all(dim=-1).tolist()


def batch_picks(logits: torch.Tensor, rows: list[SampleRow]) -> list[int] | None:
    """Every row's pick in one call; None when that fails (each span then samples its own
    rows, so the failure is charged to the request it belongs to)."""
    try:
        return [s.token for s in sample(logits, rows)]
    except Exception:
        logger.exception("batched sampling failed: sampling each request alone")
        return None


def verify_span(
    span: Span, logits: torch.Tensor, rows: list[SampleRow], picks: list[int] | None
) -> VerifyResult:
    """The tokens `span` emits: logits [rows, vocab] and rows of the whole pass."""
    d, own = span.draft, rows[span.rows]
    if d is not None and d.probs is not None:
        target = torch.stack(
            [processed_logits(logits[span.start + i], r) for i, r in enumerate(own)]
        )  # [k+1, vocab]
        seed = own[0].params.seed or 0
        return verify_sampled(d.tokens, d.probs, target, seed, own[0].out_pos)
    targets = picks[span.rows] if picks is not None else None
    if targets is None:
        targets = [s.token for s in sample(logits[span.rows], own)]
    return verify_deterministic(d.tokens if d else [], targets)
