"""The OpenAI client's tool-calling flow on the embedded model (`smollm_server`): tools ->
tool_calls (forced by tool_choice required or a named function, whose grammar makes the call parse
and match its schema) -> the tool's answer as a tool message -> a final answer; streamed and not."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

pytestmark = pytest.mark.e2e

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the time in a time zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 10}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(smollm_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=smollm_server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def check_calls(calls: list, allowed: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def streamed_calls(stream) -> tuple[list, str]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        for delta in choice.delta.tool_calls or []:
            if delta.id is not None:
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "arguments": ""}
            calls[delta.index]["arguments"] += delta.function.arguments or ""
        finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
def test_forced_call_then_tool_answer_then_final_answer(client: openai.OpenAI, choice) -> None:
    allowed = {"get_weather", "get_time"} if choice == "required" else {"get_time"}
    first = client.chat.completions.create(
        model="m", messages=QUESTION, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=60
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls", message
    check_calls(message.tool_calls, allowed)
    answers = [
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"result": "sunny, 21 C"})}
        for call in message.tool_calls
    ]
    history = QUESTION + [message.model_dump(exclude_none=True)] + answers
    final = client.chat.completions.create(model="m", messages=history, tools=[WEATHER, TIME], temperature=0, max_tokens=16)
    assert final.choices[0].message.content and not final.choices[0].message.tool_calls


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_forced_call_matches_the_whole_one(client: openai.OpenAI, choice) -> None:
    kwargs = dict(model="m", messages=QUESTION, tools=[WEATHER, TIME], tool_choice=choice, temperature=0, max_tokens=60)
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls
    calls, finish = streamed_calls(client.chat.completions.create(stream=True, **kwargs))
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls] == [(c.function.name, c.function.arguments) for c in whole]
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])


def test_single_call_without_parallel_calls(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="m", messages=QUESTION, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False,
        temperature=0.8, seed=3, max_tokens=60,
    )
    calls = response.choices[0].message.tool_calls
    assert len(calls) == 1
    check_calls(calls, {"get_weather", "get_time"})
