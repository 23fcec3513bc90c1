"""Streamed events written to their socket by the engine's step thread.

On 2 cores with both computing, every token a stream sends through the event loop costs a
hand-over to the loop, its wake-up, the route's async generators and uvicorn's `send`: ~0.3
ms of CPU a token at batch 1 (perf of the loop thread), while the next step waits for it or
shares a core with it. Here the step thread, between two steps, formats the output with the
route's own formatter (so the same bytes as the loop would send), frames it as one HTTP/1.1
chunk and writes it with one non-blocking write(2); the loop is not woken at all.

- `capture(app)` is the app uvicorn runs: for a plain-HTTP request on uvicorn's httptools
  protocol it puts the connection (the loop, the transport, the response cycle behind `send`)
  in the scope's extensions. Elsewhere (TLS, the h11 protocol, a test client, a fleet's
  ingress) there is none and every event goes through the loop.
- `DirectWriter` is a stream's sink (`engine/async_engine.Sink`). `arm()`, on the loop once
  the response's first event has been sent, duplicates the socket's descriptor: the duplicate
  is ours until `close()`, so a write can never reach another connection that reused the
  number. The engine offers the writer an output only while the loop has nothing of that
  request's left to do; the writer also declines while the transport still buffers bytes the
  loop wrote. A short write (the client reads slowly) hands the rest to the loop and the
  stream back to it for good; a failed write (the client is gone) raises, and the engine
  aborts the request. The last output always goes through the loop, which ends the response.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from specserve.outputs import RequestOutput

EXTENSION = "specserve.connection"
# Where uvicorn's httptools protocol keeps a response's state (`chunked_encoding`, ...).
_UVICORN_CYCLE = "uvicorn.protocols.http.httptools_impl"


@dataclass(frozen=True)
class Connection:
    loop: asyncio.AbstractEventLoop
    transport: asyncio.WriteTransport
    cycle: Any  # uvicorn's RequestResponseCycle: chunked_encoding, response_complete
    fd: int


def capture(app: ASGIApp) -> ASGIApp:
    """`app`, with each plain-HTTP request's connection in its scope (see the docstring)."""

    async def captured(scope: Scope, receive: Receive, send: Send) -> None:
        conn = _connection(send) if scope["type"] == "http" else None
        if conn is not None:
            scope = {**scope, "extensions": {**(scope.get("extensions") or {}), EXTENSION: conn}}
        await app(scope, receive, send)

    return captured


def _connection(send: Send) -> Connection | None:
    cycle: Any = getattr(send, "__self__", None)
    if type(cycle).__module__ != _UVICORN_CYCLE or not hasattr(cycle, "chunked_encoding"):
        return None
    transport = cycle.transport
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_extra_info("sslcontext") is not None:
        return None
    return Connection(asyncio.get_running_loop(), transport, cycle, sock.fileno())


class DirectWriter:
    """A stream's events, written by the step thread (see the module docstring).

    `events(out)`: the SSE text of one output, the function the route's generator uses;
    `observe(out)`: what the route's service records per output (its timings, its text)."""

    def __init__(
        self,
        conn: Connection,
        events: Callable[[RequestOutput], str],
        observe: Callable[[RequestOutput], None],
        written: Callable[[], None],
    ) -> None:
        self._conn = conn
        self._events = events
        self._observe = observe
        self._written = written
        self._lock = threading.Lock()  # a write and close() never overlap
        self._fd: int | None = None
        self._done = False  # closed, or given back to the loop

    def arm(self) -> None:
        """On the loop, once the response's first event has been sent (the headers are out)."""
        with self._lock:
            cycle, transport = self._conn.cycle, self._conn.transport
            ready = cycle.chunked_encoding and not cycle.response_complete
            if self._fd is None and not self._done and ready and not transport.is_closing():
                self._fd = os.dup(self._conn.fd)

    def __call__(self, out: RequestOutput) -> bool:
        with self._lock:
            if self._fd is None or self._conn.transport.get_write_buffer_size():
                return False
            self._observe(out)
            data = self._events(out).encode()
            if not data:
                return True
            chunk = b"%x\r\n%b\r\n" % (len(data), data)
            try:
                sent = os.write(self._fd, chunk)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._shut()
                raise
            self._written()
            if sent < len(chunk):
                self._shut()
                self._conn.loop.call_soon_threadsafe(self._write_rest, chunk[sent:])
            return True

    def _write_rest(self, rest: bytes) -> None:
        if not self._conn.transport.is_closing():
            self._conn.transport.write(rest)

    def close(self) -> None:
        """However the response ends; later outputs go through the loop (or nowhere)."""
        with self._lock:
            self._shut()

    def _shut(self) -> None:
        self._done = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def writer(
    request: Request,
    events: Callable[[RequestOutput], str],
    observe: Callable[[RequestOutput], None],
    written: Callable[[], None],
) -> DirectWriter | None:
    """A writer for the request's stream, where `capture` found its connection."""
    conn: Connection | None = (request.scope.get("extensions") or {}).get(EXTENSION)
    return None if conn is None else DirectWriter(conn, events, observe, written)
