"""Grammar after reasoning end to end: with --reasoning-parser qwen3 on the tiny random Qwen3-style
checkpoint (reasoning_model), a reasoning request thinks freely and only its answer follows the
grammar; the thinking budget (max_thinking_tokens / thinking_token_budget) forces `</think>`, which
opens the grammar. A request that does not reason (require_reasoning false, enable_thinking false)
and any request on a server without a reasoning parser follow the grammar from the first token."""

from __future__ import annotations

import json
import re

import pytest
import requests

from engine_utils import generate_ok, running_server
from reasoning_model import write_reasoning_model

pytestmark = pytest.mark.e2e

TIMEOUT = 600
REGEX = "a[bc]{2}"
PROMPT = "<|im_start|>user\nSay yes or no.<|im_end|>\n<|im_start|>assistant\n<think>\n"
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
          "required": ["answer"], "additionalProperties": False}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("tiny-qwen3-reasoning-grammar"))
    write_reasoning_model(folder)
    with running_server("--model-path", folder, "--reasoning-parser", "qwen3",
                        "--constrained-json-disable-any-whitespace") as running:
        yield running


def regex_generate(server, seed: int, **fields) -> dict:
    params = {"regex": REGEX, "max_new_tokens": 48, "temperature": 1.0, "sampling_seed": seed}
    return generate_ok(server, PROMPT, sampling_params=params, timeout=TIMEOUT, **fields)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_reasoning_is_free_and_the_answer_follows_the_regex(server, seed) -> None:
    answer = regex_generate(server, seed, require_reasoning=True, max_thinking_tokens=4)
    reasoning, marker, rest = answer["text"].partition("</think>")
    assert marker, answer["text"]  # the budget forced the end of the section
    assert len(answer["output_ids"]) <= 4 + 1 + 3 + 1  # budget, marker, answer, stop
    # Decoding puts a space on each side of the added `</think>` token; the grammar allows none.
    assert rest.startswith(" ") and re.fullmatch(REGEX, rest[1:]), answer["text"]
    assert answer["meta_info"]["finish_reason"]["type"] == "stop"  # the grammar terminated
    # The reasoning is unconstrained: the random model writes what the regex would refuse.
    assert not re.fullmatch("[abc]*", reasoning), answer["text"]


def test_without_require_reasoning_the_regex_applies_from_the_first_token(server) -> None:
    for seed in (1, 2):
        answer = regex_generate(server, seed, max_thinking_tokens=4)
        assert re.fullmatch(REGEX, answer["text"]), answer["text"]


def chat(server, **extra) -> dict:
    body = {"messages": [{"role": "user", "content": "Say yes or no."}], "max_tokens": 48, "temperature": 1.0,
            "seed": 5, "response_format": RESPONSE_FORMAT, **extra}
    response = requests.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]


def test_chat_thinks_then_answers_in_the_schema(server) -> None:
    choice = chat(server, thinking_token_budget=4)
    message = choice["message"]
    assert message["reasoning_content"], message
    assert json.loads(message["content"])["answer"] in ("yes", "no")
    assert choice["finish_reason"] == "stop"
    with pytest.raises(json.JSONDecodeError):
        json.loads(message["reasoning_content"])  # free text, not the schema's


def test_chat_without_thinking_follows_the_schema_from_the_first_token(server) -> None:
    message = chat(server, chat_template_kwargs={"enable_thinking": False})["message"]
    assert message["reasoning_content"] is None
    assert json.loads(message["content"])["answer"] in ("yes", "no")


def test_a_server_without_a_reasoning_parser_ignores_require_reasoning_for_the_grammar(smollm_server) -> None:
    params = {"regex": REGEX, "max_new_tokens": 16, "temperature": 1.0, "sampling_seed": 1}
    answer = generate_ok(smollm_server, "Hello", sampling_params=params, require_reasoning=True, timeout=TIMEOUT)
    assert re.fullmatch(REGEX, answer["text"]), answer["text"]
