"""What an OpenAI reply reports from its choices' final outputs: each choice's `finish_reason`
and the reply's `usage` (with the speculation counts), streamed or not."""

from __future__ import annotations

from specserve.outputs import RequestOutput
from specserve.request import FinishReason
from specserve.server.openai_replies import CompletionTokensDetails, FinishReasonOpenAI, Usage


def openai_finish(out: RequestOutput) -> FinishReasonOpenAI:
    return "length" if out.finish_reason == FinishReason.LENGTH else "stop"


def usage(finals: list[RequestOutput]) -> Usage:
    """One prompt, every choice's completion tokens."""
    prompt = finals[0].num_prompt_tokens
    completion = sum(f.num_output_tokens for f in finals)
    accepted = sum(f.accepted_tokens for f in finals)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        completion_tokens_details=CompletionTokensDetails(
            accepted_prediction_tokens=accepted,
            rejected_prediction_tokens=sum(f.drafted_tokens for f in finals) - accepted,
            speculation_steps=sum(f.spec_steps for f in finals),
        ),
    )
