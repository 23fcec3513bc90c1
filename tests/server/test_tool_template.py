"""Tools and reasoning through a model's own chat template (issue 55 items 4 and 5), on tiny
random models whose tokenizers take tools in Hermes/Qwen syntax or think: the tools reach the
template, the grammar holds the reply to `<tool_call>` syntax, calls come back parsed (several
when parallel_tool_calls allows), streamed as OpenAI streams them; `chat_template_kwargs` reach
the template and a think block goes to `reasoning_content`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.server.chat_templates import HERMES_TOOLS, THINKING, model_with_template
from tests.server.conftest import TINY_FLAGS, Server, start_server

FLAGS = [*TINY_FLAGS, "--max-input-tokens", "1024"]
CITY = {"type": "string", "maxLength": 12}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": CITY}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": CITY}, "required": ["zone"]},
    },
}
ASK: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]


def serve(tmp: pytest.TempPathFactory, template: str, name: str) -> Iterator[Server]:
    model = model_with_template(tmp.mktemp(name), template)
    server = start_server(["--model", str(model), *FLAGS], tmp.mktemp("logs") / f"{name}.log")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    for server in serve(tmp_path_factory, HERMES_TOOLS, "hermes"):
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    for server in serve(tmp_path_factory, THINKING, "thinker"):
        yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def create(client: openai.OpenAI, **kwargs: Any) -> Any:
    kwargs = {"temperature": 0, "max_tokens": 200, **kwargs}
    messages = kwargs.pop("messages", ASK)
    return client.chat.completions.create(model="tgi", messages=messages, **kwargs)


def check_call(call: Any) -> dict[str, Any]:
    assert call.type == "function" and call.id.startswith("call_")
    arguments: dict[str, Any] = json.loads(call.function.arguments)
    want = {"get_weather": {"city"}, "get_time": {"zone"}}[call.function.name]
    assert set(arguments) == want  # only the declared keys (strict by default)
    return arguments


def test_required_with_two_ordinary_tools_is_a_call(hermes: openai.OpenAI) -> None:
    """The reported bug, in the model's own syntax: tools without additionalProperties."""
    reply = create(hermes, tools=[WEATHER, TIME], tool_choice="required")
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None and choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)
    alone = create(hermes, max_tokens=1)  # the template listed the tools
    assert reply.usage.prompt_tokens > alone.usage.prompt_tokens + len(json.dumps(TIME)) // 2


def test_one_call_when_parallel_calls_are_off(hermes: openai.OpenAI) -> None:
    for seed in range(4):
        reply = create(
            hermes,
            tools=[WEATHER, TIME],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=1,
            seed=seed,
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        [call] = reply.choices[0].message.tool_calls
        check_call(call)


def test_several_calls_in_one_reply(hermes: openai.OpenAI) -> None:
    """The random model ends after one call about 99 times in 100 (seeded sampling is
    deterministic: seeds below 24 at temperature 2 include some that go on)."""
    counts = []
    for seed in range(24):
        reply = create(
            hermes, tools=[WEATHER, TIME], tool_choice="required", temperature=2, seed=seed
        )
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = reply.choices[0].message.tool_calls
        counts.append(len(calls))
        for call in calls:
            check_call(call)
        if len(calls) > 1:
            break
    assert max(counts) > 1, counts


def test_a_streamed_call_comes_as_openai_sends_it(hermes: openai.OpenAI) -> None:
    whole = create(hermes, tools=[WEATHER, TIME], tool_choice="required")
    stream = create(hermes, tools=[WEATHER, TIME], tool_choice="required", stream=True)
    chunks = [c for c in stream if c.choices]
    deltas = [d for c in chunks for d in c.choices[0].delta.tool_calls or []]
    starts = [d for d in deltas if d.id is not None]
    assert [d.index for d in starts] == list(range(len(starts)))
    for d in starts:  # index, id, type and name first, with empty arguments
        assert d.type == "function" and d.function.name and d.function.arguments == ""
    pieces = [d for d in deltas if d.id is None]
    assert pieces and all(d.function.name is None for d in pieces)
    streamed = ["".join(d.function.arguments for d in pieces if d.index == s.index) for s in starts]
    want = whole.choices[0].message.tool_calls
    assert [(s.function.name, a) for s, a in zip(starts, streamed, strict=True)] == [
        (c.function.name, c.function.arguments) for c in want
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks)


def test_a_conversation_sends_calls_back_to_the_template(hermes: openai.OpenAI) -> None:
    first = create(hermes, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "4 C"},
    ]
    reply = create(hermes, messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert reply.choices[0].message.tool_calls is None
    alone = create(hermes, tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert reply.usage.prompt_tokens > alone.usage.prompt_tokens + len(call.function.arguments)


def test_the_think_block_is_reasoning_content(thinker: openai.OpenAI) -> None:
    """The template opens `<think>`: the reply (cut short inside the block) is all reasoning,
    whole and streamed; with enable_thinking false the template closes it: all content."""
    reply = create(thinker, max_tokens=12)
    message = reply.choices[0].message
    reasoning = message.model_extra["reasoning_content"]
    assert reasoning and not message.content
    stream = create(thinker, max_tokens=12, stream=True)
    deltas = [c.choices[0].delta for c in stream if c.choices]
    assert "".join(d.model_extra.get("reasoning_content") or "" for d in deltas) == reasoning
    assert not any(d.content for d in deltas)
    off = create(
        thinker, max_tokens=12, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    message = off.choices[0].message
    assert message.content and message.model_extra.get("reasoning_content") is None
    assert off.usage.prompt_tokens > reply.usage.prompt_tokens


def test_template_kwargs_the_server_sets_are_refused(thinker: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
        create(thinker, extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
