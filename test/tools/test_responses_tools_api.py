"""Function tools on /v1/responses against the scripted engine: function_call output items (whole
and streamed as output_item / function_call_arguments events), a forced call's grammar, and the
call's answer passed back as a function_call_output input item."""

from __future__ import annotations

import json

import openai
import pytest

from test_tool_calls_api import SCRIPTS, WEATHER_TOOL, ScriptedEngine, make_client

TOOL = {"type": "function", **WEATHER_TOOL["function"]}


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


def events(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def test_function_calls_whole_and_streamed(engine: ScriptedEngine) -> None:
    client = make_client(engine, tool_call_parser="hermes")
    body = client.post("/v1/responses", json={"input": "hermes", "tools": [TOOL]}).json()
    message, *calls = body["output"]
    assert message["content"][0]["text"] == "Checking."
    assert [(c["type"], c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("function_call", "get_weather", {"city": "Paris"}), ("function_call", "get_time", {})
    ]
    assert all(c["call_id"].startswith("call_") and c["status"] == "completed" for c in calls)
    assert body["tools"] == [TOOL] and body["tool_choice"] == "auto"
    stream = events(client.post("/v1/responses", json={"input": "hermes", "tools": [TOOL], "stream": True}).text)
    added = [e["item"]["name"] for e in stream if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
    assert added == ["get_weather", "get_time"]
    for index in (1, 2):
        pieces = [e["delta"] for e in stream if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == index]
        done = [e["arguments"] for e in stream if e["type"] == "response.function_call_arguments.done" and e["output_index"] == index]
        assert done == ["".join(pieces)] == [calls[index - 1]["arguments"]]
    assert stream[-1]["type"] == "response.completed"
    assert [c["name"] for c in stream[-1]["response"]["output"][1:]] == ["get_weather", "get_time"]


def test_forced_call_and_the_answer_as_input(engine: ScriptedEngine) -> None:
    client = make_client(engine)
    body = client.post(
        "/v1/responses", json={"input": "array", "tools": [TOOL], "tool_choice": {"type": "function", "name": "get_weather"}}
    ).json()
    assert json.loads(engine.received[-1].sampling_params["json_schema"])["type"] == "array"
    (call,) = body["output"][1:]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Oslo"})
    follow = [{"role": "user", "content": "weather?"}, {k: call[k] for k in ("type", "call_id", "name", "arguments")},
              {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"},
              {"role": "user", "content": "plain"}]
    assert client.post("/v1/responses", json={"input": follow, "tools": [TOOL]}).status_code == 200
    rendered = engine.tokenizer.calls[-1]["messages"]
    assert rendered[1]["tool_calls"][0]["id"] == call["call_id"]
    assert rendered[2] == {"role": "tool", "content": "sunny", "tool_call_id": call["call_id"]}


def test_previous_response_keeps_the_calls(engine: ScriptedEngine) -> None:
    client = make_client(engine, tool_call_parser="hermes")
    first = client.post("/v1/responses", json={"input": "hermes", "tools": [TOOL]}).json()
    answers = [{"type": "function_call_output", "call_id": c["call_id"], "output": "ok"} for c in first["output"][1:]]
    second = client.post("/v1/responses", json={"previous_response_id": first["id"], "input": answers + [
        {"role": "user", "content": "plain"}], "tools": [TOOL]})
    assert second.status_code == 200, second.text
    rendered = engine.tokenizer.calls[-1]["messages"]
    assert [m["role"] for m in rendered] == ["user", "assistant", "tool", "tool", "user"]
    assert len(rendered[1]["tool_calls"]) == 2


def test_openai_client_reads_function_calls(engine: ScriptedEngine) -> None:
    client = openai.OpenAI(base_url="http://t/v1", api_key="x", http_client=make_client(engine, tool_call_parser="hermes"))
    response = client.responses.create(model="m", input="hermes", tools=[TOOL])
    assert [item.name for item in response.output if item.type == "function_call"] == ["get_weather", "get_time"]
    with client.responses.stream(model="m", input="hermes", tools=[TOOL]) as stream:
        final = stream.get_final_response()
    assert [item.name for item in final.output if item.type == "function_call"] == ["get_weather", "get_time"]


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"tools": [{"type": "function"}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ],
)
def test_bad_tools_are_400s(engine: ScriptedEngine, extra: dict, param: str) -> None:
    response = make_client(engine).post("/v1/responses", json={"input": "plain", **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param
