"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (streaming or not),
/v1/models and /v1/models/{id}.

Streams are `data: <chunk>` events ending with `data: [DONE]`; a failure after the stream has
started is sent as `data: {"error": {...}}`, which the openai SDK raises as an APIError.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import APIRouter, Request

from specserve.engine.request import RequestOutput
from specserve.server.context import Ctx, ServerContext, new_id
from specserve.server.errors import ApiError, ErrorKind, error_body
from specserve.server.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    CompletionTokensDetails,
    Delta,
    FinishReasonOpenAI,
    ModelCard,
    ModelList,
    Usage,
)
from specserve.server.params import Prepared, check_model, prepare_chat, prepare_completion
from specserve.server.service import Tracked
from specserve.server.sse import EventStream, sse

logger = logging.getLogger(__name__)
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
# Turns one engine output into zero or more stream chunks.
ChunkFn = Callable[[RequestOutput], list[Any]]


def openai_finish(out: RequestOutput) -> FinishReasonOpenAI:
    return "length" if out.finish_reason == "length" else "stop"


def usage(out: RequestOutput) -> Usage:
    return Usage(
        prompt_tokens=out.num_prompt_tokens,
        completion_tokens=out.num_output_tokens,
        total_tokens=out.num_prompt_tokens + out.num_output_tokens,
        completion_tokens_details=CompletionTokensDetails(
            accepted_prediction_tokens=out.accepted_tokens,
            rejected_prediction_tokens=out.drafted_tokens - out.accepted_tokens,
            speculation_steps=out.spec_steps,
        ),
    )


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
    prep = prepare_completion(body, ctx.encode, ctx.limits)
    rid, created, model = new_id("cmpl"), int(time.time()), ctx.settings.model_id
    tracked = ctx.service.admit("/v1/completions")
    if body.stream:

        def chunks(out: RequestOutput) -> list[Any]:
            finish = openai_finish(out) if out.finished else None
            if not out.new_text and finish is None:
                return []
            choice = CompletionChoice(text=out.new_text, finish_reason=finish)
            return [CompletionResponse(id=rid, created=created, model=model, choices=[choice])]

        def last(out: RequestOutput) -> Any:
            return CompletionResponse(
                id=rid, created=created, model=model, choices=[], usage=usage(out)
            )

        return _stream(ctx, body, prep, tracked, rid, chunks, last)
    result = await ctx.service.collect(request, tracked, prep, rid)
    choice = CompletionChoice(text=result.text, finish_reason=openai_finish(result.final))
    return CompletionResponse(
        id=rid, created=created, model=model, choices=[choice], usage=usage(result.final)
    )


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses=_RESPONSES)
async def chat_completions(
    body: ChatCompletionRequest, request: Request, ctx: Ctx
) -> ChatCompletionResponse | EventStream:
    prep = prepare_chat(body, _chat_encoder(ctx), ctx.limits)
    rid, created, model = new_id("chatcmpl"), int(time.time()), ctx.settings.model_id
    tracked = ctx.service.admit("/v1/chat/completions")
    if body.stream:

        def chunk(delta: Delta, finish: FinishReasonOpenAI | None = None) -> ChatCompletionChunk:
            choice = ChatChunkChoice(delta=delta, finish_reason=finish)
            return ChatCompletionChunk(id=rid, created=created, model=model, choices=[choice])

        def chunks(out: RequestOutput) -> list[Any]:
            out_chunks: list[Any] = []
            if out.new_text:
                out_chunks.append(chunk(Delta(content=out.new_text)))
            if out.finished:
                out_chunks.append(chunk(Delta(), openai_finish(out)))
            return out_chunks

        def last(out: RequestOutput) -> Any:
            return ChatCompletionChunk(
                id=rid, created=created, model=model, choices=[], usage=usage(out)
            )

        first = chunk(Delta(role="assistant", content=""))
        return _stream(ctx, body, prep, tracked, rid, chunks, last, first)
    result = await ctx.service.collect(request, tracked, prep, rid)
    choice = ChatChoice(
        message=AssistantMessage(content=result.text), finish_reason=openai_finish(result.final)
    )
    return ChatCompletionResponse(
        id=rid, created=created, model=model, choices=[choice], usage=usage(result.final)
    )


def _chat_encoder(ctx: ServerContext) -> Callable[[list[dict[str, str]]], list[int]]:
    from jinja2 import TemplateError

    def encode(messages: list[dict[str, str]]) -> list[int]:
        try:
            return ctx.encode_chat(messages)
        except TemplateError as exc:
            raise ApiError(
                422,
                f"messages: the chat template rejected them: {exc}",
                ErrorKind.VALIDATION,
                "messages",
            ) from exc

    return encode


def _stream(
    ctx: ServerContext,
    body: CompletionRequest | ChatCompletionRequest,
    prep: Prepared,
    tracked: Tracked,
    rid: str,
    chunks: ChunkFn,
    last: Callable[[RequestOutput], Any],
    first: Any | None = None,
) -> EventStream:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = _events(ctx, prep, tracked, rid, chunks, last if include_usage else None, first)
    return EventStream(events, lambda: ctx.service.close(tracked))


async def _events(
    ctx: ServerContext,
    prep: Prepared,
    tracked: Tracked,
    rid: str,
    chunks: ChunkFn,
    last: Callable[[RequestOutput], Any] | None,
    first: Any | None,
) -> AsyncIterator[str]:
    try:
        if first is not None:
            yield sse(first)
        async with contextlib.aclosing(ctx.service.run(tracked, prep, rid)) as outs:
            async for out in outs:
                if out.finished and out.finish_reason in ("error", "abort"):
                    failed = ApiError(
                        500,
                        f"generation failed: {out.error or out.finish_reason}",
                        ErrorKind.GENERATION,
                    )
                    yield sse(error_body("/v1/", failed))
                    return
                await asyncio.sleep(0)  # let the loop notice a disconnect between outputs
                for c in chunks(out):
                    yield sse(c)
                if out.finished and last is not None:
                    yield sse(last(out))
        yield sse("[DONE]")
    except ApiError as err:
        yield sse(error_body("/v1/", err))
    except Exception as exc:  # headers are sent: the error must travel as an event
        logger.exception("stream failed")
        crashed = ApiError(500, f"internal error: {exc}", ErrorKind.GENERATION)
        yield sse(error_body("/v1/", crashed))
