"""TGI-compatible routes: POST /generate, /generate_stream and / (which dispatches on `stream`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from specserve.outputs import RequestOutput, TokenLogprob
from specserve.request import FinishReason
from specserve.server.admission import prepared
from specserve.server.context import Ctx, ServerContext, new_id
from specserve.server.direct import DirectWriter
from specserve.server.errors import ApiError, error_body
from specserve.server.params import Preparation, Prepared, prepare, tenant_of, warn_ignored
from specserve.server.schemas import (
    CompatGenerateRequest,
    Details,
    ErrorResponse,
    FinishReasonTGI,
    GenerateRequest,
    GenerateResponse,
    PrefillToken,
    StreamDetails,
    StreamResponse,
    Token,
)
from specserve.server.sse import EventStream, json_of, sse
from specserve.server.tracked import Collected, Tracked

logger = logging.getLogger(__name__)
router = APIRouter(tags=["TGI"])

# TGI spells our finish reasons its own way; any other is "length".
_FINISH: dict[FinishReason | None, FinishReasonTGI] = {
    FinishReason.EOS: "eos_token",
    FinishReason.STOP: "stop_sequence",
}
_ERRORS: dict[int | str, dict[str, Any]] = {
    413: {"model": ErrorResponse},
    422: {"model": ErrorResponse},
    424: {"model": ErrorResponse},
    429: {"model": ErrorResponse},
    503: {"model": ErrorResponse},
}
_SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "TGI token events"}
}


def finish_reason(out: RequestOutput) -> FinishReasonTGI:
    return _FINISH.get(out.finish_reason, "length")


def _tokens(ctx: ServerContext, out: RequestOutput) -> list[dict[str, Any]]:
    """The output's tokens as `Token`'s fields (models are built only where an event needs
    more than the token: see `_events`)."""
    texts = ctx.token_texts(out.new_token_ids, out.new_text)
    lps = _logprobs(out.logprobs, len(out.new_token_ids))
    return [
        {"id": t, "text": s, "logprob": lp, "special": t in ctx.special_ids}
        for t, s, lp in zip(out.new_token_ids, texts, lps, strict=True)
    ]


def _logprobs(entries: list[TokenLogprob] | None, n: int) -> list[float | None]:
    return [e.logprob for e in entries] if entries is not None else [None] * n


def _top_tokens(ctx: ServerContext, entry: TokenLogprob) -> list[Token]:
    return [
        Token(id=t, text=ctx.tokenizer.decode([t]), logprob=lp, special=t in ctx.special_ids)
        for t, lp in entry.top
    ]


@router.post("/generate", response_model=GenerateResponse, responses=_ERRORS)
async def generate(body: GenerateRequest, request: Request, ctx: Ctx) -> JSONResponse:
    """Generate text for `inputs`; `parameters.details` adds per-token details."""
    response, headers = await _generate(body, request, ctx, "/generate")
    return JSONResponse(response.model_dump(mode="json"), headers=headers)


async def _generate(
    body: GenerateRequest, request: Request, ctx: Ctx, route: str
) -> tuple[GenerateResponse, dict[str, str]]:
    warn_ignored(body, route, ctx.metrics.count_ignored)
    tracked = ctx.service.admit(route)
    how = Preparation(ctx.limits, ctx.encode, tenant=tenant_of(request))
    prep = await prepared(ctx.service, tracked, lambda: prepare(body, how))
    result = await ctx.service.collect(request, tracked, prep, new_id("gen"))
    elapsed_ms = int((time.monotonic() - tracked.arrival) * 1000)
    n = len(result.token_ids)
    headers = {
        "x-prompt-tokens": str(len(prep.prompt_ids)),
        "x-generated-tokens": str(n),
        "x-total-time": str(elapsed_ms),
        "x-time-per-token": str(elapsed_ms // max(n, 1)),
    }
    return _response(ctx, body, prep, result), headers


def _response(
    ctx: ServerContext, body: GenerateRequest, prep: Prepared, result: Collected
) -> GenerateResponse:
    p = body.parameters
    prefix = body.inputs if p.return_full_text else ""
    if not p.details:
        return GenerateResponse(generated_text=prefix + result.text)
    final = result.final
    texts = [ctx.tokenizer.decode([t], skip_special_tokens=True) for t in result.token_ids]
    lps = _logprobs(result.logprobs or None, len(result.token_ids))
    details = Details(
        finish_reason=finish_reason(final),
        generated_tokens=final.num_output_tokens,
        seed=prep.seed,
        prefill=_prefill(ctx, prep, result.prompt_logprobs) if p.decoder_input_details else [],
        tokens=[
            Token(id=t, text=s, logprob=lp, special=t in ctx.special_ids)
            for t, s, lp in zip(result.token_ids, texts, lps, strict=True)
        ],
        top_tokens=[_top_tokens(ctx, e) for e in result.logprobs] if p.top_n_tokens else None,
        drafted_tokens=final.drafted_tokens,
        accepted_tokens=final.accepted_tokens,
        speculation_steps=final.spec_steps,
    )
    return GenerateResponse(generated_text=prefix + result.text, details=details)


def _prefill(
    ctx: ServerContext, prep: Prepared, lps: list[TokenLogprob | None] | None
) -> list[PrefillToken]:
    """The prompt's tokens; each one's log-probability given those before (none for the first)."""
    values = [e.logprob if e is not None else None for e in lps or [None] * len(prep.prompt_ids)]
    return [
        PrefillToken(id=t, text=ctx.tokenizer.decode([t]), logprob=lp)
        for t, lp in zip(prep.prompt_ids, values, strict=True)
    ]


@router.post("/generate_stream", response_model=None, responses={**_SSE, **_ERRORS})
async def generate_stream(body: GenerateRequest, request: Request, ctx: Ctx) -> EventStream:
    """Stream one TGI token event per generated token; the last carries the text and details."""
    return await _stream(body, request, ctx, "/generate_stream")


async def _stream(
    body: GenerateRequest, request: Request, ctx: ServerContext, route: str
) -> EventStream:
    warn_ignored(body, route, ctx.metrics.count_ignored)
    tracked = ctx.service.admit(route)
    how = Preparation(ctx.limits, ctx.encode, tenant=tenant_of(request), stream=True)
    prep = await prepared(ctx.service, tracked, lambda: prepare(body, how))
    events = _Events(ctx, body, prep)
    direct = ctx.direct_writer(request, tracked, events)
    return EventStream(
        _events(ctx, events, prep, tracked, direct), lambda: ctx.service.close(tracked), direct
    )


class _Events:
    """A stream's token events per output (their SSE text), and what they carry over."""

    def __init__(self, ctx: ServerContext, body: GenerateRequest, prep: Prepared) -> None:
        self.ctx, self.prep, self.p = ctx, prep, body.parameters
        self.text = body.inputs if self.p.return_full_text else ""
        self.index = 0

    def __call__(self, out: RequestOutput) -> str:
        ctx, p = self.ctx, self.p
        self.text += out.new_text
        tokens = _tokens(ctx, out)
        events = []
        for i, token in enumerate(tokens):
            self.index += 1
            last = out.finished and i == len(tokens) - 1
            top = None
            if p.top_n_tokens and out.logprobs is not None:
                top = _top_tokens(ctx, out.logprobs[i])
            if top is None and not last:  # most events: the token alone, no model
                events.append(sse(token_event(self.index, token)))
                continue
            event = StreamResponse(
                index=self.index,
                token=Token(**token),
                top_tokens=top,
                generated_text=self.text if last else None,
                details=_stream_details(out, self.prep) if last and p.details else None,
            )
            events.append(sse(event))
        return "".join(events)


