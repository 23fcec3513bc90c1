"""One forward pass's logits -> each sampling sequence's verified tokens.

Every sampling sequence owns a span of logits rows, `SeqPlan.logits`: `[last, d1..dk]`, k+1 rows.
The sampler turns the rows into the target's own picks in one batched call (the request's logits
processors applied to each of its rows, draft rows included); each sequence then verifies its span
alone (deterministic drafts against the picks, sampled drafts by rejection sampling), so that a
fault in one span (a non-finite row, an exception) is charged to that request only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from specserve.engine.live import describe
from specserve.engine.plan import SeqPlan, StepPlan
from specserve.request import History
from specserve.runner.sampler import SampleRow, pick_tokens, processed_logits
from specserve.speculation.verify import VerifyResult, verify_deterministic, verify_sampled

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VerifyFailure:
    """A span that could not be verified: its request fails with `error`."""

    error: str


def verified(
    p: SeqPlan,
    logits: torch.Tensor,
    rows: list[SampleRow],
    picks: list[int] | None,
    finite: list[bool],
) -> VerifyResult | VerifyFailure:
    """`p`'s verified span, or why its request fails: a non-finite row, or verify raising."""
    if not all(finite[p.logits]):
        return VerifyFailure("the model produced non-finite logits (NaN or inf)")
    try:
        return verify_span(p, logits, rows, picks)
    except Exception as exc:
        logger.exception("verify failed for %s", p.seq.request_id)
        return VerifyFailure(f"verify failed: {describe(exc)}")


def sample_rows(plan: StepPlan) -> list[SampleRow]:
    """The rows to sample, in logits order: a sampling sequence's `SeqPlan.logits` rows."""
    rows: list[SampleRow] = []
    for p in plan.sampling:
        seq, extra = p.seq, p.draft_tokens
        processors = seq.logits_processors
        # Only the penalties and the processors read the history: a view of the sequence and
        # the drafts before the row, nothing copied.
        reads = seq.params.reads_history or bool(processors)
        for i in range(len(extra) + 1):
            history = History(seq, extra[:i]) if reads else []
            rows.append(SampleRow(seq.params, history, len(seq.output_ids) + i, processors))
    return rows


def finite_rows(logits: torch.Tensor) -> list[bool]:  # logits: [rows, vocab]
    """Per row: no NaN or inf (a model fault; sampling it would emit garbage silently). On the
    CPU through numpy, in this thread: on one 49k-token row torch's isfinite + all took 60-100 us
    here idle and 0.4-1.3 ms with the other core busy (its parallel region waits for a thread
    that is not running), numpy's 11-20 us either way."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        return np.isfinite(logits.numpy()).all(axis=-1).tolist()
    return torch.isfinite(logits).all(dim=-1).tolist()


def batch_picks(logits: torch.Tensor, rows: list[SampleRow]) -> list[int] | None:
    """Every row's pick in one call; None when that fails (each span then samples its own
    rows, so the failure is charged to the request it belongs to)."""
    try:
        return pick_tokens(logits, rows)
    except Exception:
        logger.exception("batched sampling failed: sampling each request alone")
        return None


def verify_span(
    p: SeqPlan, logits: torch.Tensor, rows: list[SampleRow], picks: list[int] | None
) -> VerifyResult:
    """The tokens `p` emits: logits [rows, vocab] and rows of the whole pass."""
    d, own = p.draft, rows[p.logits]
    if d is not None and d.probs is not None:
        target = torch.stack(
            [processed_logits(logits[p.logits.start + i], r) for i, r in enumerate(own)]
        )  # [k+1, vocab]
        seed = own[0].params.seed or 0
        return verify_sampled(d.tokens, d.probs, target, seed, own[0].out_pos)
    targets = picks[p.logits] if picks is not None else None
    if targets is None:
        targets = pick_tokens(logits[p.logits], own)
    return verify_deterministic(p.draft_tokens, targets)
