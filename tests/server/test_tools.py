"""OpenAI function calling through the unchanged openai SDK against the embedded SmolLM2
(speculation on; its template takes no tools: our own format): tool_choice required, a named
function and auto, tools without additionalProperties, streamed calls, a conversation that
sends calls and their results back, and bad tools refused with a 400."""

from __future__ import annotations

import json
from typing import Any, cast

import openai
import pytest

from tests import http
from tests.server.conftest import Server

pytestmark = pytest.mark.integration

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK: list[Any] = [{"role": "user", "content": "What is the weather in Oslo right now?"}]


@pytest.fixture(scope="module")
def client(smol_server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    return client.chat.completions.create(
        model=MODEL, messages=kwargs.pop("messages", ASK), max_tokens=80, temperature=0, **kwargs
    )


def test_required_and_named_choices_return_calls(client: openai.OpenAI) -> None:
    reply = create(client, tools=[WEATHER, TIME], tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")
    assert "city" in json.loads(call.function.arguments)
    named = create(
        client,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "get_time"
    assert set(json.loads(call.function.arguments)) == {"city"}


def test_a_call_keeps_the_tools_key_order(client: openai.OpenAI) -> None:
    zone = {"type": "string", "maxLength": 20}
    params = {
        "type": "object",
        "properties": {"zone": zone, "city": zone},
        "required": ["zone", "city"],
        "additionalProperties": False,
    }
    tool = {"type": "function", "function": {"name": "local_time", "parameters": params}}
    reply = create(client, tools=[tool], tool_choice="required")
    [call] = reply.choices[0].message.tool_calls
    assert list(json.loads(call.function.arguments)) == ["zone", "city"]


def test_auto_is_a_call_or_text_never_half_of_one(client: openai.OpenAI) -> None:
    for question in ("What is the weather in Oslo right now?", "Say hello to me."):
        reply = create(client, messages=[{"role": "user", "content": question}], tools=[WEATHER])
        message = reply.choices[0].message
        if message.tool_calls:
            assert reply.choices[0].finish_reason == "tool_calls"
            assert json.loads(message.tool_calls[0].function.arguments)["city"]
        else:
            assert message.content and not message.content.startswith("{")


def test_required_with_two_ordinary_tools_ends_as_a_call(client: openai.OpenAI) -> None:
    """Issue 55: parameters without additionalProperties, as most clients write them. The model
    kept adding keys until max_tokens (content, finish_reason length); arguments now admit only
    the declared keys, so the call ends when its object closes."""
    ordinary = [
        {
            "type": "function",
            "function": {**cast("dict[str, Any]", t["function"]), "parameters": params(t)},
        }
        for t in (WEATHER, TIME)
    ]
    reply = create(client, tools=ordinary, tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    declared = params(WEATHER if call.function.name == "get_weather" else TIME)["properties"]
    assert set(json.loads(call.function.arguments)) <= set(declared)


def params(tool: dict[str, Any]) -> dict[str, Any]:
    schema = dict(cast("dict[str, Any]", tool["function"])["parameters"])
    del schema["additionalProperties"]
    return schema


def test_a_streamed_call_comes_in_pieces(client: openai.OpenAI) -> None:
    whole = create(client, tools=[WEATHER], tool_choice="required")
    stream = create(client, tools=[WEATHER], tool_choice="required", stream=True)
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = calls[0], calls[1:]
    assert first.index == 0 and first.id and first.function.name == "get_weather"
    assert rest and all(tc.index == 0 and tc.id is None for tc in rest)
    arguments = "".join(tc.function.arguments for tc in calls)
    want = whole.choices[0].message.tool_calls[0].function
    assert (first.function.name, arguments) == (want.name, want.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_a_conversation_sends_calls_and_results_back(client: openai.OpenAI) -> None:
    first = create(client, tools=[WEATHER], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 4}'},
    ]
    reply = create(client, messages=messages, tools=[WEATHER], tool_choice="none")
    assert reply.choices[0].message.content and reply.choices[0].message.tool_calls is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "names no function"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0]"),
        ({"tools": [WEATHER, WEATHER]}, "unique"),
        ({"tool_choice": "required"}, "needs tools"),
    ],
)  # fmt: skip
def test_bad_tools_are_a_400(smol_server: Server, extra: dict[str, Any], message: str) -> None:
    r = http.post(smol_server.url + "/v1/chat/completions", json={"messages": ASK, **extra})
    assert r.status_code == 400, r.text
    assert message in r.text


def test_huggingface_hub_chat_completion_with_tools(smol_server: Server) -> None:
    from huggingface_hub import ChatCompletionInputTool, InferenceClient

    # A plain dict, as huggingface_hub's own chat_completion example passes (its annotation
    # names only its dataclass, whose JSON puts the keys in another order).
    tools = cast("list[ChatCompletionInputTool]", [WEATHER])
    reply = InferenceClient(smol_server.url).chat_completion(
        ASK, tools=tools, tool_choice="required", max_tokens=80, temperature=0
    )
    tool_calls = reply.choices[0].message.tool_calls
    assert tool_calls is not None
    [call] = tool_calls
    assert call.function.name == "get_weather"
    arguments = call.function.arguments
    assert "city" in (arguments if isinstance(arguments, dict) else json.loads(arguments))


def test_a_tool_parameter_pattern_built_to_explode_is_a_400(wide_server: Server) -> None:
    """Issue 54 item 1: under tool_choice "auto" the tools' schemas sit in a Lark grammar, whose
    `%json` schemas reached llguidance without the regex checks json_schema grammars get."""
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"x": {"type": "string", "pattern": "(x{999}){99}"}},
            },
        },
    }
    body = {"messages": ASK, "tools": [tool], "max_tokens": 4}
    r = http.post(wide_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert "unrolls to 98901 positions" in r.json()["error"]["message"]