async def _events(
    ctx: ServerContext,
    events: _Events,
    prep: Prepared,
    tracked: Tracked,
    direct: DirectWriter | None,
) -> AsyncIterator[str]:
    try:
        run = ctx.service.run(tracked, prep, new_id("gen"), direct)
        async with contextlib.aclosing(run) as outs:
            async for out in outs:
                if out.failed:
                    msg = f"generation failed: {out.error or out.finish_reason}"
                    yield sse({"error": msg, "error_type": "generation"})
                    return
                await asyncio.sleep(0)  # let the loop notice a disconnect between outputs
                if text := events(out):
                    yield text
    except ApiError as err:
        yield sse(error_body("/generate_stream", err))
    except Exception as exc:  # headers are sent: the error must travel as an event
        logger.exception("stream failed")
        yield sse({"error": f"internal error: {exc}", "error_type": "generation"})


def token_event(index: int, token: dict[str, Any]) -> str:
    """The JSON of `StreamResponse(index=index, token=Token(**token))`, without the models."""
    return json_of({"index": index, "token": token, **_NO_EXTRAS})


# StreamResponse's fields after the token, as a token's event without them carries them.
_NO_EXTRAS = {"top_tokens": None, "generated_text": None, "details": None}


def _stream_details(out: RequestOutput, prep: Prepared) -> StreamDetails:
    return StreamDetails(
        finish_reason=finish_reason(out),
        generated_tokens=out.num_output_tokens,
        seed=prep.seed,
        input_length=out.num_prompt_tokens,
        drafted_tokens=out.drafted_tokens,
        accepted_tokens=out.accepted_tokens,
        speculation_steps=out.spec_steps,
    )


@router.post(
    "/",
    response_model=None,
    responses={200: {"model": list[GenerateResponse], **_SSE[200]}, **_ERRORS},
    summary="TGI compat route: /generate, or /generate_stream when stream is true",
)
async def compat_generate(
    body: CompatGenerateRequest, request: Request, ctx: Ctx
) -> JSONResponse | EventStream:
    req = GenerateRequest(inputs=body.inputs, parameters=body.parameters)
    if body.stream:
        return await _stream(req, request, ctx, "/")
    response, headers = await _generate(req, request, ctx, "/")
    return JSONResponse([response.model_dump(mode="json")], headers=headers)
