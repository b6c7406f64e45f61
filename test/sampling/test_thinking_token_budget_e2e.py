"""thinking_token_budget end to end on a tiny random Qwen3-style checkpoint whose tokenizer has
`<think>` / `</think>` special tokens and whose chat template opens `<think>`: the think section
ends within the budget (plus the end marker's one token) and the answer follows, on the native
and the OpenAI chat route, for several budgets in one batch."""

from __future__ import annotations

import concurrent.futures
import os
import sys

import pytest
import requests

from engine_utils import running_server
from fake_scheduler import build_test_tokenizer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmark"))
from random_checkpoint import write_qwen3_checkpoint  # noqa: E402

pytestmark = pytest.mark.e2e

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
TIMEOUT = 600


@pytest.fixture(scope="module")
def qwen3_style(tmp_path_factory):
    from transformers import PreTrainedTokenizerFast

    folder = str(tmp_path_factory.mktemp("tiny-qwen3"))
    build_test_tokenizer(folder)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<think>", "</think>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    write_qwen3_checkpoint(
        folder, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=len(tokenizer), max_position_embeddings=2048,
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    with running_server("--model-path", folder) as server:
        yield server, tokenizer


def test_budgets_end_the_think_section_and_the_answer_follows(qwen3_style):
    server, tokenizer = qwen3_style
    end = tokenizer.convert_tokens_to_ids("</think>")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Why is the sky blue?"}], add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    assert prompt[-2:] == tokenizer.encode("<think>\n", add_special_tokens=False)
    budgets = [0, 3, 12, 40]

    def run(budget: int, seed: int) -> list[int]:
        params = {"temperature": 1.0, "sampling_seed": seed, "max_new_tokens": budget + 12, "ignore_eos": True,
                  "thinking_token_budget": budget}
        response = requests.post(server.url + "/generate", json={"input_ids": prompt, "sampling_params": params}, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        return response.json()["output_ids"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        runs = {(b, s): pool.submit(run, b, s) for b in budgets for s in (1, 2)}
        outputs = {key: future.result() for key, future in runs.items()}
    for (budget, _), out in outputs.items():
        assert end in out, (budget, out)
        # The prompt's "\n" after <think> is the section's first token, as vLLM counts.
        thinking = out.index(end)
        assert thinking <= max(budget - 1, 0), (budget, out)
        assert len(out) > thinking + 1  # the answer follows


def test_chat_route_takes_the_budget(qwen3_style):
    server, _ = qwen3_style
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20, "temperature": 1.0, "seed": 5,
            "ignore_eos": True, "skip_special_tokens": False, "thinking_token_budget": 4}
    response = requests.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["message"]["content"]
    assert "</think>" in text and text.split("</think>", 1)[1], text


def test_max_thinking_tokens_is_the_same_budget(qwen3_style):
    """SGLang's per-request max_thinking_tokens (a top-level /generate field) runs the same
    processor: the same tokens as thinking_token_budget for the same seed, the section closed
    within the budget."""
    server, tokenizer = qwen3_style
    end = tokenizer.convert_tokens_to_ids("</think>")
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Why?"}], add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(text, add_special_tokens=False)
    params = {"temperature": 1.0, "sampling_seed": 9, "max_new_tokens": 16, "ignore_eos": True}

    def run(**fields) -> list[int]:
        response = requests.post(server.url + "/generate", json={"input_ids": prompt, **fields}, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        return response.json()["output_ids"]

    by_field = run(sampling_params=params, max_thinking_tokens=5)
    assert by_field == run(sampling_params={**params, "thinking_token_budget": 5})
    assert end in by_field and by_field.index(end) <= 4
