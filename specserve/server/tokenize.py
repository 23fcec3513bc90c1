"""POST /tokenize and /detokenize, in both families' shapes.

`/tokenize` with TGI's body (`inputs`) answers TGI's list of tokens with character offsets; with
vLLM's (`prompt`, or chat `messages` rendered by the model's template) it answers vLLM's
`{count, max_model_len, tokens}`. Either way the ids are what a generation request with the
same input would be fed. `/detokenize` (vLLM's) turns ids back into text. Both are admitted as
generation requests are (429 when the server is saturated) and run in a worker thread with the
backend's prompt tokenizer, never under the lock of the engine's.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field, model_validator

from specserve.server.admission import prepared
from specserve.server.caps import check_prompt_chars
from specserve.server.chat_template import chat_messages
from specserve.server.context import Ctx, route_label
from specserve.server.errors import invalid
from specserve.server.openai_api import chat_encoder
from specserve.server.openai_schemas import ChatMessage
from specserve.server.outcome import Outcome
from specserve.server.schemas import Strict
from specserve.server.tools import NO_TOOLS

router = APIRouter(tags=["tokenizer"])


class TokenizeRequest(Strict):
    inputs: str | None = Field(default=None, description="TGI: text to tokenize")
    prompt: str | None = Field(default=None, description="vLLM: text to tokenize")
    messages: list[ChatMessage] | None = Field(
        default=None, min_length=1, description="vLLM: chat messages, rendered by the template"
    )
    parameters: dict[str, Any] | None = Field(default=None, description="TGI: ignored")
    model: str | None = None
    add_special_tokens: bool = Field(default=False, description="vLLM; only false")
    add_generation_prompt: bool = Field(default=True, description="vLLM; only true")

    @model_validator(mode="after")
    def _one(self) -> TokenizeRequest:
        given = [k for k in ("inputs", "prompt", "messages") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("send exactly one of inputs (TGI), prompt or messages (vLLM)")
        return self


class TgiToken(BaseModel):
    id: int
    text: str
    start: int
    stop: int


class VllmTokens(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeRequest(Strict):
    tokens: list[int] = Field(..., description="token ids")
    model: str | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


@router.post("/tokenize", response_model=list[TgiToken] | VllmTokens)
async def tokenize(body: TokenizeRequest, ctx: Ctx) -> list[TgiToken] | VllmTokens:
    """Token ids of a prompt, as a generation request with it would be fed. Admitted as a
    generation request is (429 when the server is saturated), then tokenised off the loop."""
    if body.add_special_tokens:
        raise invalid("add_special_tokens", "only false (the chat template adds its own)")
    if not body.add_generation_prompt:
        raise invalid("add_generation_prompt", "only true (as a chat request renders it)")
    tracked = ctx.service.admit(route_label("/tokenize"))  # counted as "other"
    result = await prepared(ctx.service, tracked, lambda: _tokenize(ctx, body))
    tracked.outcome = Outcome.SUCCESS
    ctx.service.close(tracked)
    return result


def _tokenize(ctx: Ctx, body: TokenizeRequest) -> list[TgiToken] | VllmTokens:
    if body.inputs is not None:
        check_prompt_chars(len(body.inputs), ctx.limits, "inputs")
        return _with_offsets(ctx, body.inputs)
    if body.prompt is not None:
        check_prompt_chars(len(body.prompt), ctx.limits, "prompt")
        ids = ctx.encode(body.prompt)
    else:
        assert body.messages is not None
        messages = chat_messages(body.messages, NO_TOOLS, structured=False)
        check_prompt_chars(sum(len(m["content"]) for m in messages), ctx.limits, "messages")
        ids = chat_encoder(ctx)(messages)
    return VllmTokens(count=len(ids), max_model_len=ctx.limits.max_total_tokens, tokens=ids)


def _with_offsets(ctx: Ctx, text: str) -> list[TgiToken]:
    """Each token with its [start, stop) characters in `text` (the tokenizer's own offsets)."""
    ids = ctx.encode(text)
    enc = ctx.prompt_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if list(enc["input_ids"]) != ids:  # a tokenizer whose plain call differs: no offsets
        raise invalid("inputs", "this model's tokenizer gives no character offsets")
    return [
        TgiToken(id=t, text=text[a:b], start=a, stop=b)
        for t, (a, b) in zip(ids, enc["offset_mapping"], strict=True)
    ]


@router.post("/detokenize", response_model=DetokenizeResponse)
async def detokenize(body: DetokenizeRequest, ctx: Ctx) -> DetokenizeResponse:
    """The text of token ids (admitted as /tokenize is, decoded off the loop)."""
    vocab = ctx.limits.vocab_size
    if any(not 0 <= t < vocab for t in body.tokens):
        raise invalid("tokens", f"token ids must be in [0, {vocab})")
    tracked = ctx.service.admit(route_label("/detokenize"))
    text = await prepared(ctx.service, tracked, lambda: ctx.prompt_tokenizer.decode(body.tokens))
    tracked.outcome = Outcome.SUCCESS
    ctx.service.close(tracked)
    return DetokenizeResponse(prompt=text)
