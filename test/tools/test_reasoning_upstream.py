"""Ports of SGLang's test/srt/openai_server/features/test_enable_thinking.py (Qwen3 with
`--reasoning-parser qwen3`: chat_template_kwargs enable_thinking true gives reasoning_content,
false gives none; plain and streamed), test_reasoning_content.py (separate_reasoning and
stream_reasoning, with a parser and without one) and test_usage_tokens.py (reasoning_tokens in
/generate's meta_info with require_reasoning, and in chat usage).

Servers: the shared reasoning server (upstream_servers: the tiny random Qwen3-style checkpoint of
reasoning_model, whose template opens `<think>` unless enable_thinking is false, with
`--reasoning-parser qwen3`) stands for upstream's Qwen3 and DeepSeek-R1-Distill servers: with a
template that opens the think section, the qwen3 and deepseek-r1 parsers split the same way.
TestReasoningContentWithoutParser runs on the session's `smollm_server` (no parser).

The model is random, so where upstream relies on the model closing its reasoning, the requests
add thinking_token_budget 4 (the server writes `</think>` after 4 reasoning tokens), ignore_eos
and a seed, and ask 16 new tokens (upstream 100 or the context): reasoning and answer are then
both non-empty whatever the weights.
"""

from __future__ import annotations

import json

import pytest
import requests
from upstream_helpers import TIMEOUT

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]

QUESTION = [{"role": "user", "content": "What is 1+3?"}]
CLOSES_THINKING = {"max_tokens": 16, "thinking_token_budget": 4, "ignore_eos": True, "seed": 7}


def chat(server, body: dict) -> dict:
    response = requests.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def stream_deltas(server, body: dict) -> list[dict]:
    """The deltas of choice 0 of a streamed chat completion."""
    deltas = []
    with requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, stream=True,
                       timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if not line.startswith(b"data:") or line.startswith(b"data: [DONE]"):
                continue
            data = json.loads(line[6:])
            if data.get("choices"):
                deltas.append(data["choices"][0].get("delta", {}))
    return deltas


def joined(deltas: list[dict], key: str) -> str:
    return "".join(d.get(key) or "" for d in deltas)


# ---------------------------------------------------------------- test_enable_thinking.py


def thinking_body(enabled: bool) -> dict:
    body = {"messages": [{"role": "user", "content": "Hello"}], "temperature": 0, "separate_reasoning": True,
            "chat_template_kwargs": {"enable_thinking": enabled}, **CLOSES_THINKING}
    if not enabled:
        body.pop("thinking_token_budget")
    return body


def test_chat_completion_with_reasoning(upstream_reasoning_server) -> None:
    message = chat(upstream_reasoning_server, thinking_body(True))["choices"][0]["message"]
    assert "reasoning_content" in message and message["reasoning_content"] is not None


def test_chat_completion_without_reasoning(upstream_reasoning_server) -> None:
    message = chat(upstream_reasoning_server, thinking_body(False))["choices"][0]["message"]
    assert message.get("reasoning_content") is None


def test_stream_chat_completion_with_reasoning(upstream_reasoning_server) -> None:
    deltas = stream_deltas(upstream_reasoning_server, thinking_body(True))
    assert joined(deltas, "reasoning_content") and joined(deltas, "content")


def test_stream_chat_completion_without_reasoning(upstream_reasoning_server) -> None:
    deltas = stream_deltas(upstream_reasoning_server, thinking_body(False))
    assert not joined(deltas, "reasoning_content") and joined(deltas, "content")


# ---------------------------------------------------------------- test_reasoning_content.py


def reasoning_body(parser: bool, **extra) -> dict:
    return {"messages": QUESTION, **(CLOSES_THINKING if parser else {"max_tokens": 16}), **extra}


@pytest.fixture(params=["api", "without_parser"])
def reasoning_case(request) -> tuple[object, bool]:
    """(server, has a parser): TestReasoningContentAPI and TestReasoningContentWithoutParser."""
    if request.param == "api":
        return request.getfixturevalue("upstream_reasoning_server"), True
    return request.getfixturevalue("smollm_server"), False


