"""--reasoning-parser qwen3 end to end on a tiny random Qwen3-style checkpoint whose template opens
`<think>` (or closes it at once with enable_thinking false): thinking_token_budget makes the model
write `</think>`, and the answer comes back split into reasoning_content and content, which put
back together are the text the same seed gives without separate_reasoning; streamed deltas carry
reasoning_content and add up to the non-streamed message."""

from __future__ import annotations

import json

import pytest
import requests

from engine_utils import running_server
from reasoning_model import write_reasoning_model

pytestmark = pytest.mark.e2e

TIMEOUT = 600
BODY = {"messages": [{"role": "user", "content": "Why is the sky blue?"}], "max_tokens": 16, "temperature": 1.0,
        "seed": 7, "ignore_eos": True, "thinking_token_budget": 4}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny-qwen3-reasoning"))
    write_reasoning_model(folder)
    with running_server("--model-path", folder, "--reasoning-parser", "qwen3") as running:
        yield running


def chat(server, **extra) -> dict:
    response = requests.post(server.url + "/v1/chat/completions", json={**BODY, **extra}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]


def test_reasoning_is_split_from_the_answer(server) -> None:
    whole = chat(server, separate_reasoning=False)
    assert whole["reasoning_content"] is None and "</think>" in whole["content"]
    split = chat(server)
    assert split["reasoning_content"] is not None
    assert split["reasoning_content"] + "</think>" + split["content"] == whole["content"]


def test_streamed_deltas_add_up(server) -> None:
    message = chat(server)
    reasoning, content = "", ""
    with requests.post(server.url + "/v1/chat/completions", json={**BODY, "stream": True}, stream=True, timeout=TIMEOUT) as response:
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            delta = json.loads(line[6:])["choices"][0]["delta"]
            assert "reasoning_content" in delta
            reasoning += delta["reasoning_content"] or ""
            content += delta.get("content") or ""
    assert (reasoning, content) == (message["reasoning_content"], message["content"])


def test_enable_thinking_false_leaves_no_reasoning(server) -> None:
    message = chat(server, chat_template_kwargs={"enable_thinking": False}, thinking_token_budget=None)
    assert message["reasoning_content"] is None and message["content"]
