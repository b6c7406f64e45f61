"""Port of SGLang's test/srt/test_skip_tokenizer_init.py (class TestSkipTokenizerInit): /generate
on input_ids with --skip-tokenizer-init, answers carrying output_ids, and --stream-output
chunks that concatenate to the non-streamed output.

Upstream starts one server with both --skip-tokenizer-init and --stream-output; here the
session's flag servers (the flag_servers plugin, shared with test_skip_tokenizer_init.py) are
used: "skip" (--skip-tokenizer-init, no tokenizer anywhere) for the decode cases and "stream"
(--stream-output) for the streamed-concatenation case, on input_ids as upstream. Input ids come
from SmolLM2's tokenizer, read here in the test process (upstream: AutoTokenizer of its model).
Scaled: 16 new tokens (upstream 32); the EOS case uses a prompt SmolLM2 answers briefly with 64
new tokens (upstream: "The capital of France is" with 256).

Not ported: TestSkipTokenizerInitVLM (vision models are not served here).
"""

from __future__ import annotations

import pytest
import requests
from flag_helpers import CHAT_SHORT, post_ok, stream
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

pytestmark = pytest.mark.e2e

pytest_plugins = ["flag_servers"]

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    return get_tokenizer(gguf_path, False)


@pytest.fixture(scope="module")
def skip(flag_servers):
    return flag_servers["skip"]


def _input_ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text)["input_ids"]


def _run_decode(server, tokenizer, prompt_text=PROMPT, max_new_tokens=16, return_logprob=False, top_logprobs_num=0,
                n=1) -> None:
    input_ids = _input_ids(tokenizer, prompt_text)
    ret = post_ok(server, "/generate", {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0 if n == 1 else 0.5, "max_new_tokens": max_new_tokens, "n": n,
                            "stop_token_ids": [tokenizer.eos_token_id]},
        "stream": False,
        "return_logprob": return_logprob,
        "top_logprobs_num": top_logprobs_num,
        "logprob_start_len": 0,
    })

    def check(item: dict) -> None:
        finish = item["meta_info"]["finish_reason"]
        if finish["type"] == "stop":
            assert finish["matched"] == tokenizer.eos_token_id
        elif finish["type"] == "length":
            assert len(item["output_ids"]) == item["meta_info"]["completion_tokens"] == max_new_tokens
            assert item["meta_info"]["prompt_tokens"] == len(input_ids)
            if return_logprob:
                assert len(item["meta_info"]["input_token_logprobs"]) == len(input_ids)
                assert len(item["meta_info"]["output_token_logprobs"]) == max_new_tokens
        else:
            raise AssertionError(f"unexpected finish_reason {finish}")

    if n == 1:
        check(ret)
    else:
        assert len(ret) == n
        for item in ret:
            check(item)


def test_simple_decode(skip, tokenizer) -> None:
    _run_decode(skip, tokenizer)


def test_parallel_sample(skip, tokenizer) -> None:
    _run_decode(skip, tokenizer, n=3)


@pytest.mark.parametrize("top_logprobs_num", [0, 3])
def test_logprob(skip, tokenizer, top_logprobs_num) -> None:
    _run_decode(skip, tokenizer, return_logprob=True, top_logprobs_num=top_logprobs_num)


def test_eos_behavior(skip, tokenizer) -> None:
    _run_decode(skip, tokenizer, prompt_text=CHAT_SHORT, max_new_tokens=64)


def test_simple_decode_stream(flag_servers, tokenizer) -> None:
    """With --stream-output each chunk carries only the new output_ids: their concatenation is
    the non-streamed output."""
    server = flag_servers["stream"]
    body = {
        "input_ids": _input_ids(tokenizer, PROMPT),
        "sampling_params": {"temperature": 0, "max_new_tokens": 16, "n": 1, "stop_token_ids": [tokenizer.eos_token_id]},
        "return_logprob": False,
        "top_logprobs_num": 0,
        "logprob_start_len": 0,
    }
    requests.post(server.url + "/flush_cache", timeout=60)
    output_ids = post_ok(server, "/generate", body)["output_ids"]
    requests.post(server.url + "/flush_cache", timeout=60)
    streamed: list[int] = []
    for chunk in stream(server, "/generate", body):
        streamed += chunk["output_ids"]
    assert streamed == output_ids
