"""Tool calling and reasoning on /v1/chat/completions against a scripted engine: the request's
tools reach the chat template, the scripted output comes back as tool_calls / reasoning_content
(whole and streamed, the deltas adding up to the whole), tool_choice required / named sends the
call's JSON-schema grammar, and bad tool requests are 400s."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, AsyncIterator

import openai
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from sglang.srt.entrypoints.openai import register_openai_routes
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.server_args import ServerArgs

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
SCRIPTS = {
    "hermes": 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    "think": "<think>The user wants weather.</think>It is sunny.",
    "plain": "Hello there.",
    "array": '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]',
}


class Tokenizer:
    bos_token = None
    bos_token_id = None

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) % 90 + 5 for c in text]

    def apply_chat_template(self, messages: list[dict], **kwargs: Any) -> str:
        self.calls.append({"messages": messages, **kwargs})
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


class ScriptedEngine:
    """Answers each chat with SCRIPTS[last message's content] (plain for others), three characters per stream item."""

    def __init__(self) -> None:
        self.tokenizer = Tokenizer()
        self.ready = SimpleNamespace(context_len=4096, vocab_size=100, eos_token_ids=[2])
        self.received: list[GenerateReqInput] = []

    def generate_many(self, objs: list[GenerateReqInput], grammar_checked: bool = False) -> AsyncIterator[dict]:
        self.received += objs
        return self._run(objs[0])

    async def _run(self, obj: GenerateReqInput) -> AsyncIterator[dict]:
        script = SCRIPTS.get(self.tokenizer.calls[-1]["messages"][-1]["content"], SCRIPTS["plain"])
        ends = list(range(3, len(script), 3)) + [len(script)] if obj.stream else [len(script)]
        for end in ends:
            finish = {"type": "stop", "matched": 2} if end == len(script) else None
            meta = {"id": obj.rid, "finish_reason": finish, "prompt_tokens": 5, "completion_tokens": end, "cached_tokens": 0}
            yield {"index": 0, "text": script[:end], "output_ids": [7] * end, "meta_info": meta}


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


def make_client(engine: ScriptedEngine, **args: Any) -> TestClient:
    app = FastAPI()
    register_openai_routes(app, engine, ServerArgs(model_path="/m", served_model_name="m", **args))
    return TestClient(app)


def ask(client: TestClient, script: str, **body: Any) -> Any:
    response = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": script}], **body})
    if not body.get("stream"):
        return response
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def gather(chunks: list[dict]) -> dict[str, Any]:
    """The streamed deltas put together into one message."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in chunks:
        choice = chunk["choices"][0]
        delta = choice["delta"]
        assert "reasoning_content" in delta
        content += delta.get("content") or ""
        reasoning += delta["reasoning_content"] or ""
        for call in delta.get("tool_calls") or []:
            if "id" in call:
                assert call["index"] not in calls and call["type"] == "function" and "name" in call["function"]
                calls[call["index"]] = {"id": call["id"], "name": call["function"]["name"], "arguments": ""}
            calls[call["index"]]["arguments"] += call["function"]["arguments"]
        finish = choice["finish_reason"] or finish
    return {"content": content, "reasoning": reasoning, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


def test_auto_tool_calls_whole_and_streamed(engine: ScriptedEngine) -> None:
    client = make_client(engine, tool_call_parser="hermes")
    body = ask(client, "hermes", tools=[WEATHER_TOOL, TIME_TOOL]).json()
    message = body["choices"][0]["message"]
    assert body["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] == "Checking." and message["reasoning_content"] is None
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("function", "get_weather", {"city": "Paris"}), ("function", "get_time", {})
    ]
    assert all(c["id"].startswith("call_") for c in message["tool_calls"])
    assert engine.tokenizer.calls[-1]["tools"] == [WEATHER_TOOL, TIME_TOOL]
    streamed = gather(ask(client, "hermes", tools=[WEATHER_TOOL, TIME_TOOL], stream=True))
    assert streamed["content"] == message["content"] and streamed["finish"] == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == [
        (c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]
    ]


def test_tool_choice_none_and_no_parser_leave_the_text(engine: ScriptedEngine) -> None:
    client = make_client(engine, tool_call_parser="hermes")
    message = ask(client, "hermes", tools=[WEATHER_TOOL], tool_choice="none").json()["choices"][0]["message"]
    assert message["content"] == SCRIPTS["hermes"] and "tool_calls" not in message
    assert "tools" not in engine.tokenizer.calls[-1]  # tool_choice none: the template is not given them
    message = ask(make_client(engine), "hermes", tools=[WEATHER_TOOL]).json()["choices"][0]["message"]
    assert message["content"] == SCRIPTS["hermes"]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_send_the_call_grammar_and_parse_the_array(engine: ScriptedEngine, choice: Any) -> None:
    client = make_client(engine)
    body = ask(client, "array", tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=choice, parallel_tool_calls=False).json()
    schema = json.loads(engine.received[-1].sampling_params["json_schema"])
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    names = [item["properties"]["name"]["enum"][0] for item in schema["items"].get("anyOf", [schema["items"]])]
    assert names == (["get_weather", "get_time"] if choice == "required" else ["get_weather"])
    (call,) = body["choices"][0]["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Oslo"})
    assert body["choices"][0]["message"]["content"] is None
    streamed = gather(ask(client, "array", tools=[WEATHER_TOOL], tool_choice=choice, stream=True))
    assert [(c["name"], c["arguments"]) for c in streamed["calls"]] == [("get_weather", '{"city": "Oslo"}')]


def test_reasoning_content_whole_and_streamed(engine: ScriptedEngine) -> None:
    client = make_client(engine, reasoning_parser="qwen3")
    message = ask(client, "think").json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("The user wants weather.", "It is sunny.")
    for stream_reasoning in (True, False):
        streamed = gather(ask(client, "think", stream=True, stream_reasoning=stream_reasoning))
        assert (streamed["reasoning"], streamed["content"]) == ("The user wants weather.", "It is sunny.")
    message = ask(client, "think", separate_reasoning=False).json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (None, SCRIPTS["think"])
    message = ask(client, "plain").json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == (None, "Hello there.")


def test_chat_template_kwargs_reach_the_template(engine: ScriptedEngine) -> None:
    client = make_client(engine, reasoning_parser="qwen3")
    ask(client, "plain", chat_template_kwargs={"enable_thinking": False})
    assert engine.tokenizer.calls[-1]["enable_thinking"] is False


def test_tool_messages_reach_the_template(engine: ScriptedEngine) -> None:
    client = make_client(engine, tool_call_parser="hermes")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "plain"},
    ]
    response = client.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER_TOOL]})
    assert response.status_code == 200, response.text
    rendered = engine.tokenizer.calls[-1]["messages"]
    assert rendered[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert rendered[1]["content"] == ""
    assert rendered[2] == {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}


@pytest.mark.parametrize(
    "extra, param, words",
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools", "tools[0].function.name: Field required"),
        ({"tools": [{"type": "function"}]}, "tools", "tools[0].function: Field required"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools", "parameters"),
        ({"tool_choice": "required"}, "tool_choice", "Tools cannot be empty if tool choice is set to required."),
        ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
         "Tools cannot be empty if tool choice is set to a specific tool."),
        ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
         "Tool 'f' not found in tools list."),
        ({"tools": [WEATHER_TOOL], "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice",
         "cannot be combined"),
        ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice", "tool_choice"),
        ({"max_completion_tokens": 10**6}, "max_completion_tokens", "max_completion_tokens is too large: 1000000."),
    ],
)
def test_bad_tool_requests_are_400s(engine: ScriptedEngine, extra: dict, param: str, words: str) -> None:
    response = ask(make_client(engine), "plain", **extra)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["param"] == param and words in error["message"], error


def test_a_tool_message_needs_its_call_id(engine: ScriptedEngine) -> None:
    response = make_client(engine).post("/v1/chat/completions", json={"messages": [{"role": "tool", "content": "x"}]})
    assert response.status_code == 400 and "tool_call_id" in response.json()["message"]


def test_openai_client_reads_the_calls(engine: ScriptedEngine) -> None:
    client = openai.OpenAI(base_url="http://t/v1", api_key="x", http_client=make_client(engine, tool_call_parser="hermes"))
    completion = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hermes"}], tools=[WEATHER_TOOL])
    calls = completion.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "think"}], stream=True)
    assert all(hasattr(chunk.choices[0].delta, "reasoning_content") for chunk in stream if chunk.choices)


def test_a_final_assistant_message_is_the_users_unless_continued(engine: ScriptedEngine) -> None:
    client = make_client(engine)
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "plain"}]
    assert client.post("/v1/chat/completions", json={"messages": messages}).status_code == 200
    assert [m["role"] for m in engine.tokenizer.calls[-1]["messages"]] == ["user", "user"]
    assert client.post("/v1/chat/completions", json={"messages": messages, "add_generation_prompt": True}).status_code == 200
    assert [m["role"] for m in engine.tokenizer.calls[-1]["messages"]] == ["user", "assistant"]
    body = {"messages": messages, "continue_final_message": True}
    assert client.post("/v1/chat/completions", json=body).status_code == 200
    assert [m["role"] for m in engine.tokenizer.calls[-1]["messages"]] == ["user"]
    assert engine.received[-1].input_ids == engine.tokenizer.encode("<user>x<assistant>") + engine.tokenizer.encode("plain")


def test_strict_tools_under_auto_get_a_structural_tag_in_the_parser_format(engine: ScriptedEngine) -> None:
    strict = {"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}
    client = make_client(engine, tool_call_parser="hermes")
    body = ask(client, "hermes", tools=[strict, TIME_TOOL]).json()
    tag = json.loads(engine.received[-1].sampling_params["structural_tag"])
    assert tag["triggers"] == ["<tool_call>"]
    (structure,) = tag["structures"]
    assert structure["begin"].startswith('<tool_call>\n{"name": "get_weather"')
    assert structure["schema"] == WEATHER_TOOL["function"]["parameters"]
    assert [c["function"]["name"] for c in body["choices"][0]["message"]["tool_calls"]] == ["get_weather", "get_time"]
    ask(client, "hermes", tools=[strict], regex="a+")  # the request's own grammar wins
    assert "structural_tag" not in engine.received[-1].sampling_params
