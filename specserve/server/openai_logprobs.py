"""Log-probabilities in OpenAI's two response forms (chat's per-token entries, completions'
parallel lists), from the engine's `TokenLogprob`s."""

from __future__ import annotations

from typing import Any

from specserve.outputs import TokenLogprob
from specserve.server.openai_replies import (
    ChatLogprobs,
    CompletionLogprobs,
    TokenLogprobEntry,
    TopLogprob,
)


def token_text(tokenizer: Any, token: int) -> str:
    text: str = tokenizer.decode([token])
    return text


def _top(tokenizer: Any, token: int, logprob: float) -> TopLogprob:
    text = token_text(tokenizer, token)
    return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))


def chat_logprobs(tokenizer: Any, entries: list[TokenLogprob]) -> ChatLogprobs:
    content = []
    for e in entries:
        text = token_text(tokenizer, e.token)
        content.append(
            TokenLogprobEntry(
                token=text,
                logprob=e.logprob,
                bytes=list(text.encode("utf-8")),
                top_logprobs=[_top(tokenizer, t, lp) for t, lp in e.top],
            )
        )
    return ChatLogprobs(content=content)


def completion_logprobs(
    tokenizer: Any, entries: list[TokenLogprob], top: int, offset: int = 0
) -> CompletionLogprobs:
    """`offset`: characters of this choice's text before these tokens (stream chunks)."""
    tokens = [token_text(tokenizer, e.token) for e in entries]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    tops = None
    if top:
        tops = [{token_text(tokenizer, t): lp for t, lp in e.top} for e in entries]
    return CompletionLogprobs(
        tokens=tokens,
        token_logprobs=[e.logprob for e in entries],
        top_logprobs=tops,
        text_offset=offsets,
    )
