"""Ports of SGLang's unit tests test/srt/openai_server/basic/test_serving_completions.py and
test_serving_chat.py, as the behaviour they pin down seen from a client of the real server
(`smollm_server`): upstream drives OpenAIServingCompletion / OpenAIServingChat with a mocked
TokenizerManager; this server's handlers differ inside, so each check is made on the answer.

test_serving_completions: a string prompt and a token-id prompt are the same request; echo
returns each choice's own prompt (string, list of strings, token ids decoded, lists of token
ids), streamed and not. test_serving_chat: stop strings of one request do not leak into the
next (the conversation template's stop list was mutated upstream), and min_tokens / max_tokens /
stop reach the sampling parameters.

Not ported: response_format json_object / json_schema / structural_tag (structured outputs,
another issue), the tool-call cases (kimi_k2 ids, unstreamed tool arguments: function calling,
another issue), _convert_to_internal_request (an internal object with no observable form).
"""

from __future__ import annotations

import re

import pytest
import requests
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from upstream_helpers import served_model, sse_data

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    return get_tokenizer(gguf_path, False)


@pytest.fixture(scope="module")
def model(smollm_server) -> str:
    return served_model(smollm_server)


def _completion(server, model, prompt, **extra) -> dict:
    r = requests.post(server.url + "/v1/completions", json={
        "model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, **extra}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _streamed_texts(server, model, prompt, **extra) -> dict[int, str]:
    texts: dict[int, str] = {}
    for chunk in sse_data(server, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 4,
                                                      "temperature": 0, **extra}):
        for choice in chunk.get("choices", []):
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return texts


# ------------------------------------------------------------------ test_serving_completions


def test_single_string_prompt_and_token_ids_prompt(smollm_server, model, tokenizer) -> None:
    text = _completion(smollm_server, model, "Hello world")
    ids = _completion(smollm_server, model, tokenizer.encode("Hello world"))
    assert text["choices"][0]["text"] == ids["choices"][0]["text"]
    assert text["usage"]["prompt_tokens"] == ids["usage"]["prompt_tokens"] == len(tokenizer.encode("Hello world"))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_echo_with_string_prompt(smollm_server, model, stream) -> None:
    if stream:
        texts = _streamed_texts(smollm_server, model, "Hello", echo=True)
    else:
        texts = {c["index"]: c["text"] for c in _completion(smollm_server, model, "Hello", echo=True)["choices"]}
    assert texts[0].startswith("Hello")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_echo_with_list_of_strings(smollm_server, model, stream) -> None:
    prompts = ["A", "B"]
    if stream:
        texts = _streamed_texts(smollm_server, model, prompts, echo=True, n=1)
    else:
        texts = {c["index"]: c["text"] for c in _completion(smollm_server, model, prompts, echo=True, n=1)["choices"]}
    assert texts[0].startswith("A") and texts[1].startswith("B")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_echo_with_token_ids(smollm_server, model, tokenizer, stream) -> None:
    ids = tokenizer.encode("The capital of France")
    decoded = tokenizer.decode(ids)
    if stream:
        texts = _streamed_texts(smollm_server, model, ids, echo=True)
    else:
        texts = {c["index"]: c["text"] for c in _completion(smollm_server, model, ids, echo=True)["choices"]}
    assert texts[0].startswith(decoded)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_echo_with_multiple_token_ids(smollm_server, model, tokenizer, stream) -> None:
    prompts = [tokenizer.encode("Hello there"), tokenizer.encode("Good morning")]
    if stream:
        texts = _streamed_texts(smollm_server, model, prompts, echo=True, n=1)
    else:
        texts = {c["index"]: c["text"] for c in _completion(smollm_server, model, prompts, echo=True, n=1)["choices"]}
    assert texts[0].startswith("Hello there") and texts[1].startswith("Good morning")


# ------------------------------------------------------------------------ test_serving_chat


def _chat(server, model, **extra) -> dict:
    r = requests.post(server.url + "/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "Tell me about the city of Paris."}],
        "temperature": 0, **extra}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_stop_str_isolation_between_requests(smollm_server, model) -> None:
    baseline = _chat(smollm_server, model, max_tokens=16)["choices"][0]["message"]["content"]
    words = re.findall(r"[A-Za-z]{2,}", baseline)
    assert len(words) >= 2, baseline
    stopped = _chat(smollm_server, model, max_tokens=16, stop=[words[1]])["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["matched_stop"] == words[1]
    again = _chat(smollm_server, model, max_tokens=16)["choices"][0]
    assert again["message"]["content"] == baseline  # the first request's stop string did not stay


def test_sampling_param_build(smollm_server, model) -> None:
    """max_tokens -> max_new_tokens, min_tokens -> min_new_tokens, stop -> stop (upstream checks
    the built dict; here their effect: EOS is held back until min_tokens)."""
    messages = [{"role": "user", "content": "Say only the word yes."}]
    free = _chat(smollm_server, model, messages=messages, max_tokens=150)
    assert free["choices"][0]["finish_reason"] == "stop" and free["usage"]["completion_tokens"] < 5
    held = _chat(smollm_server, model, messages=messages, max_tokens=150, min_tokens=5, stop=["</s>"])
    assert held["usage"]["completion_tokens"] >= 5
    capped = _chat(smollm_server, model, messages=messages, max_tokens=12, min_tokens=5, ignore_eos=True)
    assert capped["usage"]["completion_tokens"] == 12 and capped["choices"][0]["finish_reason"] == "length"
