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
from functools import partial
from typing import Any

from fastapi import APIRouter, Request

from specserve.request import RequestOutput, TokenLogprob
from specserve.server.admission import prepared
from specserve.server.context import Ctx, ServerContext, new_id
from specserve.server.direct import DirectWriter
from specserve.server.errors import ApiError, ErrorKind, error_body
from specserve.server.openai_logprobs import chat_logprobs, completion_logprobs
from specserve.server.openai_schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    CompletionTokensDetails,
    Delta,
    FinishReasonOpenAI,
    ModelCard,
    ModelList,
    Usage,
)
from specserve.server.params import (
    Prepared,
    check_choices,
    check_model,
    for_tenant,
    prepare_chat,
    prepare_completion,
    tenant_of,
)
from specserve.server.service import Tracked
from specserve.server.sse import EventStream, TextEvents, sse
from specserve.server.tools import ToolPlan, as_call

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
# Turns one choice's engine output into zero or more stream chunks.
ChunkFn = Callable[[int, RequestOutput], list[Any]]


def openai_finish(out: RequestOutput) -> FinishReasonOpenAI:
    return "length" if out.finish_reason == "length" else "stop"


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
    tracked = ctx.service.admit("/v1/completions", check_choices(body.n, ctx.limits))
    tenant = tenant_of(request)
    prep = await prepared(
        ctx.service,
        tracked,
        lambda: for_tenant(prepare_completion(body, ctx.encode, ctx.limits), tenant),
    )
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

        return _stream(ctx, request, body, prep, tracked, rid, chunks, last)
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
    tracked = ctx.service.admit("/v1/chat/completions", check_choices(body.n, ctx.limits))
    tenant = tenant_of(request)
    prep = await prepared(
        ctx.service,
        tracked,
        lambda: for_tenant(prepare_chat(body, chat_encoder(ctx), ctx.limits), tenant),
    )
    rid, created, model = new_id("chatcmpl"), int(time.time()), ctx.settings.model_id
    wants_logprobs = prep.params.logprobs is not None

    def logprobs(entries: list[TokenLogprob]) -> ChatLogprobs | None:
        return chat_logprobs(ctx.tokenizer, entries) if wants_logprobs else None

    if body.stream:
        chunks = _ChatChunks(rid, created, model, body.n, prep.tools, wants_logprobs, logprobs)
        first = [chunks.chunk(i, Delta(role="assistant", content="")) for i in range(body.n)]
        return _stream(ctx, request, body, prep, tracked, rid, chunks, chunks.last, first)
    results = await ctx.service.collect_choices(request, tracked, prep, rid, body.n)
    choices = []
    for i, r in enumerate(results):
        call = as_call(r.text, prep.tools)
        message = (
            AssistantMessage(content=r.text)
            if call is None
            else AssistantMessage(content=None, tool_calls=[call])
        )
        finish = openai_finish(r.final) if call is None else "tool_calls"
        choices.append(
            ChatChoice(
                index=i, message=message, logprobs=logprobs(r.logprobs), finish_reason=finish
            )
        )
    finals = [r.final for r in results]
    return ChatCompletionResponse(
        id=rid, created=created, model=model, choices=choices, usage=usage(finals)
    )


class _ChatChunks:
    """A streamed chat completion's chunks: per output of a choice, zero or more (a `ChunkFn`);
    `last`, the usage chunk."""

    def __init__(
        self,
        rid: str,
        created: int,
        model: str,
        n: int,
        tools: ToolPlan,
        wants_logprobs: bool,
        logprobs: Callable[[list[TokenLogprob]], ChatLogprobs | None],
    ) -> None:
        self.rid, self.created, self.model = rid, created, model
        self.wants_logprobs, self.logprobs = wants_logprobs, logprobs
        self.held = HeldCalls(tools)
        # per choice: its text deltas' JSON without a model each (most of a stream's events)
        self.deltas = [TextEvents(partial(self._content, i)) for i in range(n)]

    def chunk(self, i: int, delta: Delta, **fields: Any) -> ChatCompletionChunk:
        choice = ChatChunkChoice(index=i, delta=delta, **fields)
        return ChatCompletionChunk(
            id=self.rid, created=self.created, model=self.model, choices=[choice]
        )

    def _content(self, i: int, text: str) -> ChatCompletionChunk:
        return self.chunk(i, Delta(content=text))

    def __call__(self, i: int, out: RequestOutput) -> list[Any]:
        out_chunks: list[Any] = []
        text, entries, call = self.held.take(i, out)
        if call is not None:
            delta = Delta(tool_calls=[{"index": 0, **call}])
            out_chunks.append(self.chunk(i, delta, logprobs=self.logprobs(entries)))
            out_chunks.append(self.chunk(i, Delta(), finish_reason="tool_calls"))
            return out_chunks
        if text and not self.wants_logprobs:
            out_chunks.append(self.deltas[i](text))
        elif text or (self.wants_logprobs and entries):
            delta = Delta(content=text)
            out_chunks.append(self.chunk(i, delta, logprobs=self.logprobs(entries)))
        if out.finished:
            out_chunks.append(self.chunk(i, Delta(), finish_reason=openai_finish(out)))
        return out_chunks

    def last(self, finals: list[RequestOutput]) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.rid, created=self.created, model=self.model, choices=[], usage=usage(finals)
        )


