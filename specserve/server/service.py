"""Runs admitted requests through the backend (`server/backend.py`): admission, timing,
outcome, disconnects.

Life of one request here: `admit()` takes its slots (or raises 429/503) and returns a `Tracked`;
`run()` streams the engine's outputs while recording latencies; whatever way the request ends
(finished, failed, client gone), `Tracked.close()` runs exactly once and frees the slot.
Leaving `run()` early closes the engine iterator, which aborts the request and frees its KV.
A request for n choices (`run_choices`) is n engine requests taking n slots: choice i has its
own seed (`SamplingParams.for_choice`), and choices 1.. wait for choice 0's prompt to be
computed so that they share its cached blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from typing import cast

from starlette.requests import Request

from specserve.engine.handover import Sink
from specserve.outputs import RequestOutput
from specserve.request import FinishReason
from specserve.server.backend import Backend
from specserve.server.errors import ApiError, ErrorKind, invalid
from specserve.server.metrics import ServerMetrics, queue_seconds
from specserve.server.outcome import Outcome
from specserve.server.params import Prepared
from specserve.server.tracked import Choice, Collected, Tracked

logger = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) response was ready."""


class GenerationService:
    def __init__(
        self,
        backend: Backend,
        metrics: ServerMetrics,
        max_concurrent: int,
        retry_after_s: int,
    ) -> None:
        self.engine = backend
        self.metrics = metrics
        self.max_concurrent = max_concurrent
        self.retry_after_s = retry_after_s
        self.active = 0
        self.finished = 0  # requests admitted and closed, whatever their outcome
        self.draining = False

    def admit(self, route: str, slots: int = 1) -> Tracked:
        """Take `slots` (one per choice) before any work on the request: 429 if not free."""
        if slots > self.max_concurrent:
            why = f"must be <= {self.max_concurrent} (--max-concurrent-requests); got {slots}"
            raise invalid("n", why)
        retry = {"Retry-After": str(self.retry_after_s)}
        if self.draining:
            raise ApiError(503, "the server is shutting down", ErrorKind.UNAVAILABLE, None, retry)
        if not self.engine.alive:
            why = f"the engine stopped: {self.engine.died or 'shut down'}"
            raise ApiError(503, why, ErrorKind.UNAVAILABLE, None, retry)
        if self.active + slots > self.max_concurrent:
            raise ApiError(
                429,
                f"too many requests in flight: the limit is {self.max_concurrent} "
                "(--max-concurrent-requests); retry later",
                ErrorKind.OVERLOADED,
                None,
                retry,
            )
        self.active += slots
        self.metrics.in_flight.inc()
        return Tracked(route, time.monotonic(), slots=slots)

    def close(self, t: Tracked) -> None:
        if t.closed:
            return
        t.closed = True
        self.active -= t.slots
        self.finished += 1
        self.metrics.in_flight.dec()
        self.metrics.count(t.route, t.outcome)
        if t.outcome is Outcome.SUCCESS and t.final is not None:
            m = self.metrics
            m.e2e.observe(time.monotonic() - t.arrival)
            m.input_tokens.observe(t.final.num_prompt_tokens)
            m.output_tokens.observe(t.final.num_output_tokens)

    async def run(
        self, t: Tracked, prep: Prepared, request_id: str, sink: Sink | None = None
    ) -> AsyncGenerator[RequestOutput, None]:
        """The request's outputs. ApiError (422/503) if the engine refuses it at the start.
        `sink`: see `run_choices`."""
        outputs = self.run_choices(t, prep, request_id, 1, sink=sink)
        async with contextlib.aclosing(outputs) as outs:
            async for _, out in outs:
                yield out

    async def run_choices(
        self,
        t: Tracked,
        prep: Prepared,
        request_id: str,
        n: int,
        stream: bool = True,
        sink: Sink | None = None,
    ) -> AsyncGenerator[tuple[int, RequestOutput], None]:
        """(choice, output) pairs of the request's n choices, as they come (`stream=False`:
        each choice's first output with tokens and its last, see `Backend.generate`).
        `sink` (one choice only): takes outputs on the engine's side where it can, none of
        which come out here; it must `observe` each one it takes."""
        t.choices = [Choice() for _ in range(n)]
        sink = sink if n == 1 else None
        streams = [self._choice_stream(prep, request_id, i, n, stream, sink) for i in range(n)]
        try:
            async with contextlib.aclosing(merged(streams)) as outs:
                async for i, out in outs:
                    self.observe(t, i, out)
                    yield i, out
        except ValueError as exc:  # the engine refused the request before starting it
            t.outcome = Outcome.INVALID
            err = invalid("request", str(exc))
            err.counted = True
            raise err from exc
        except RuntimeError as exc:
            if t.first_token is not None or any(c.final for c in t.choices):
                t.outcome = Outcome.ERROR
                raise
            t.outcome = Outcome.UNAVAILABLE
            raise ApiError(503, str(exc), ErrorKind.UNAVAILABLE, counted=True) from exc
        except Exception:
            t.outcome = Outcome.ERROR
            raise
        finally:
            self.close(t)

    def _choice_stream(
        self, prep: Prepared, request_id: str, i: int, n: int, stream: bool, sink: Sink | None
    ) -> AsyncGenerator[RequestOutput, None]:
        rid = request_id if n == 1 else f"{request_id}-{i}"
        after = f"{request_id}-0" if i else None
        params = prep.params.for_choice(i)
        outputs = self.engine.generate(prep.prompt_ids, params, rid, after, stream, sink)
        return cast(AsyncGenerator[RequestOutput, None], outputs)

    def observe(self, t: Tracked, i: int, out: RequestOutput) -> None:
        """Record one output of choice i: its timings, its tokens and text, the outcome."""
        now = time.monotonic()
        c = t.choices[i]
        n = len(out.new_token_ids)
        if n and t.first_token is None:
            t.first_token = now
            self.metrics.ttft.observe(now - t.arrival)
            queued = queue_seconds(out)
            if queued is not None:
                self.metrics.queue.observe(queued)
        elif n and c.last_token is not None:
            # Tokens that arrive together (a verified draft; a non-streaming request's tokens
            # after its first, handed over at the finish) each count the mean gap.
            for _ in range(n):
                self.metrics.itl.observe((now - c.last_token) / n)
        if n:
            c.last_token = now
        c.token_ids += out.new_token_ids
        c.text += out.new_text
        c.logprobs += out.logprobs or []
        if out.prompt_logprobs is not None:
            c.prompt_logprobs = out.prompt_logprobs
        if out.finished:
            c.final = out
            if t.final is not None:  # every choice has finished
                t.outcome = outcome_of([x.final for x in t.choices if x.final is not None])

    async def collect(
        self, request: Request, t: Tracked, prep: Prepared, request_id: str
    ) -> Collected:
        """Run to the end; if the client disconnects first, abort and raise ClientGone."""
        return (await self.collect_choices(request, t, prep, request_id, 1))[0]

    async def collect_choices(
        self, request: Request, t: Tracked, prep: Prepared, request_id: str, n: int
    ) -> list[Collected]:
        """Every choice to its end; ClientGone (all aborted) if the client disconnects first."""

        async def consume() -> list[Collected]:
            outputs = self.run_choices(t, prep, request_id, n, stream=False)
            async with contextlib.aclosing(outputs) as outs:
                async for _ in outs:
                    pass
            return [Collected.of(c) for c in t.choices]

        work = asyncio.ensure_future(consume())
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                raise ClientGone()
            result = work.result()
        except (ApiError, ClientGone):
            raise
        except Exception as exc:  # this request fails; the server and other requests go on
            logger.exception("request %s failed", request_id)
            raise ApiError(
                500,
                f"internal error: {type(exc).__name__}: {exc}",
                ErrorKind.GENERATION,
                counted=True,
            ) from exc
        finally:
            for task in (work, gone):
                task.cancel()
            await asyncio.gather(work, gone, return_exceptions=True)
            self.close(t)
        for final in (r.final for r in result):
            if final.finish_reason == FinishReason.ABORT and self.draining:  # the drain's timeout
                why = final.error or "the server is shutting down"
                raise ApiError(503, why, ErrorKind.UNAVAILABLE, counted=True)
            if final.failed:
                raise ApiError(
                    500,
                    f"generation failed: {final.error or final.finish_reason}",
                    ErrorKind.GENERATION,
                    counted=True,
                )
        return result


def outcome_of(finals: list[RequestOutput]) -> Outcome:
    """A request's outcome from its choices' final outputs: an error if any failed, else
    cancelled if any was aborted."""
    reasons = {f.finish_reason for f in finals}
    if FinishReason.ERROR in reasons:
        return Outcome.ERROR
    return Outcome.CANCELLED if FinishReason.ABORT in reasons else Outcome.SUCCESS


async def merged(
    streams: list[AsyncGenerator[RequestOutput, None]],
) -> AsyncGenerator[tuple[int, RequestOutput], None]:
    """(index, item) from several streams as each yields; the first failure ends it all.
    Closing it closes every stream (which aborts their requests)."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for out in only:
                yield 0, out
        return
    queue: asyncio.Queue[tuple[int, RequestOutput] | BaseException | None] = asyncio.Queue()

    async def pump(i: int, stream: AsyncGenerator[RequestOutput, None]) -> None:
        try:
            async with contextlib.aclosing(stream) as outs:
                async for out in outs:
                    await queue.put((i, out))
            await queue.put(None)
        except Exception as exc:
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def wait_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
