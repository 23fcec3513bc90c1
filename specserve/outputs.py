"""What a step emits for a request: `RequestOutput` (a stream delta) and its tokens'
log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass, replace

from specserve.request import FinishReason, Sequence

_FAILED = (FinishReason.ERROR, FinishReason.ABORT)


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability at its position, and the most likely tokens there."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob), most likely first


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request (a stream delta)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    spec_steps: int = 0  # steps in which this request verified drafts
    # Seconds from arrival to first being scheduled; set once the request has been scheduled.
    queue_seconds: float | None = None
    error: str | None = None
    # With SamplingParams.logprobs: one per new token. With prompt_logprobs: on the first
    # output, one per prompt token (None for the first, which nothing predicts).
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None

    @classmethod
    def of(
        cls,
        seq: Sequence,
        new_ids: list[int],
        text: str,
        finished: bool,
        error: str | None,
        logprobs: list[TokenLogprob] | None = None,
        prompt_logprobs: list[TokenLogprob | None] | None = None,
    ) -> RequestOutput:
        """The delta `seq` emits now: `new_ids` / `text`, with its running counts."""
        queued = seq.first_scheduled_time
        return cls(
            request_id=seq.request_id,
            new_token_ids=new_ids,
            new_text=text,
            finished=finished,
            finish_reason=seq.finish_reason,
            num_prompt_tokens=len(seq.prompt_ids),
            num_output_tokens=len(seq.output_ids),
            drafted_tokens=seq.spec.drafted,
            accepted_tokens=seq.spec.accepted,
            spec_steps=seq.spec.steps,
            queue_seconds=None if queued is None else queued - seq.arrival_time,
            error=error,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    @property
    def failed(self) -> bool:
        """The final output of a request whose reply is not complete: an error or an abort."""
        return self.finished and self.finish_reason in _FAILED

    def then(self, later: RequestOutput) -> RequestOutput:
        """This delta and the `later` one of the same request as one: tokens, text and
        log-probabilities concatenated, running counts and the finish from `later`."""
        return replace(
            later,
            new_token_ids=self.new_token_ids + later.new_token_ids,
            new_text=self.new_text + later.new_text,
            queue_seconds=later.queue_seconds if self.queue_seconds is None else self.queue_seconds,
            logprobs=(
                None
                if self.logprobs is None and later.logprobs is None
                else (self.logprobs or []) + (later.logprobs or [])
            ),
            prompt_logprobs=self.prompt_logprobs or later.prompt_logprobs,
        )
