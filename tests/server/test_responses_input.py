"""A Responses request as the chat request it means (server/responses_input.py), and a streamed
reply's events (server/responses_stream.py), each parsed with the openai SDK's own types."""

from __future__ import annotations

from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from specserve.outputs import RequestOutput
from specserve.server.errors import ApiError, invalid
from specserve.server.responses_input import chat_request, input_messages, renamed
from specserve.server.responses_output import Turn
from specserve.server.responses_schemas import ResponsesRequest
from specserve.server.responses_stream import ResponseEvents
from specserve.server.tools import NO_TOOLS, tool_plan

EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
TEXT = {"type": "input_text"}
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}


def test_items_become_chat_messages() -> None:
    items: list[dict[str, Any]] = [
        {"role": "user", "content": [TEXT | {"text": "a"}, TEXT | {"text": "b"}]},
        CALL,
        {**CALL, "call_id": "c2", "name": "g"},
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": [TEXT | {"text": "2"}]},
    ]  # fmt: skip
    assert input_messages(items) == [
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "tool", "tool_call_id": "c2", "content": "2"},
    ]  # fmt: skip
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


def test_the_chat_request_carries_every_field() -> None:
    fmt = {"type": "json_schema", "name": "n", "schema": {"type": "object"}, "strict": True}
    req = ResponsesRequest.model_validate(
        {
            "input": "hi",
            "instructions": "be brief",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": fmt},
            "max_output_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 11,
            "metadata": {"a": "b"},
            "service_tier": "auto",
        }
    )
    chat = chat_request(req, input_messages(req.input))
    assert [(m.role, m.content) for m in chat.messages] == [("system", "be brief"), ("user", "hi")]
    assert chat.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert chat.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert chat.response_format == {
        "type": "json_schema",
        "json_schema": {k: fmt[k] for k in ("name", "schema", "strict")},
    }
    assert (chat.max_tokens, chat.temperature, chat.top_p, chat.seed) == (7, 0.5, 0.9, 11)


def test_chat_errors_name_the_responses_fields() -> None:
    assert (
        renamed(invalid("max_tokens", "must be <= 9")).message == "max_output_tokens: must be <= 9"
    )
    assert renamed(invalid("response_format.json_schema", "x")).param == "text.format"
    assert renamed(invalid("tools[1].function.name", "x")).message == "tools[1].name: x"
    assert renamed(invalid("messages[3].content", "x")).message == "input: x"
    req = ResponsesRequest.model_validate({"input": "x", "seed": -1})
    with pytest.raises(ApiError) as info:
        chat_request(req, input_messages(req.input))
    assert info.value.param == "seed"


def output(text: str, finished: bool = False, reason: Any = None) -> RequestOutput:
    return RequestOutput("r", [1] * len(text), text, finished, reason, 3, 5)


def turn(tools: Any = NO_TOOLS) -> Turn:
    req = ResponsesRequest.model_validate({"input": "hi", "stream": True})
    return Turn("resp_1", 0, "m", req, tools, [{"role": "user", "content": "hi"}])


def test_stream_events_parse_as_the_sdks_types() -> None:
    done: list[Any] = []
    events = ResponseEvents(turn(), done.append)
    sent = events.first() + events(0, output("Hel")) + events(0, output("lo", True, "length"))
    parsed = [EVENT.validate_python(e) for e in sent]
    assert [e.sequence_number for e in parsed] == list(range(len(sent)))
    assert parsed[-1].type == "response.incomplete" and parsed[-1].response.output_text == "Hello"
    assert parsed[-4].text == "Hello" and done[0].status == "incomplete"
    Response.model_validate(done[0].model_dump(mode="json"))


def test_a_streamed_call_is_one_item() -> None:
    plan = tool_plan([{"type": "function", "function": {"name": "f"}}], "required")
    events = ResponseEvents(turn(plan), lambda r: None)
    sent = events(0, output('{"name": "f", ')) + events(0, output('"arguments": {}}', True, "stop"))
    parsed = [EVENT.validate_python(e) for e in sent]
    assert [e.type for e in parsed] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert parsed[-1].response.output[0].name == "f" and parsed[2].arguments == "{}"
