"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (streaming or not),
/v1/models and /v1/models/{id}.

Streams are `data: <chunk>` events ending with `data: [DONE]`; a failure after the stream has
started is sent as `data: {"error": {...}}`, which the openai SDK raises as an APIError
(server/openai_stream.py builds them).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request

from specserve.outputs import RequestOutput, TokenLogprob
from specserve.server.admission import prepared
from specserve.server.chat_reply import reply_message
from specserve.server.chat_template import ChatTemplate, template_of
from specserve.server.context import Ctx, ServerContext, new_id
from specserve.server.openai_logprobs import chat_logprobs, completion_logprobs
from specserve.server.openai_replies import (
    ChatChoice,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Delta,
    ModelCard,
    ModelList,
)
from specserve.server.openai_schemas import ChatCompletionRequest, CompletionRequest
from specserve.server.openai_stream import ChatChunks, stream
from specserve.server.openai_usage import openai_finish, usage
from specserve.server.param_checks import check_choices, check_model
from specserve.server.params import Preparation, prepare, tenant_of, warn_ignored
from specserve.server.sse import EventStream

router = APIRouter(prefix="/v1", tags=["OpenAI"])

_ERROR = {"description": "OpenAI error object: {error: {message, type, param, code}}"}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}},
    400: _ERROR,
    401: _ERROR,
    413: _ERROR,
    429: _ERROR,
    500: _ERROR,
    503: _ERROR,
}


@router.get("/models", response_model=ModelList)
async def models(ctx: Ctx) -> ModelList:
    return ModelList(data=[ModelCard(id=ctx.settings.model_id, created=ctx.started)])


@router.get(
    "/models/{model_id:path}",
    response_model=ModelCard,
    responses={404: _ERROR},
    summary="Retrieve a model (its id from /v1/models, or its short name)",
)
async def model(model_id: str, ctx: Ctx) -> ModelCard:
    check_model(model_id, ctx.limits)
    return ModelCard(id=ctx.settings.model_id, created=ctx.started)


@router.post("/completions", response_model=CompletionResponse, responses=_RESPONSES)
async def completions(
    body: CompletionRequest, request: Request, ctx: Ctx
) -> CompletionResponse | EventStream:
    warn_ignored(body, "/v1/completions", ctx.metrics.count_ignored)
    tracked = ctx.service.admit("/v1/completions", check_choices(body.n, ctx.limits))
    how = Preparation(ctx.limits, ctx.encode, tenant=tenant_of(request))
    prep = await prepared(ctx.service, tracked, lambda: prepare(body, how))
    rid, created, model = new_id("cmpl"), int(time.time()), ctx.settings.model_id
    top = prep.params.logprobs

    def logprobs(entries: list[TokenLogprob], offset: int = 0) -> CompletionLogprobs | None:
        return None if top is None else completion_logprobs(ctx.tokenizer, entries, top, offset)

    if body.stream:
        offsets = [0] * body.n  # characters streamed so far, per choice

        def chunks(i: int, out: RequestOutput) -> list[Any]:
            finish = openai_finish(out) if out.finished else None
            if not out.new_text and finish is None and not (top is not None and out.logprobs):
                return []
            lp = logprobs(out.logprobs or [], offsets[i])
            offsets[i] += len(out.new_text)
            choice = CompletionChoice(index=i, text=out.new_text, logprobs=lp, finish_reason=finish)
            return [CompletionResponse(id=rid, created=created, model=model, choices=[choice])]

        def last(finals: list[RequestOutput]) -> Any:
            return CompletionResponse(
                id=rid, created=created, model=model, choices=[], usage=usage(finals)
            )

        return stream(ctx, request, body, prep, tracked, rid, chunks, last)
    results = await ctx.service.collect_choices(request, tracked, prep, rid, body.n)
    choices = [
        CompletionChoice(
            index=i,
            text=r.text,
            logprobs=logprobs(r.logprobs),
            finish_reason=openai_finish(r.final),
        )
        for i, r in enumerate(results)
    ]
    finals = [r.final for r in results]
    return CompletionResponse(
        id=rid, created=created, model=model, choices=choices, usage=usage(finals)
    )


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, ctx: Ctx
) -> ChatCompletionResponse | EventStream:
    warn_ignored(body, "/v1/chat/completions", ctx.metrics.count_ignored)
    tracked = ctx.service.admit("/v1/chat/completions", check_choices(body.n, ctx.limits))
    tenant = tenant_of(request)
    prep = await prepared(
        ctx.service,
        tracked,  # the template is read in the worker thread too
        lambda: prepare(body, Preparation(ctx.limits, ctx.encode, chat_encoder(ctx), tenant)),
    )
    rid, created, model = new_id("chatcmpl"), int(time.time()), ctx.settings.model_id
    wants_logprobs = prep.params.logprobs is not None

    def logprobs(entries: list[TokenLogprob]) -> ChatLogprobs | None:
        return chat_logprobs(ctx.tokenizer, entries) if wants_logprobs else None

    if body.stream:
        chunks = ChatChunks(rid, created, model, body.n, prep, wants_logprobs, logprobs)
        first = [chunks.chunk(i, Delta(role="assistant", content="")) for i in range(body.n)]
        return stream(ctx, request, body, prep, tracked, rid, chunks, chunks.last, first)
    results = await ctx.service.collect_choices(request, tracked, prep, rid, body.n)
    choices = []
    for i, r in enumerate(results):
        message, calls = reply_message(r.text, prep.tools, prep.reasoning)
        finish = "tool_calls" if calls else openai_finish(r.final)
        choices.append(
            ChatChoice(
                index=i, message=message, logprobs=logprobs(r.logprobs), finish_reason=finish
            )
        )
    finals = [r.final for r in results]
    return ChatCompletionResponse(
        id=rid, created=created, model=model, choices=choices, usage=usage(finals)
    )


def chat_encoder(ctx: ServerContext) -> ChatTemplate:
    """The served model's chat template, rendered with the prompt tokenizer (off the loop)."""
    return template_of(ctx.prompt_tokenizer, ctx.encode)
