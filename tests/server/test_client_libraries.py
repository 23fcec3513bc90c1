"""Client libraries, called as their own documentation shows them, unchanged against the embedded
SmolLM2 (speculation on): the openai SDK's parse and stream helpers with pydantic function tools,
langchain-openai's `ChatOpenAI` (`invoke`, `bind_tools`, `with_structured_output`), instructor
(`from_openai` in its default TOOLS mode and in JSON_SCHEMA mode, partial streams) and
openai-agents with its chat-completions model (the Responses model: test_responses_agents.py).

The model is tiny: the tests check structure (a call with the right name whose arguments parse, a
parsed pydantic object, an agent run that finishes), not what it says. Greedy where the library
lets the caller say so."""

from __future__ import annotations

import asyncio
from typing import Any

import instructor
import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field

from tests.server.conftest import Server

pytestmark = pytest.mark.integration

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
ASK_WEATHER = "What is the weather in Oslo right now?"
ASK_CAT = "Describe a pet cat: its name and its age."
# Streams draft every step (not as the adaptive policy's measured step times say), so a call's
# header and its first arguments come out of one step, the case that clients got wrong.
STATIC = {"speculation_policy": "static"}


class Report(BaseModel):
    """What an agent reports once it has looked the weather up."""

    city: str = Field(max_length=30)
    weather: str = Field(max_length=60)


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=30)


class Cat(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=30)


@tool
def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"4 C and rain in {city}"


def openai_client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


# ------------------------------------------------------------------------------- openai SDK
def test_openai_parse_with_a_pydantic_function_tool_and_its_result_back(
    smol_server: Server,
) -> None:
    """`chat.completions.parse(tools=[openai.pydantic_function_tool(Model)])`: the call's
    arguments come back parsed into the model; the call and its result go back for an answer."""
    client = openai_client(smol_server)
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK_WEATHER}]
    reply = client.chat.completions.parse(
        model=MODEL, messages=messages, tools=tools, tool_choice="required", temperature=0,
        max_tokens=60,
    )  # fmt: skip
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls or []
    assert call.function.name == "GetWeather"
    assert isinstance(call.function.parsed_arguments, GetWeather)
    messages += [
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call.id, "content": "4 C and rain"},
    ]
    answer = client.chat.completions.parse(
        model=MODEL, messages=messages, tools=tools, temperature=0, max_tokens=40
    )
    assert answer.choices[0].message.content or answer.choices[0].message.tool_calls


def test_openai_stream_helper_parses_a_streamed_call_and_a_streamed_format(
    smol_server: Server,
) -> None:
    """`chat.completions.stream(...)` builds its snapshot from the chunks by each tool-call
    delta's index: a chunk that carried a call's header and its first arguments as two entries
    of one index lost those arguments (the helper's done event then failed to parse them)."""
    client = openai_client(smol_server)
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK_WEATHER}]
    with client.chat.completions.stream(
        model=MODEL, messages=messages, tools=[openai.pydantic_function_tool(GetWeather)],
        tool_choice="required", temperature=0, max_tokens=60, extra_body=STATIC,
    ) as stream:  # fmt: skip
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert [e.name for e in done] == ["GetWeather"]
    assert isinstance(done[0].parsed_arguments, GetWeather)
    cat: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK_CAT}]
    with client.chat.completions.stream(
        model=MODEL, messages=cat, response_format=Cat, temperature=0, max_tokens=60,
        extra_body=STATIC,
    ) as stream:  # fmt: skip
        for _ in stream:
            pass
        parsed = stream.get_final_completion().choices[0].message.parsed
    assert isinstance(parsed, Cat)


# -------------------------------------------------------------------------- langchain-openai
@pytest.fixture(scope="module")
def llm(smol_server: Server) -> ChatOpenAI:
    # as its docs write them: api_key a str (typed SecretStr), max_tokens (alias
    # max_completion_tokens)
    return ChatOpenAI(
        base_url=smol_server.url + "/v1",
        api_key="unused",  # type: ignore[arg-type]
        model=MODEL,
        temperature=0,
        max_tokens=60,  # type: ignore[call-arg]
        max_retries=0,
    )


def test_langchain_invoke(llm: ChatOpenAI) -> None:
    reply = llm.invoke("Say hello.")
    assert isinstance(reply, AIMessage) and isinstance(reply.content, str) and reply.content
    assert reply.response_metadata["finish_reason"] in ("stop", "length")


def test_langchain_bind_tools_calls_and_takes_the_result_back(llm: ChatOpenAI) -> None:
    """`bind_tools([tool], tool_choice=...)`: `.tool_calls` holds the call with its arguments
    as a dict; the tool's ToolMessage goes back with the history for an answer."""
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    messages: list[BaseMessage] = [HumanMessage(ASK_WEATHER)]
    reply = bound.invoke(messages)
    assert not reply.invalid_tool_calls
    [call] = reply.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)
    messages += [reply, get_weather.invoke(call)]
    answer = llm.bind_tools([get_weather]).invoke(messages)
    assert answer.content or answer.tool_calls


