"""asyncio front for the engine: the step loop runs in a background thread.

`generate()` yields RequestOutputs as the engine produces them. Leaving the iterator early
(a client disconnect, a cancelled task) aborts the request, which frees its KV blocks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncGenerator

from specserve.engine.engine import Engine
from specserve.engine.request import RequestOutput, SamplingParams

logger = logging.getLogger(__name__)


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue[RequestOutput]]] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="specserve-engine", daemon=True)
        self._thread.start()

    @property
    def num_active(self) -> int:
        return len(self._queues)

    async def generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream one request's outputs. Raises ValueError (before any output) on bad input."""
        queue: asyncio.Queue[RequestOutput] = asyncio.Queue()
        with self._wake:
            if self._stopping:
                raise RuntimeError("engine is shutting down")
            rid = self.engine.add_request(prompt, params, request_id)
            self._queues[rid] = (asyncio.get_running_loop(), queue)
            self._wake.notify()
        finished = False
        try:
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(rid)
            self._queues.pop(rid, None)

    def abort(self, request_id: str) -> bool:
        with self._wake:
            found = self.engine.abort(request_id)
            self._wake.notify()
            return found

    def run_locked(self, fn):  # type: ignore[no-untyped-def]
        """Call fn(engine) while holding the engine lock (reads of live state)."""
        with self._lock:
            return fn(self.engine)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self.engine.has_work() and not self._stopping:
                    self._wake.wait()
                if self._stopping and not self.engine.has_work():
                    return
                try:
                    outputs = self.engine.step()
                except Exception:  # keep serving; the step already failed its own requests
                    logger.exception("engine step failed")
                    outputs = []
            for out in outputs:
                target = self._queues.get(out.request_id)
                if target is not None:
                    loop, queue = target
                    loop.call_soon_threadsafe(queue.put_nowait, out)

    async def shutdown(self, timeout: float = 30.0) -> None:
        """Stop accepting requests, let those in flight finish, then stop the thread."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        await asyncio.to_thread(self._thread.join, timeout)
