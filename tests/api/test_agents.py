"""The OpenAI Agents SDK (`openai-agents`) runs an agent against the server's Responses API.

The demo model has random weights, so left alone it would write noise until its token limit
(a response the SDK counts as failed). The agent is made to call its tool on the first turn
(`tool_choice="required"`, which the SDK resets to "auto" after the call, as it does for every
agent) and to answer in a structured `output_type`; both are enums and booleans, so constrained
decoding makes the call valid and ends the answer by itself.
"""

from __future__ import annotations

from typing import Literal

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from pydantic import BaseModel
from sqlalchemy import Engine

from tests.api.test_responses import billed

pytestmark = pytest.mark.anyio


class Forecast(BaseModel):
    sky: Literal["sunny", "cloudy", "rain"]
    warm: bool


async def test_an_agent_with_a_function_tool_finishes_within_its_turns_billed_exactly(
    server, api_key: str, engine: Engine
) -> None:
    asked: list[str] = []

    @function_tool
    def get_weather(city: Literal["Paris", "Berlin", "Oslo"]) -> str:
        """The forecast for a city."""
        asked.append(city)
        return f"18 C and sunny in {city}"

    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key=api_key, max_retries=0
    ) as client:
        agent = Agent(
            name="forecaster",
            instructions="Answer with the forecast.",
            tools=[get_weather],
            output_type=Forecast,
            model=OpenAIResponsesModel(model="demo", openai_client=client),
            model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False),
        )
        result = await Runner.run(
            agent,
            "What is the weather in Paris?",
            max_turns=4,
            run_config=RunConfig(tracing_disabled=True),  # nothing leaves the machine
        )

    assert len(asked) == 1 and asked[0] in ("Paris", "Berlin", "Oslo")
    assert isinstance(result.final_output, Forecast)
    usage = result.context_wrapper.usage
    assert usage.requests == 2  # the call, then the answer after the tool's result
    assert billed(engine, api_key) == (2, usage.total_tokens)