def test_langchain_bind_tools_streamed(llm: ChatOpenAI) -> None:
    bound = llm.bind_tools([get_weather], tool_choice="get_weather")
    streamed = list(bound.stream(ASK_WEATHER))
    chunks = [c for c in streamed if isinstance(c, AIMessageChunk)]
    assert len(chunks) == len(streamed) > 2
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert not whole.invalid_tool_calls
    [call] = whole.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"]["city"], str)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(llm: ChatOpenAI, method: str) -> None:
    """The default method (json_schema: `response_format`) and function calling (a forced
    tool); json_mode sends no schema, so what a tiny model writes there is its own affair."""
    structured = llm.with_structured_output(Cat, method=method, include_raw=True)  # type: ignore[arg-type]
    out = structured.invoke(ASK_CAT)
    assert isinstance(out, dict) and out["parsing_error"] is None
    assert isinstance(out["parsed"], Cat)


# ------------------------------------------------------------------------------- instructor
@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_response_model(smol_server: Server, mode: instructor.Mode) -> None:
    """`instructor.from_openai(OpenAI(...))`, its default TOOLS mode (a forced tool call) and
    JSON_SCHEMA (`response_format`); max_retries=0: the first reply must validate."""
    client = instructor.from_openai(openai_client(smol_server), mode=mode)
    cat, completion = client.chat.completions.create_with_completion(
        model=MODEL, response_model=Cat, messages=[{"role": "user", "content": ASK_CAT}],
        temperature=0, max_tokens=60, max_retries=0,
    )  # fmt: skip
    assert isinstance(cat, Cat)
    want = "tool_calls" if mode == instructor.Mode.TOOLS else "stop"
    assert completion.choices[0].finish_reason == want


def test_instructor_partial_stream_and_async(smol_server: Server) -> None:
    """`create_partial` reads each chunk's first tool-call delta: arguments sent beside the
    call's header in the same chunk were lost (a JSON error). Then the async client."""
    client = instructor.from_openai(openai_client(smol_server))
    messages: list[Any] = [{"role": "user", "content": ASK_WEATHER}]
    stream = client.chat.completions.create_partial(
        model=MODEL, response_model=GetWeather, messages=messages, temperature=0, max_tokens=60,
        max_retries=0, extra_body=STATIC,
    )  # fmt: skip
    partials = list(stream)
    assert len(partials) > 1
    assert isinstance(GetWeather.model_validate(partials[-1].model_dump()), GetWeather)
    aclient = instructor.from_openai(
        openai.AsyncOpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)
    )
    ask: list[Any] = [{"role": "user", "content": ASK_CAT}]
    create = aclient.chat.completions.create(
        model=MODEL, response_model=Cat, messages=ask, temperature=0, max_tokens=60, max_retries=0
    )
    cat = asyncio.run(create)
    assert isinstance(cat, Cat)


# ---------------------------------------------------------------------------- openai-agents
def agents_client(server: Server) -> openai.AsyncOpenAI:
    set_tracing_disabled(True)  # no network here: traces would go to OpenAI
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_an_agent_on_chat_completions_calls_its_tool_and_finishes(smol_server: Server) -> None:
    asked: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"4 C and rain in {city}"

    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=agents_client(smol_server))
    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=model,
        tools=[weather],
        # the tool once; then (reset_tool_choice) the model's choice
        model_settings=ModelSettings(temperature=0, max_tokens=60, tool_choice="weather"),
    )

    async def runs() -> tuple[Any, Any]:
        whole = await Runner.run(agent, ASK_WEATHER, max_turns=4)
        streamed = Runner.run_streamed(agent, ASK_WEATHER, max_turns=4)
        async for _ in streamed.stream_events():
            pass
        return whole.final_output, streamed.final_output

    whole, streamed = asyncio.run(runs())
    assert len(asked) == 2 and all(isinstance(city, str) and city for city in asked)
    assert isinstance(whole, str) and whole and whole == streamed


def test_an_agent_on_chat_completions_with_an_output_type(smol_server: Server) -> None:
    model = OpenAIChatCompletionsModel(model=MODEL, openai_client=agents_client(smol_server))
    agent = Agent(
        name="cat",
        instructions="Describe a pet cat.",
        model=model,
        output_type=Cat,
        model_settings=ModelSettings(temperature=0, max_tokens=60),
    )
    result = asyncio.run(Runner.run(agent, ASK_CAT, max_turns=2))
    assert isinstance(result.final_output, Cat)


def test_tools_with_a_structured_output_call_or_answer_in_the_schema(smol_server: Server) -> None:
    """What an agent with tools and an output type sends: tools beside a json_schema
    response_format. Under "auto" the reply is a call or JSON in the schema, never free text;
    once the tool's result is back and tools are off, the answer parses. (An openai-agents run
    of it does not finish on the 135M model, which calls the tool again on every auto turn.)"""
    client = openai_client(smol_server)
    tools = [openai.pydantic_function_tool(GetWeather)]
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": ASK_WEATHER}]
    reply = client.chat.completions.parse(
        model=MODEL, messages=messages, tools=tools, response_format=Report, temperature=0,
        max_tokens=80,
    )  # fmt: skip
    message = reply.choices[0].message
    if message.tool_calls:
        assert reply.choices[0].finish_reason == "tool_calls"
        assert isinstance(message.tool_calls[0].function.parsed_arguments, GetWeather)
    else:
        assert isinstance(message.parsed, Report), message.content
    messages += [{"role": "tool", "tool_call_id": "call_0", "content": "4 C and rain"}]
    answer = client.chat.completions.parse(
        model=MODEL, messages=messages, tools=tools, tool_choice="none", response_format=Report,
        temperature=0, max_tokens=80,
    )  # fmt: skip
    assert isinstance(answer.choices[0].message.parsed, Report)
