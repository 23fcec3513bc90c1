"""OpenAI streams: the chat stream's chunks (reasoning, content and tool calls) and the
event stream a route returns, `data: <chunk>` events ending with `data: [DONE]`; a failure
after the stream has started is sent as `data: {"error": {...}}`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

from fastapi import Request

from specserve.outputs import RequestOutput, TokenLogprob
from specserve.server.chat_reply import HeldCalls as HeldCalls  # the Responses stream's
from specserve.server.chat_reply import Piece, ReplyStream
from specserve.server.context import ServerContext
from specserve.server.direct import DirectWriter
from specserve.server.errors import ApiError, ErrorKind, error_body
from specserve.server.openai_replies import (
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatLogprobs,
    Delta,
)
from specserve.server.openai_schemas import ChatCompletionRequest, CompletionRequest
from specserve.server.openai_usage import openai_finish, usage
from specserve.server.params import Prepared
from specserve.server.sse import EventStream, TextEvents, sse
from specserve.server.tracked import Tracked

logger = logging.getLogger(__name__)
# Turns one choice's engine output into zero or more stream chunks.
ChunkFn = Callable[[int, RequestOutput], list[Any]]


class ChatChunks:
    """A streamed chat completion's chunks: per output of a choice, zero or more (a `ChunkFn`);
    `last`, the usage chunk. Reasoning, content and tool calls are split by a `ReplyStream` per
    choice (server/chat_reply.py); logprobs of text held back go out with the next chunk."""

    def __init__(
        self,
        rid: str,
        created: int,
        model: str,
        n: int,
        prep: Prepared,
        wants_logprobs: bool,
        logprobs: Callable[[list[TokenLogprob]], ChatLogprobs | None],
    ) -> None:
        self.rid, self.created, self.model = rid, created, model
        self.wants_logprobs, self.logprobs = wants_logprobs, logprobs
        self.replies = [ReplyStream(prep.tools, prep.reasoning) for _ in range(n)]
        self.plain = not prep.tools.calls and prep.reasoning is None
        self.pending: list[list[TokenLogprob]] = [[] for _ in range(n)]
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
        entries, self.pending[i] = self.pending[i] + list(out.logprobs or []), []
        if self.plain:
            piece = Piece(content=out.new_text)
        else:
            piece = self.replies[i].feed(out.new_text, out.finished)
        out_chunks: list[Any] = []
        if piece.reasoning or piece.calls:
            # One tool-call delta a chunk, as OpenAI sends them: clients merge a chunk's list
            # into their snapshot by index (the openai SDK's stream helper, instructor's
            # partials), and lost a call's first arguments sent beside its header.
            calls: list[dict[str, Any] | None] = [*piece.calls] or [None]
            for k, call in enumerate(calls):
                first = k == 0
                delta = Delta(
                    content=(piece.content or None) if first else None,
                    reasoning_content=(piece.reasoning or None) if first else None,
                    tool_calls=None if call is None else [call],
                )
                held = self.logprobs(entries) if first else None
                out_chunks.append(self.chunk(i, delta, logprobs=held))
        elif piece.content and not self.wants_logprobs:
            out_chunks.append(self.deltas[i](piece.content))
        elif piece.content or (self.plain and self.wants_logprobs and entries):
            delta = Delta(content=piece.content)
            out_chunks.append(self.chunk(i, delta, logprobs=self.logprobs(entries)))
        else:  # held back: its logprobs go with what is sent next
            self.pending[i] = entries
        if out.finished:
            finish = "tool_calls" if piece.is_calls else openai_finish(out)
            held = self.logprobs(self.pending[i]) if self.pending[i] else None
            out_chunks.append(self.chunk(i, Delta(), logprobs=held, finish_reason=finish))
        return out_chunks

    def last(self, finals: list[RequestOutput]) -> ChatCompletionChunk:
        return ChatCompletionChunk(
            id=self.rid, created=self.created, model=self.model, choices=[], usage=usage(finals)
        )


def stream(
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
                if out.failed:
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