class HeldCalls:
    """Streaming with tools: a choice whose text may be a call is held back until it finishes
    (a call is sent whole, in one delta); one that starts otherwise streams as text."""

    def __init__(self, plan: ToolPlan) -> None:
        self.plan = plan
        self.text: dict[int, str] = {}
        self.entries: dict[int, list[TokenLogprob]] = {}
        self.streaming: set[int] = set()

    def take(
        self, i: int, out: RequestOutput
    ) -> tuple[str, list[TokenLogprob], dict[str, Any] | None]:
        """What to send for this output now: (text, logprob entries, the call if it is one)."""
        entries = list(out.logprobs or [])
        if not self.plan.calls or i in self.streaming:
            return out.new_text, entries, None
        text = self.text.get(i, "") + out.new_text
        entries = self.entries.get(i, []) + entries
        if not self.plan.forced and text and not text.startswith("{"):
            self.streaming.add(i)  # text, not a call: send what was held and stream on
            return text, entries, None
        if not out.finished:
            self.text[i], self.entries[i] = text, entries
            return "", [], None
        return text, entries, as_call(text, self.plan)


def chat_encoder(ctx: ServerContext) -> Callable[[list[dict[str, str]]], list[int]]:
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
    request: Request,
    body: CompletionRequest | ChatCompletionRequest,
    prep: Prepared,
    tracked: Tracked,
    rid: str,
    chunks: ChunkFn,
    last: Callable[[list[RequestOutput]], Any],
    first: list[Any] | None = None,
) -> EventStream:
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    direct = None
    if body.n == 1:  # the engine's thread writes one choice's events (server/direct.py)

        def text(out: RequestOutput) -> str:
            return "".join(sse(c) for c in chunks(0, out))

        direct = ctx.direct_writer(request, tracked, text)
    events = _events(
        ctx,
        prep,
        tracked,
        rid,
        body.n,
        chunks,
        last if include_usage else None,
        first or [],
        direct,
    )
    return EventStream(events, lambda: ctx.service.close(tracked), direct)


async def _events(
    ctx: ServerContext,
    prep: Prepared,
    tracked: Tracked,
    rid: str,
    n: int,
    chunks: ChunkFn,
    last: Callable[[list[RequestOutput]], Any] | None,
    first: list[Any],
    direct: DirectWriter | None,
) -> AsyncIterator[str]:
    finals: dict[int, RequestOutput] = {}
    try:
        for c in first:
            yield sse(c)
        run = ctx.service.run_choices(tracked, prep, rid, n, sink=direct)
        async with contextlib.aclosing(run) as outs:
            async for i, out in outs:
                if out.finished and out.finish_reason in ("error", "abort"):
                    failed = ApiError(
                        500,
                        f"generation failed: {out.error or out.finish_reason}",
                        ErrorKind.GENERATION,
                    )
                    yield sse(error_body("/v1/", failed))
                    return
                await asyncio.sleep(0)  # let the loop notice a disconnect between outputs
                for c in chunks(i, out):
                    yield sse(c)
                if out.finished:
                    finals[i] = out
                    if len(finals) == n and last is not None:
                        yield sse(last([finals[j] for j in range(n)]))
        yield sse("[DONE]")
    except ApiError as err:
        yield sse(error_body("/v1/", err))
    except Exception as exc:  # headers are sent: the error must travel as an event
        logger.exception("stream failed")
        crashed = ApiError(500, f"internal error: {exc}", ErrorKind.GENERATION)
        yield sse(error_body("/v1/", crashed))
