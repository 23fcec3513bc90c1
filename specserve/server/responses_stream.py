"""A streamed Responses reply as the Responses API's events, each with its `sequence_number`.

    response.created, response.in_progress                      (before generation)
    a text reply:  response.output_item.added (message), response.content_part.added,
                   response.output_text.delta ..., response.output_text.done,
                   response.content_part.done, response.output_item.done
    a call:        response.output_item.added (function_call),
                   response.function_call_arguments.delta, ...arguments.done,
                   response.output_item.done
    response.completed (or response.incomplete at the token limit), with the whole response

A reply that may be a call is held back until it finishes, as in chat streams (HeldCalls), so a
call's arguments arrive in one delta. The events travel on the chat path's event stream
(`openai_stream.stream`): `data: <event>` each, `data: [DONE]` last, a failure after the start
as `data: {"error": {...}}` (the openai SDK raises it as an APIError).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from specserve.outputs import RequestOutput
from specserve.server.openai_stream import HeldCalls
from specserve.server.responses_output import Turn, call_item, status_of
from specserve.server.responses_schemas import OutputText, ResponseObject

Event = dict[str, Any]


class ResponseEvents:
    """The events of one streamed response: `first()` before generation, then per engine output
    zero or more (a `ChunkFn` of openai_stream). `on_done` gets the finished response (to store
    it) before its last event is sent."""

    def __init__(self, turn: Turn, on_done: Callable[[ResponseObject], None]) -> None:
        self.turn = turn
        self.on_done = on_done
        self.held = HeldCalls(turn.tools)
        self.seq = 0
        self.text: str | None = None  # the message's text so far; None until its item is added

    def event(self, kind: str, **fields: Any) -> Event:
        out = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return out

    def first(self) -> list[Event]:
        start = self.turn.response("in_progress", []).model_dump(mode="json")
        return [
            self.event("response.created", response=start),
            self.event("response.in_progress", response=start),
        ]

    def __call__(self, i: int, out: RequestOutput) -> list[Event]:
        text, _, call = self.held.take(i, out)
        events: list[Event] = []
        if call is not None:
            item = call_item(call)
            added = item.model_copy(update={"arguments": "", "status": "in_progress"})
            where = {"item_id": item.id, "output_index": 0}
            events += [
                self.event("response.output_item.added", output_index=0, item=_dump(added)),
                self.event("response.function_call_arguments.delta", **where, delta=item.arguments),
                self.event("response.function_call_arguments.done", **where, **_named(item)),
                self.event("response.output_item.done", output_index=0, item=_dump(item)),
            ]
            response = self.turn.response("completed", [item], out)
        elif text:
            events += self._opened()
            events.append(self.event("response.output_text.delta", **self._at(), delta=text))
            self.text = (self.text or "") + text
        if not out.finished:
            return events
        if call is None:
            events += self._opened()
            status = status_of(out)
            message = self.turn.message(self.text or "", status)
            part = _dump(message.content[0])
            events += [
                self.event("response.output_text.done", **self._at(), text=message.content[0].text),
                self.event("response.content_part.done", **self._at(False), part=part),
                self.event("response.output_item.done", output_index=0, item=_dump(message)),
            ]
            response = self.turn.response(status, [message], out)
        self.on_done(response)
        kind = "response.completed" if response.status == "completed" else "response.incomplete"
        events.append(self.event(kind, response=_dump(response)))
        return events

    def _at(self, logprobs: bool = True) -> Event:
        where: Event = {"item_id": self.turn.message_id, "output_index": 0, "content_index": 0}
        return {**where, "logprobs": []} if logprobs else where

    def _opened(self) -> list[Event]:
        """The message's item and text part, where they have not been added yet."""
        if self.text is not None:
            return []
        self.text = ""
        item = _dump(self.turn.message("", "in_progress").model_copy(update={"content": []}))
        part = _dump(OutputText(text=""))
        return [
            self.event("response.output_item.added", output_index=0, item=item),
            self.event("response.content_part.added", **self._at(False), part=part),
        ]


def _dump(model: Any) -> Event:
    dumped: Event = model.model_dump(mode="json")
    return dumped


def _named(item: Any) -> Event:
    return {"name": item.name, "arguments": item.arguments}
