"""The engine's state of one live request beside its `Sequence`: detokenizer, text not yet sent,
the prompt's log-probabilities until they are sent, and how it turns into outputs."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specserve.engine import drafting
from specserve.engine.detokenizer import IncrementalDetokenizer
from specserve.engine.logprobs import LogitsOf, prompt_logprobs
from specserve.engine.plan import StepPlan
from specserve.outputs import RequestOutput, TokenLogprob
from specserve.request import FinishReason, SeqStatus, Sequence
from specserve.runner.model_runner import RunOutput
from specserve.scheduler.batch import SeqWork
from specserve.scheduler.scheduler import Scheduler
from specserve.speculation.proposer import Proposer

logger = logging.getLogger(__name__)


class Pushed(NamedTuple):
    """What `Live.push_until_stop` took of a step's verified tokens."""

    tokens: list[int]  # appended to the sequence: up to and including a stop
    finish: FinishReason | None  # why the sequence ends there; None: it goes on


@dataclass
class Live:
    seq: Sequence
    detok: IncrementalDetokenizer
    pending_text: str = ""
    # With prompt_logprobs: the prompt tokens' log-probabilities so far (the first has none),
    # delivered with the first output.
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_logprobs_sent: bool = False

    def push_until_stop(
        self, tokens: list[int], eos_ids: frozenset[int], max_model_len: int
    ) -> Pushed:
        """Append verified tokens one at a time through the stop checks. Tokens after a stop
        are dropped."""
        taken: list[int] = []
        for token in tokens:
            self.seq.output_ids.append(token)
            self.pending_text += self.detok.push(token)
            taken.append(token)
            reason = self.stop_reason(token, eos_ids, max_model_len)
            if reason is not None:
                return Pushed(taken, reason)
        return Pushed(taken, None)

    def stop_reason(
        self, token: int, eos_ids: frozenset[int], max_model_len: int
    ) -> FinishReason | None:
        """Why the sequence ends at `token` (just pushed), or None."""
        seq = self.seq
        if token in eos_ids and not seq.params.ignore_eos:
            return FinishReason.EOS
        if self.detok.stopped:
            return FinishReason.STOP
        if seq.tokens_left <= 0 or seq.num_tokens >= max_model_len:
            return FinishReason.LENGTH
        return None

    def output(
        self,
        new_ids: list[int],
        finished: bool,
        error: str | None = None,
        logprobs: list[TokenLogprob] | None = None,
    ) -> RequestOutput:
        """The delta to send now; the prompt's log-probabilities go with the first tokens."""
        text, self.pending_text = self.pending_text, ""
        prompt_lps = None
        if self.prompt_logprobs is not None and new_ids and not self.prompt_logprobs_sent:
            prompt_lps, self.prompt_logprobs_sent = self.prompt_logprobs, True
        return RequestOutput.of(self.seq, new_ids, text, finished, error, logprobs, prompt_lps)

    def flush(self, reason: FinishReason, error: str | None) -> tuple[FinishReason, str | None]:
        """The detokenizer's held-back text into `pending_text` as the request ends: the
        finish reason and error to report (a failed flush turns all but an abort into one)."""
        try:
            self.pending_text += self.detok.flush()
        except Exception as exc:
            logger.exception("detokenizing the end of %s failed", self.seq.request_id)
            if reason is not FinishReason.ABORT:
                return FinishReason.ERROR, error or f"detokenization failed: {describe(exc)}"
        return reason, error

    def prompt_rows(self, w: SeqWork) -> int:
        """Logits rows of prompt positions this chunk computes for prompt_logprobs: each one
        predicts the prompt token after it (the chunk's last row samples, if the chunk ends
        the prompt)."""
        if not self.seq.params.prompt_logprobs or self.prompt_logprobs_sent:
            return 0
        return w.num_tokens - (1 if w.samples else 0)

    def add_prompt_logprobs(self, hidden: torch.Tensor, logits_of: LogitsOf) -> None:
        """Log-probabilities of the prompt tokens that rows computed from num_computed on
        predict (hidden: [n, hidden], n = prompt_rows); positions already recorded (a recompute
        after preemption) are kept."""
        seq = self.seq
        lps = self.prompt_logprobs = self.prompt_logprobs or [None]
        first = seq.num_computed + 1  # the prompt position the first row predicts
        n = hidden.shape[0]
        new = prompt_logprobs(hidden, seq.token_slice(first, first + n), logits_of)
        lps += new[len(lps) - first :] if len(lps) > first else new


def take_prompt_rows(
    plan: StepPlan, run: RunOutput, live: dict[str, Live], logits_of: LogitsOf
) -> None:
    """Hand each prompt_logprobs sequence its prompt rows' hidden states (`SeqPlan.prompt` of
    `run.hidden_only`)."""
    for p in plan.seqs:
        if p.prompt.stop > p.prompt.start:
            assert run.hidden_only is not None
            live[p.seq.request_id].add_prompt_logprobs(run.hidden_only[p.prompt], logits_of)


def end(
    live: Live,
    reason: FinishReason,
    scheduler: Scheduler,
    proposer: Proposer | None,
    new_ids: list[int] | None = None,
    error: str | None = None,
    logprobs: list[TokenLogprob] | None = None,
) -> RequestOutput:
    """Finish `live`'s sequence: out of the scheduler, its proposer state released, its final
    output returned. Never raises: it is how failures end requests."""
    seq = live.seq
    reason, error = live.flush(reason, error)
    if reason is not FinishReason.ERROR:  # its committed blocks can serve a later prompt
        try:
            scheduler.cache_committed(seq)
        except Exception:
            logger.exception("caching the blocks of %s failed", seq.request_id)
    seq.status = SeqStatus.FINISHED
    seq.finish_reason = reason
    scheduler.remove(seq)
    scheduler.unpark(seq)
    drafting.release(proposer, seq)
    return live.output(new_ids or [], True, error, logprobs)


def describe(exc: BaseException) -> str:
    """`RuntimeError: message`, as an error output reports a failure."""
    return f"{type(exc).__name__}: {exc}"
