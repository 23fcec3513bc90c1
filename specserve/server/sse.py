"""Server-sent events: framing and a response that always cleans up after its stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pydantic_core
from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from specserve.server.direct import DirectWriter

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse(payload: BaseModel | dict[str, Any] | str) -> str:
    """One `data:` event. Strings are sent as they are (`[DONE]`)."""
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json()
    elif isinstance(payload, dict):
        data = json.dumps(payload, separators=(",", ":"))
    else:
        data = payload
    return f"data: {data}\n\n"


def json_of(fields: dict[str, Any]) -> str:
    """Plain fields as JSON, serialised as pydantic serialises a model with these fields in this
    order (the same serializer), without building the model."""
    return pydantic_core.to_json(fields).decode()


class TextEvents:
    """The JSON of a model in which only one string changes from event to event (a text delta):
    the model is dumped once with a marker in that place, and each event is that dump with the
    text's JSON where the marker's was; the same bytes as dumping the model with the text, per
    token a string join instead of building, validating and dumping models."""

    MARK = "\x00specserve-text\x00"

    def __init__(self, build: Callable[[str], BaseModel]) -> None:
        dump = build(self.MARK).model_dump_json()
        head, mark, tail = dump.partition(pydantic_core.to_json(self.MARK).decode())
        if not mark or mark in tail:
            raise ValueError("the model must hold the text exactly once")
        self._head, self._tail = head, tail

    def __call__(self, text: str) -> str:
        return self._head + pydantic_core.to_json(text).decode() + self._tail


class EventStream(StreamingResponse):
    """An SSE response whose generator is closed and whose `on_close` runs however the response
    ends: normally, on a client disconnect (Starlette cancels the sender), or on an error.
    Closing the generator aborts the engine request, which frees its KV blocks. `direct`: the
    stream's writer on the engine's thread (`server/direct.py`), armed once the first event is
    out and closed with the response."""

    def __init__(
        self,
        events: AsyncIterator[str],
        on_close: Callable[[], None],
        direct: DirectWriter | None = None,
    ) -> None:
        body = events if direct is None else _arming(events, direct)
        super().__init__(body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._iterators = [body, events] if direct is not None else [events]
        self._on_close = on_close
        self._direct = direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._direct is not None:
                self._direct.close()  # no write from the engine's thread after this
            try:
                for iterator in self._iterators:
                    aclose = getattr(iterator, "aclose", None)
                    if aclose is not None:
                        await aclose()
            finally:
                self._on_close()


async def _arming(events: AsyncIterator[str], direct: DirectWriter) -> AsyncIterator[str]:
    """`events`, arming `direct` each time the response asks for the next (the previous one
    has been sent by then); arming twice does nothing."""
    async for event in events:
        yield event
        direct.arm()
