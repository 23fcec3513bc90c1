"""openai-agents, as its documentation shows it, with its Responses model against the embedded
SmolLM2: an agent calls its function tool, reads the result and finishes its run, streamed or
not."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.server.conftest import Server

pytestmark = pytest.mark.integration

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_an_agent_calls_its_tool_and_finishes(smol_server: Server) -> None:
    set_tracing_disabled(True)  # no network here: traces would go to OpenAI
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"4 C and rain in {city}"

    client = openai.AsyncOpenAI(base_url=smol_server.url + "/v1", api_key="unused", max_retries=0)
    model = OpenAIResponsesModel(model=MODEL, openai_client=client)
    settings = ModelSettings(temperature=0, max_tokens=60, tool_choice="get_weather")
    agent = Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        model=model,
        tools=[get_weather],
        model_settings=settings,  # the tool once; then (reset_tool_choice) the model's choice
    )

    async def runs() -> tuple[object, object]:
        whole = await Runner.run(agent, "What is the weather in Oslo?", max_turns=4)
        streamed = Runner.run_streamed(agent, "What is the weather in Oslo?", max_turns=4)
        async for _ in streamed.stream_events():
            pass
        return whole.final_output, streamed.final_output

    whole, streamed = asyncio.run(runs())
    assert asked == ["Oslo", "Oslo"]
    assert isinstance(whole, str) and whole and whole == streamed
