"""Runs admitted requests through the backend (`server/backend.py`): admission, timing,
outcome, disconnects.

Life of one request here: `admit()` takes a slot (or raises 429/503) and returns a `Tracked`;
`run()` streams the engine's outputs while recording latencies; whatever way the request ends
(finished, failed, client gone), `Tracked.close()` runs exactly once and frees the slot.
Leaving `run()` early closes the engine iterator, which aborts the request and frees its KV.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import cast

from starlette.requests import Request

from specserve.engine.request import RequestOutput
from specserve.server.backend import Backend
from specserve.server.errors import ApiError, ErrorKind, invalid
from specserve.server.metrics import ServerMetrics, queue_seconds
from specserve.server.params import Prepared

logger = logging.getLogger(__name__)


class ClientGone(Exception):
    """The client disconnected before its (non-streaming) response was ready."""


@dataclass
class Tracked:
    route: str
    arrival: float
    outcome: str = "cancelled"  # until the engine says otherwise
    first_token: float | None = None
    last_token: float | None = None
    final: RequestOutput | None = None
    closed: bool = False
    token_ids: list[int] = field(default_factory=list)
    text: str = ""


@dataclass(frozen=True)
class Collected:
    token_ids: list[int]
    text: str
    final: RequestOutput


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
        self.draining = False

    def admit(self, route: str) -> Tracked:
        retry = {"Retry-After": str(self.retry_after_s)}
        if self.draining:
            raise ApiError(503, "the server is shutting down", ErrorKind.UNAVAILABLE, None, retry)
        if not self.engine.alive:
            why = f"the engine stopped: {self.engine.died or 'shut down'}"
            raise ApiError(503, why, ErrorKind.UNAVAILABLE, None, retry)
        if self.active >= self.max_concurrent:
            raise ApiError(
                429,
                f"too many requests in flight: the limit is {self.max_concurrent} "
                "(--max-concurrent-requests); retry later",
                ErrorKind.OVERLOADED,
                None,
                retry,
            )
        self.active += 1
        self.metrics.in_flight.inc()
        return Tracked(route, time.monotonic())

    def close(self, t: Tracked) -> None:
        if t.closed:
            return
        t.closed = True
        self.active -= 1
        self.metrics.in_flight.dec()
        self.metrics.count(t.route, t.outcome)
        if t.outcome == "success" and t.final is not None:
            m = self.metrics
            m.e2e.observe(time.monotonic() - t.arrival)
            m.input_tokens.observe(t.final.num_prompt_tokens)
            m.output_tokens.observe(t.final.num_output_tokens)

    async def run(
        self, t: Tracked, prep: Prepared, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        """The request's outputs. ApiError (422/503) if the engine refuses it at the start."""
        try:
            stream = self.engine.generate(prep.prompt_ids, prep.params, request_id)
            async with contextlib.aclosing(
                cast(AsyncGenerator[RequestOutput, None], stream)
            ) as outs:
                async for out in outs:
                    self._observe(t, out)
                    yield out
        except ValueError as exc:  # the engine refused the request before starting it
            t.outcome = "invalid"
            err = invalid("request", str(exc))
            err.counted = True
            raise err from exc
        except RuntimeError as exc:
            if t.final is not None or t.first_token is not None:
                t.outcome = "error"
                raise
            t.outcome = "unavailable"
            raise ApiError(503, str(exc), ErrorKind.UNAVAILABLE, counted=True) from exc
        except Exception:
            t.outcome = "error"
            raise
        finally:
            self.close(t)

    def _observe(self, t: Tracked, out: RequestOutput) -> None:
        now = time.monotonic()
        n = len(out.new_token_ids)
        if n and t.first_token is None:
            t.first_token = now
            self.metrics.ttft.observe(now - t.arrival)
            queued = queue_seconds(out)
            if queued is not None:
                self.metrics.queue.observe(queued)
        elif n and t.last_token is not None:
            for _ in range(n):
                self.metrics.itl.observe((now - t.last_token) / n)
        if n:
            t.last_token = now
        t.token_ids += out.new_token_ids
        t.text += out.new_text
        if out.finished:
            t.final = out
            t.outcome = {"error": "error", "abort": "cancelled"}.get(
                out.finish_reason or "", "success"
            )

    async def collect(
        self, request: Request, t: Tracked, prep: Prepared, request_id: str
    ) -> Collected:
        """Run to the end; if the client disconnects first, abort and raise ClientGone."""

        async def consume() -> Collected:
            async with contextlib.aclosing(self.run(t, prep, request_id)) as outs:
                async for _ in outs:
                    pass
            assert t.final is not None
            return Collected(t.token_ids, t.text, t.final)

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
        final = result.final
        if final.finish_reason == "abort" and self.draining:  # cut off by the drain timeout
            why = final.error or "the server is shutting down"
            raise ApiError(503, why, ErrorKind.UNAVAILABLE, counted=True)
        if final.finish_reason in ("error", "abort"):
            raise ApiError(
                500,
                f"generation failed: {final.error or final.finish_reason}",
                ErrorKind.GENERATION,
                counted=True,
            )
        return result


async def wait_disconnect(request: Request) -> None:
    """Returns when the client goes away (the body has been read already)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