def test_streaming_separate_reasoning_false(reasoning_case) -> None:
    server, parser = reasoning_case
    deltas = stream_deltas(server, reasoning_body(parser, separate_reasoning=False))
    assert not joined(deltas, "reasoning_content") and joined(deltas, "content")


def test_streaming_separate_reasoning_true(reasoning_case) -> None:
    server, parser = reasoning_case
    deltas = stream_deltas(server, reasoning_body(parser, separate_reasoning=True))
    assert bool(joined(deltas, "reasoning_content")) == parser
    assert joined(deltas, "content")


def test_streaming_separate_reasoning_true_stream_reasoning_false(reasoning_case) -> None:
    """With stream_reasoning false the reasoning comes whole, in the chunk where the answer starts
    (or its own chunk just before); no reasoning delta comes before it."""
    server, parser = reasoning_case
    deltas = stream_deltas(server, reasoning_body(parser, separate_reasoning=True, stream_reasoning=False))
    reasoning, content, started = "", "", False
    for delta in deltas:
        if delta.get("reasoning_content"):
            reasoning, started = delta["reasoning_content"], True
        if delta.get("content"):
            content += delta["content"]
            if not started:
                reasoning = delta.get("reasoning_content") or ""
            started = True
        if not started:
            assert not delta.get("reasoning_content")
    assert bool(reasoning) == parser
    assert content


def test_nonstreaming_separate_reasoning_false(reasoning_case) -> None:
    server, parser = reasoning_case
    message = chat(server, reasoning_body(parser, separate_reasoning=False))["choices"][0]["message"]
    assert not message.get("reasoning_content") and message["content"]


def test_nonstreaming_separate_reasoning_true(reasoning_case) -> None:
    server, parser = reasoning_case
    message = chat(server, reasoning_body(parser, separate_reasoning=True))["choices"][0]["message"]
    assert bool(message.get("reasoning_content")) == parser
    assert message["content"]


# ---------------------------------------------------------------- test_usage_tokens.py


@pytest.fixture(scope="module")
def think_end_id(upstream_reasoning_server) -> int:
    response = requests.post(upstream_reasoning_server.url + "/tokenize", json={"prompt": "</think>"}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    (token,) = response.json()["tokens"]
    return token


def usage_generate_body(server, **extra) -> dict:
    """The chat prompt as text (upstream applies the template client-side), reasoning counted."""
    prompt = "<|im_start|>user\nWhat is 1+3?<|im_end|>\n<|im_start|>assistant\n<think>\n"
    return {"text": prompt, "require_reasoning": True,
            "sampling_params": {"max_new_tokens": 16, "thinking_token_budget": 4, "ignore_eos": True}, **extra}


def test_generate_api_non_streaming(upstream_reasoning_server, think_end_id) -> None:
    response = requests.post(upstream_reasoning_server.url + "/generate",
                             json=usage_generate_body(upstream_reasoning_server), timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["meta_info"]["reasoning_tokens"] == answer["output_ids"].index(think_end_id) + 1


def test_generate_api_streaming(upstream_reasoning_server, think_end_id) -> None:
    body = usage_generate_body(upstream_reasoning_server, stream=True)
    seen = 0
    with requests.post(upstream_reasoning_server.url + "/generate", json=body, stream=True, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if not line or line == b"data: [DONE]":
                continue
            data = json.loads(line.removeprefix(b"data: "))
            ids = data["output_ids"]
            expected = ids.index(think_end_id) + 1 if think_end_id in ids else len(ids)
            assert data["meta_info"]["reasoning_tokens"] == expected
            seen += 1
    assert seen


def test_chat_api_non_streaming(upstream_reasoning_server) -> None:
    answer = chat(upstream_reasoning_server, {"messages": QUESTION, **CLOSES_THINKING})
    assert answer["usage"]["reasoning_tokens"] != 0


def test_chat_api_streaming(upstream_reasoning_server) -> None:
    body = {"messages": QUESTION, **CLOSES_THINKING, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    usages = []
    with requests.post(upstream_reasoning_server.url + "/v1/chat/completions", json=body, stream=True,
                       timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.text
        for line in response.iter_lines():
            if line.startswith(b"data: {"):
                usage = json.loads(line[6:]).get("usage")
                if usage:
                    usages.append(usage)
    assert usages and all(usage["reasoning_tokens"] != 0 for usage in usages)
