"""Ports of SGLang's test/srt/openai_server/validation/: test_matched_stop.py (finish_reason and
matched_stop of /v1/completions and /v1/chat/completions), test_openai_server_ignore_eos.py and
test_request_length_validation.py (a 400 for prompts or max_tokens beyond --context-length).

Model-independent rewrites: upstream's stop strings ("\\n") and stop regexes ("and|or",
"[.!?]\\s*$") rely on Llama-3.1-8B writing them within 1,000 tokens; here each stop is taken
from the greedy output itself (so it is certain to be produced), in the same three shapes: a
plain stop string, an alternation regex and a regex anchored at the end of the text. The EOS
case uses SmolLM2's chat format and EOS (<|im_end|>, id 2) instead of Llama 3's (128009).

Not ported: TestRegexPatternMaxLength (unit test of SGLang's internal
sampling_params.get_max_seq_length helper), test_large_max_new_tokens.py (reads SGLang's
"#running-req" log line and its SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION admission knob: a scheduler
feature outside issue 19), test_request_body_validation.py (--max-payload-size is not an
SGLang 0.5.6 flag).
"""

from __future__ import annotations

import re

import openai
import pytest
import requests
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from upstream_helpers import EXTRA_CONTEXT_LEN, openai_client, served_model

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]

MANY_NEW_TOKENS_PROMPT = """
Please write an extremely detailed and vivid fantasy story, set in a world full of intricate magic systems, political intrigue, and complex characters.
Ensure that you thoroughly describe every scene, character's motivations, and the environment. Include long, engaging dialogues and elaborate on the inner thoughts of the characters.
Each section should be as comprehensive as possible to create a rich and immersive experience for the reader.
The story should span multiple events, challenges, and character developments over time. Aim to make the story at least 3,000 words long.
"""
EOS = 2  # <|im_end|>
SMOLLM_CHAT_PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nSay only the word yes.<|im_end|>\n<|im_start|>assistant\n"
)
PROBE_TOKENS = 24


@pytest.fixture(scope="module")
def model(smollm_server) -> str:
    return served_model(smollm_server)


def _completions(server, model, prompt=MANY_NEW_TOKENS_PROMPT, max_tokens=1, **extra) -> dict:
    payload = {"prompt": prompt, "model": model, "temperature": 0, "top_p": 1, "max_tokens": max_tokens, **extra}
    r = requests.post(server.url + "/v1/completions", json=payload, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _chat(server, model, prompt=MANY_NEW_TOKENS_PROMPT, max_tokens=1, **extra) -> dict:
    payload = {
        "model": model,
        "messages": [{"role": "system", "content": "You are a helpful AI assistant"}, {"role": "user", "content": prompt}],
        "temperature": 0, "top_p": 1, "max_tokens": max_tokens, **extra,
    }
    r = requests.post(server.url + "/v1/chat/completions", json=payload, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _text(choice: dict) -> str:
    return choice["text"] if "text" in choice else choice["message"]["content"]


def _a_word_of(text: str) -> str:
    """A word of the greedy output that is not its very start (so some text precedes the stop)."""
    words = re.findall(r"[A-Za-z]{2,}", text)
    assert len(words) >= 2, f"the probe output has too few words to pick a stop from: {text!r}"
    return words[1]


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_finish_stop_str(smollm_server, model, route) -> None:
    call = _completions if route == "completions" else _chat
    stop = _a_word_of(_text(call(smollm_server, model, max_tokens=PROBE_TOKENS)))  # upstream: "\n"
    choice = call(smollm_server, model, max_tokens=PROBE_TOKENS, stop=stop)
    assert choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == stop


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_finish_stop_regex_str(smollm_server, model, route) -> None:
    call = _completions if route == "completions" else _chat
    word = _a_word_of(_text(call(smollm_server, model, max_tokens=PROBE_TOKENS)))
    alternation = rf"{re.escape(word)}|zqxjzqxj"  # upstream: r"and|or"
    choice = call(smollm_server, model, max_tokens=PROBE_TOKENS, stop_regex=alternation)
    assert choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == alternation
    if route == "chat":  # upstream: r"[.!?]\s*$", a pattern anchored at the end of the text so far
        anchored = rf"{re.escape(word)}\s*$"
        choice = call(smollm_server, model, max_tokens=PROBE_TOKENS, stop_regex=anchored)
        assert choice["finish_reason"] == "stop"
        assert choice["matched_stop"] == anchored


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_finish_stop_eos(smollm_server, model, route) -> None:
    if route == "completions":
        choice = _completions(smollm_server, model, prompt=SMOLLM_CHAT_PROMPT, max_tokens=64)
    else:
        choice = _chat(smollm_server, model, prompt="Say only the word yes.", max_tokens=64)
    assert choice["finish_reason"] == "stop"
    assert choice["matched_stop"] == EOS


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_finish_length(smollm_server, model, route) -> None:
    call = _completions if route == "completions" else _chat
    choice = call(smollm_server, model, max_tokens=5)
    assert choice["finish_reason"] == "length"
    assert choice["matched_stop"] is None


def test_ignore_eos(smollm_server, model) -> None:
    """ignore_eos lets the output run past EOS to max_tokens (upstream: 200; here 32)."""
    client = openai_client(smollm_server)
    max_tokens = 32
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Count from 1 to 20."}]
    default = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                             extra_body={"ignore_eos": False})
    ignored = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=max_tokens,
                                             extra_body={"ignore_eos": True})
    default_tokens, ignored_tokens = default.usage.completion_tokens, ignored.usage.completion_tokens
    assert ignored_tokens > default_tokens or ignored_tokens >= max_tokens, (ignored_tokens, default_tokens)
    assert ignored.choices[0].finish_reason == "length"


# ----------------------------------------------- test_request_length_validation (--context-length 1000)


@pytest.fixture(scope="module")
def short_context_client(upstream_extra_server):
    return openai_client(upstream_extra_server)


@pytest.fixture(scope="module")
def short_context_model(upstream_extra_server) -> str:
    return served_model(upstream_extra_server)


def test_input_length_longer_than_context_length(short_context_client, short_context_model) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        short_context_client.chat.completions.create(
            model=short_context_model, messages=[{"role": "user", "content": "hello " * 1200}], temperature=0,
        )
    # Upstream: "... is longer than the model's context length ..."
    assert "context length" in str(err.value).lower(), str(err.value)


def test_input_length_longer_than_maximum_allowed_length(short_context_client, short_context_model, gguf_path) -> None:
    text = "hello " * (EXTRA_CONTEXT_LEN - 1)  # with the chat template, more than the context holds
    tokenizer = get_tokenizer(gguf_path, False)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    assert len(tokenizer.encode(rendered)) >= EXTRA_CONTEXT_LEN
    with pytest.raises(openai.BadRequestError) as err:
        short_context_client.chat.completions.create(
            model=short_context_model, messages=[{"role": "user", "content": text}], temperature=0,
        )
    assert "context length" in str(err.value).lower(), str(err.value)


def test_max_tokens_validation(short_context_client, short_context_model) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        short_context_client.chat.completions.create(
            model=short_context_model, messages=[{"role": "user", "content": "hello "}], temperature=0, max_tokens=1200,
        )
    # Upstream: "Requested token count exceeds the model's maximum context length ..."
    assert "context" in str(err.value).lower(), str(err.value)
