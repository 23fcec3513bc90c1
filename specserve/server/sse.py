"""Server-sent events: framing and a response that always cleans up after its stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

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


class EventStream(StreamingResponse):
    """An SSE response whose generator is closed and whose `on_close` runs however the response
    ends: normally, on a client disconnect (Starlette cancels the sender), or on an error.
    Closing the generator aborts the engine request, which frees its KV blocks."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(events, media_type="text/event-stream", headers=SSE_HEADERS)
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                aclose = getattr(self._events, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                self._on_close()
