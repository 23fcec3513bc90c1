"""POST /v1/responses through the unchanged openai SDK against the embedded SmolLM2 (speculation
on): a Responses request replies as the chat completion it translates to (greedy, the same
text), tools come back as function_call items, json_schema formats parse, streams carry the
Responses events in order, previous_response_id continues a stored conversation, and bad input
is a 4xx naming the field. Raw replies are parsed with the SDK's own types, strictly."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import openai
import pytest
from openai.types.responses import Response
from pydantic import BaseModel

from tests import http
from tests.server.conftest import Server

pytestmark = pytest.mark.integration

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
QUESTION = "List the days of the week, separated by commas."
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME = {**WEATHER, "name": "get_time", "description": "The local time in a city."}


@pytest.fixture(scope="module")
def client(smol_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def respond(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs.setdefault("max_output_tokens", 24)
    return client.responses.create(model=MODEL, temperature=0, **kwargs)


def chat(client: openai.OpenAI, messages: list[Any], **kwargs: Any) -> str | None:
    kwargs.setdefault("max_tokens", 24)
    reply = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, **kwargs)
    return reply.choices[0].message.content


def raw(server: Server, body: dict[str, Any], key: str | None = None) -> Any:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return http.post(server.url + "/v1/responses", json=body, headers=headers, timeout=120)


def test_a_string_is_a_user_message(client: openai.OpenAI, smol_server: Server) -> None:
    reply = respond(client, input=QUESTION)
    assert reply.object == "response" and reply.status in ("completed", "incomplete")
    assert reply.output_text == chat(client, [{"role": "user", "content": QUESTION}])
    usage = reply.usage
    assert (
        usage.output_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens
    )
    # the reply as sent, through the SDK's own type with every field checked
    body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 4, "temperature": 0}
    parsed = Response.model_validate(raw(smol_server, body).json(), strict=False)
    assert parsed.status == "incomplete" and parsed.incomplete_details is not None
    assert parsed.incomplete_details.reason == "max_output_tokens"


def test_items_and_instructions_are_the_chat_messages(client: openai.OpenAI) -> None:
    items: list[Any] = [
        {"role": "developer", "content": "Answer in French."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi!"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Bonjour !"}]},
        {"role": "user", "content": QUESTION},
    ]
    reply = respond(client, input=items, instructions="You are terse.")
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Bonjour !"},
        {"role": "user", "content": QUESTION},
    ]
    assert reply.output_text and reply.output_text == chat(client, messages)


def test_a_function_tool_returns_a_function_call_item(client: openai.OpenAI) -> None:
    ask = "What is the weather in Oslo right now?"
    reply = respond(
        client, input=ask, tools=[WEATHER, TIME], tool_choice="required", max_output_tokens=60
    )
    [call] = reply.output
    assert call.type == "function_call" and call.status == "completed"
    assert call.name in ("get_weather", "get_time") and call.call_id.startswith("call_")
    assert set(json.loads(call.arguments)) == {"city"}
    named = respond(
        client,
        input=ask,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_time"},
        max_output_tokens=60,
    )
    assert [(c.type, c.name) for c in named.output] == [("function_call", "get_time")]
    # the call and its output sent back as items: the chat conversation with them
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "4 C, rain"}
    sent_back = [{"role": "user", "content": ask}, call.model_dump(exclude_none=True), result]
    after = respond(client, input=sent_back, tools=[WEATHER], tool_choice="none")
    assert [item.type for item in after.output] == ["message"]
    tool_call = {
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    messages = [
        {"role": "user", "content": ask},
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "4 C, rain"},
    ]
    chat_tools = [
        {
            "type": "function",
            "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
        }
    ]
    assert after.output_text == chat(client, messages, tools=chat_tools, tool_choice="none")


class City(BaseModel):
    name: str
    country: str


def test_a_json_schema_format_parses(client: openai.OpenAI) -> None:
    schema = City.model_json_schema() | {"additionalProperties": False}
    fmt = {"type": "json_schema", "name": "city", "schema": schema, "strict": True}
    reply = respond(
        client, input="Name a city in Norway.", text={"format": fmt}, max_output_tokens=60
    )
    assert reply.status == "completed" and City.model_validate_json(reply.output_text)
    assert reply.text.format.type == "json_schema"
    parsed = client.responses.parse(
        model=MODEL,
        input="Name a city in Norway.",
        text_format=City,
        temperature=0,
        max_output_tokens=60,
    )
    assert isinstance(parsed.output_parsed, City)


def test_a_stream_sends_the_responses_events_in_order(client: openai.OpenAI) -> None:
    whole = respond(client, input="Say hello.", max_output_tokens=120)
    assert whole.status == "completed"
    events = list(respond(client, input="Say hello.", max_output_tokens=120, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 2 and kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-4].text
    last = events[-1].response
    assert last.id == events[0].response.id and last.output_text == text
    assert last.usage.output_tokens == whole.usage.output_tokens
    with client.responses.stream(
        model=MODEL, input="Say hello.", max_output_tokens=120, temperature=0
    ) as stream:
        helped = [e.type for e in stream]
        final = stream.get_final_response()
    assert collapsed(helped) == collapsed(kinds) and final.output_text == text


def collapsed(kinds: Sequence[str]) -> list[str]:
    """Event types with each run of text deltas as one (how many there are depends on how the
    engine's steps grouped the tokens)."""
    return [
        k for i, k in enumerate(kinds) if k != "response.output_text.delta" or kinds[i - 1] != k
    ]


def test_a_streamed_call_sends_its_arguments(client: openai.OpenAI) -> None:
    args = {"input": "Weather in Oslo?", "tools": [WEATHER], "tool_choice": "required"}
    whole = respond(client, max_output_tokens=60, **args)
    events = list(respond(client, max_output_tokens=60, stream=True, **args))
    assert [e.type for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[3].delta == events[4].arguments == whole.output[0].arguments
    assert events[-1].response.output[0].name == "get_weather"


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI) -> None:
    first = respond(client, input="My name is Ada.", instructions="Be kind.")
    second = respond(client, input="What is my name?", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.total_tokens - 10
    # the stored inputs and outputs, not the instructions (OpenAI's rule)
    messages = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    assert second.output_text == chat(client, messages)
    assert client.responses.retrieve(second.id).output_text == second.output_text
    third = respond(client, input="And again?", previous_response_id=second.id, stream=True)
    completed = list(third)[-1].response
    fourth = respond(client, input="Once more.", previous_response_id=completed.id)
    assert fourth.usage.input_tokens > completed.usage.total_tokens - 10


def test_store_false_keeps_nothing_and_delete_forgets(client: openai.OpenAI) -> None:
    unstored = respond(client, input="Hi.", store=False, max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    stored = respond(client, input="Hi.", max_output_tokens=2)
    assert client.responses.retrieve(stored.id).output_text == stored.output_text
    client.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError) as info:
        respond(client, input="Hi.", previous_response_id=stored.id)
    assert "previous_response_id" in str(info.value)


def test_the_sdks_other_fields_are_accepted(smol_server: Server) -> None:
    body = {
        "model": MODEL,
        "input": "Hi.",
        "max_output_tokens": 2,
        "metadata": {"k": "v"},
        "user": "u-1",
        "service_tier": "auto",
        "truncation": "auto",
        "reasoning": {"effort": "low"},
        "parallel_tool_calls": True,
        "include": ["message.output_text.logprobs"],
        "prompt_cache_key": "p",
        "safety_identifier": "s",
        "top_logprobs": 0,
        "seed": 3,
        "speculation_policy": "static",
    }
    r = raw(smol_server, body)
    assert r.status_code == 200, r.text
    assert Response.model_validate(r.json()).metadata == {"k": "v"}


IMAGE = {"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}
NO_NAME = {"type": "json_schema", "schema": {}}
BAD_INPUT = [
    ({"previous_response_id": "resp_nope"}, 404, "previous_response_id: no stored response"),
    ({"input": None}, 400, "input"),
    ({"input": [IMAGE]}, 400, "input[0].content[0]"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c"}]}, 400, "input[0].name"),
    ({"input": [{"role": "robot", "content": "x"}]}, 400, "input[0].role"),
    ({"input": [{"role": ["user"], "content": [{"type": ["text"]}]}]}, 400, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": {}}]}]}, 400, "input[0].content[0]"),
    ({"tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
    ({"tools": [{"type": "function", "name": "bad name!"}]}, 400, "tools[0].name"),
    ({"tool_choice": "required"}, 400, "tool_choice: needs tools"),
    ({"max_output_tokens": 0}, 400, "max_output_tokens"),
    ({"max_output_tokens": 10**6}, 400, "max_output_tokens"),
    ({"text": {"format": NO_NAME}}, 400, "text.format"),
    ({"text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
    ({"background": True}, 400, "background"),
    ({"seed": -1}, 400, "seed"),
]


@pytest.mark.parametrize(("body", "status", "message"), BAD_INPUT)
def test_bad_input_is_a_4xx_naming_the_field(
    smol_server: Server, body: dict[str, Any], status: int, message: str
) -> None:
    r = raw(smol_server, {"input": "x", **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert message in error["message"], error
