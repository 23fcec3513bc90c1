"""asyncio front for the engine: the step loop runs in a background thread.

Only the step thread touches the engine's mutable state. `generate()` validates on the caller's
side (read-only), then hands the request to the thread through an inbox (engine/inbox.py);
aborts go the same way. So a long forward pass never blocks the event loop. Leaving the
`generate()` iterator early (a client disconnect, a cancelled task) aborts the request, which
frees its KV blocks.

The engine is built in the step thread, which allocates from glibc's main malloc arena: why,
and what each measured, in `engine/step_thread.py`.

Outputs reach the event loop once per step, all of that step's requests in one wake-up; a
non-streaming caller (`stream=False`) is woken for its first token and then only when it
finishes, with everything between merged into that last output. When the compute threads
take every core, the step thread waits after each hand-over until the loop has run what it
woke (bounded by the step's own duration) before starting the next step: an event loop that
runs while a parallel region does takes a core from one of its threads, and the whole region
waits for it. So the loop's work per token is done between steps, not inside them. "What it
woke" ends when every consumer of the hand-over comes back to `generate()` for its next
output: by then the event is framed and written to the socket (a response body asks for its
next chunk only after sending the last). A fixed number of loop passes ended the wait before
that: measured ad hoc on 2 cores, batch-1 streaming, the step thread waited 0.03 ms (median) while
the loop thread spent ~0.65-0.8 ms of CPU per token (holding the GIL, so the step thread
stalled on it rather than on the wait).

A streaming request may bring a sink (`Sink`): in `serve`, a writer of its response's events
straight to its socket (`server/direct.py`). When the compute threads take every core, the
step thread offers the sink each output but the last, and only while the loop has nothing of
that request's left to do (it has consumed every output handed over so far), so the two never
write out of order; what the sink takes wakes no event loop, and the step thread does not wait
for one. Measured on 2 cores, batch-1 streaming, the step thread's time from the end of one
step to the start of the next: ~0.24 ms a token with the sink against ~0.47 through the loop
(ad hoc). With a core to spare the loop's work runs beside the compute instead, and the sink's
would only lengthen the step thread's: there it is not offered anything.

`Engine.step` fails the requests a fault concerns and never raises for them. If the thread dies
anyway (a bug in this loop), every open request gets a final error output, `alive` turns False
and `generate()` refuses new requests at once instead of queueing them for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar, cast

from specserve.engine.engine import Engine
from specserve.engine.handover import Listener, Outputs, Sink, Ticket, hand_over
from specserve.engine.inbox import Abort, AbortAll, Add, Item, Read, apply
from specserve.engine.step_thread import compute_takes_every_core, one_malloc_arena
from specserve.outputs import RequestOutput
from specserve.request import FinishReason, SamplingParams

logger = logging.getLogger(__name__)
T = TypeVar("T")


# The shortest wait for the event loop after a hand-over (the bound is the step's duration).
MIN_HAND_OVER_WAIT_S = 0.002
# The longest a grammar build waits for a step to finish (`_pace`): a long step delays builds
# by at most this.
PACE_TIMEOUT_S = 0.5


class AsyncEngine:
    def __init__(
        self, engine: Engine | Callable[[], Engine], yield_cores: bool | None = None
    ) -> None:
        """`engine`, or a function that builds it: then it is built in the step thread (see the
        module docstring), and this raises whatever building it raised. `yield_cores`: whether
        compute takes every core (see the module docstring); None: as the step thread finds."""
        self.engine: Engine
        self._lock = threading.Lock()  # held by the step thread while it touches the engine
        self._inbox: list[Item] = []
        self._wake = threading.Condition()  # guards _inbox and _stopping
        self._queues: dict[str, Listener] = {}
        self._ids = itertools.count()
        self._stopping = False
        self._yield_cores = yield_cores  # the step thread decides if None
        self.died: str | None = None  # why the step thread died, if it did
        self._stepped = threading.Condition()  # guards _steps, notified after each step
        self._steps = 0  # steps finished
        self._paced_at = 0  # _steps when the last grammar build was let go
        build = None if isinstance(engine, Engine) else engine
        if build is None:
            self.engine = cast(Engine, engine)
        self._built = threading.Event()
        self._build_error: BaseException | None = None
        one_malloc_arena()
        self._thread = threading.Thread(
            target=self._run, args=(build,), name="specserve-engine", daemon=True
        )
        self._thread.start()
        self._built.wait()
        if self._build_error is not None:
            raise self._build_error

    @property
    def num_active(self) -> int:
        return len(self._queues)

    @property
    def alive(self) -> bool:
        """The step thread is running (False after it died, or after shutdown)."""
        return self.died is None and self._thread.is_alive()

    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str | None = None,
        after: str | None = None,
        stream: bool = True,
        sink: Sink | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream one request's outputs. Raises ValueError (before any output) on bad input.
        `after`: see `Engine.add_prepared`. `stream=False`: the first output with tokens, then
        one output at the finish carrying everything after it. `sink`: takes outputs on the
        step thread where it can (see `Sink`); this yields the rest, the last always."""
        if params.grammar is None:
            ids, params = self.engine.prepare(prompt, params)
        else:  # compiling a grammar (the first one builds llguidance's tokenizer, ~1 s)
            ids, params = await asyncio.to_thread(self.engine.prepare, prompt, params)
        rid = request_id or f"async-{next(self._ids)}"
        if rid in self._queues:
            raise ValueError(f"request id {rid!r} is already in use")
        queue: Outputs = asyncio.Queue()
        listener = Listener(asyncio.get_running_loop(), queue, stream, sink)
        self._queues[rid] = listener
        if not self._post(Add(rid, ids, params, after)):
            self._queues.pop(rid, None)
            why = f"the engine stopped: {self.died}" if self.died else "engine is shutting down"
            raise RuntimeError(why)
        finished = False
        ticket: Ticket | None = None
        try:
            while not finished:
                out, ticket = await queue.get()
                finished = out.finished
                yield out
                listener.taken += 1
                ticket.release()  # the caller is back: it has done what this output asked
                ticket = None
        finally:
            if ticket is not None:
                ticket.release()
            if not finished:
                self.abort(rid)
            self._queues.pop(rid, None)

    def abort(self, request_id: str) -> None:
        self._post(Abort(request_id), even_when_stopping=True)

    def abort_all(self, error: str) -> None:
        """End every request in flight now, each with a final output carrying `error`."""
        self._post(AbortAll(error), even_when_stopping=True)

    def run_locked(self, fn: Callable[[Engine], T]) -> T:
        """Call fn(engine) between steps (for consistent reads of live state)."""
        with self._lock:
            return fn(self.engine)

    def read_between_steps(self, fn: Callable[[Engine], T]) -> T:
        """fn(engine) between steps, like `run_locked`, but the caller never waits on the
        engine's lock: while a step runs, the step thread itself calls fn before its next step
        (a short read, such as a metrics snapshot, that a flood of callers must not turn into
        lock hand-offs with the step thread). Called here when the lock is free."""
        if self._lock.acquire(blocking=False):
            try:
                return fn(self.engine)
            finally:
                self._lock.release()
        done: Future[object] = Future()
        if not self._post(Read(fn, done)):
            return self.run_locked(fn)  # stopping or stopped: nothing steps any more
        while True:
            try:
                return cast(T, done.result(timeout=1.0))
            except FutureTimeout:
                if not self._thread.is_alive() and not done.done():
                    return self.run_locked(fn)  # the thread died before reading

    def _post(self, item: Item, even_when_stopping: bool = False) -> bool:
        with self._wake:
            if self.died is not None or (self._stopping and not even_when_stopping):
                return False
            self._inbox.append(item)
            self._wake.notify()
            return True

    def _run(self, build: Callable[[], Engine] | None) -> None:
        try:
            if build is not None:
                self.engine = build()
            self.engine.grammars.pace = self._pace
            if self._yield_cores is None:
                self._yield_cores = compute_takes_every_core()
        except BaseException as exc:
            self._build_error = exc
            return
        finally:
            self._built.set()
        try:
            self._loop()
        except BaseException as exc:  # a bug here: fail everyone now rather than hang them
            with self._wake:
                self.died = f"{type(exc).__name__}: {exc}"
                self._stopping = True
            logger.critical("the engine thread died; failing every open request", exc_info=True)
            error = f"the engine stopped: {self.died}"
            self._deliver(
                [
                    RequestOutput(rid, [], "", True, FinishReason.ERROR, 0, 0, error=error)
                    for rid in list(self._queues)
                ]
            )

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._inbox and not self.engine.has_work() and not self._stopping:
                    self._wake.wait()
                inbox, self._inbox = self._inbox, []
                if self._stopping and not inbox and not self.engine.has_work():
                    return
            with self._lock:
                failed = [apply(self.engine, item) for item in inbox]
                started = time.monotonic()
                outputs = self.engine.step()  # fails the requests a fault concerns; never raises
                took = time.monotonic() - started
            with self._stepped:
                self._steps += 1
                self._stepped.notify_all()
            handed = self._deliver([f for f in failed if f is not None] + outputs)
            if self._yield_cores:
                deadline = time.monotonic() + max(took, MIN_HAND_OVER_WAIT_S)
                for done in handed:
                    done.wait(max(0.0, deadline - time.monotonic()))

    def _pace(self) -> None:
        """Before each grammar build (`Grammars.pace`, in the thread that compiles): while the
        engine has work, wait until a step has finished since the last build was let go (up to
        PACE_TIMEOUT_S). llguidance holds the GIL through a build, so builds back to back kept
        the step thread from it for chains of them; paced, each step waits for one at most."""
        with self._stepped:
            seen = self._paced_at
            if self.engine.has_work() and not self._stopping:
                self._stepped.wait_for(lambda: self._steps > seen, timeout=PACE_TIMEOUT_S)
            self._paced_at = self._steps

    def _deliver(self, outputs: list[RequestOutput]) -> list[threading.Event]:
        """Hand the outputs over, one wake-up per event loop; returns an event per loop, set
        once that loop has run what the hand-over woke."""
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Outputs, RequestOutput]]] = {}
        for out in outputs:
            listener = self._queues.get(out.request_id)
            if listener is None or self._sunk(listener, out):
                continue
            if (ready := listener.take(out)) is not None:
                listener.handed += 1
                batches.setdefault(listener.loop, []).append((listener.queue, ready))
        handed = []
        for loop, items in batches.items():
            done = threading.Event()
            # RuntimeError: that caller's event loop is closed, nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(hand_over, items, done)
                handed.append(done)
        return handed

    def _sunk(self, listener: Listener, out: RequestOutput) -> bool:
        """Whether the listener's sink took the output (only while the loop is idle for it, and
        only when the loop's work would wait for a core anyway: see the module docstring)."""
        idle = listener.handed == listener.taken
        if not self._yield_cores or listener.sink is None or out.finished or not idle:
            return False
        try:
            return listener.sink(out)
        except Exception as exc:  # its consumer is gone (a closed socket) or broken
            if not isinstance(exc, OSError):
                logger.exception("the sink of request %s failed", out.request_id)
            listener.sink = None
            self._post(Abort(out.request_id), even_when_stopping=True)
            return True

    async def shutdown(self, timeout: float = 30.0, grace: float = 5.0) -> bool:
        """Stop accepting requests and let those in flight finish for up to `timeout` seconds;
        then abort what is left (each gets a final error output) and wait up to `grace` more
        seconds for the step thread. True iff the thread has stopped."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            left = self.num_active
            logger.warning("%d request(s) still running after %.0f s: aborting them", left, timeout)
            self.abort_all(f"the server shut down before this request finished ({timeout:.0f} s)")
            await asyncio.to_thread(self._thread.join, grace)
        return not self._thread.is_alive()
