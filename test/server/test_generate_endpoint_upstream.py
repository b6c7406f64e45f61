"""Port of SGLang's test/srt/test_srt_endpoint.py (class TestSRTEndpoint): the native /generate
API, logprobs, custom logit processors, logit_bias, the prefix cache's cached_tokens and
/get_server_info, against the real server on the embedded SmolLM2.

Same checks, in this repo's words, scaled to a 135M model on a CPU: fewer new tokens, prompts
within SmolLM2's 8,192-token context (upstream uses up to 50,000-token prompts on a 128k model).
Upstream's print-only cases (simple decode, parallel sample, ...) get shape assertions here.
test_logprob_grammar is ported with the other structured-output tests
(grammar/test_structured_outputs_upstream.py). Not ported: the stateful custom logit processor
cases (skipped upstream as racy), test_get_memory_pool_size (an endpoint SGLang removed).
"""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import pytest
import requests
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from upstream_helpers import EXTRA_CHUNKED_PREFILL, post_ok, sse_data

pytestmark = pytest.mark.e2e

pytest_plugins = ["upstream_servers"]

PROMPT = "The capital of France is"
PARIS = 7042  # " Paris" in SmolLM2's vocabulary (upstream: 60704, " Paris" in Llama 3.2)
RICE = 7341  # " rice"
# Upstream forces token ids 0..31 and 5 of Llama 3 ('!'..'@' and '&'); in SmolLM2 those
# characters are ids 17..48 and 22 (its ids 0..16 are added tokens such as <|im_end|>).
UPSTREAM_TOKENS_0_TO_31 = range(17, 49)
UPSTREAM_TOKEN_5 = 22


def _decode(server, *, n=1, stream=False, batch=False, return_logprob=False, top_logprobs_num=0,
            return_text=False, max_new_tokens=16) -> Any:
    body = {
        "text": [PROMPT] if batch else PROMPT,
        "sampling_params": {"temperature": 0 if n == 1 else 0.5, "max_new_tokens": max_new_tokens, "n": n},
        "return_logprob": return_logprob,
        "top_logprobs_num": top_logprobs_num,
        "return_text_in_logprobs": return_text,
        "logprob_start_len": 0,
    }
    if stream:
        return sse_data(server, "/generate", body)
    return post_ok(server, "/generate", body)


def _check_one(result: dict, max_new_tokens: int = 16) -> None:
    assert isinstance(result["text"], str)
    meta = result["meta_info"]
    assert meta["completion_tokens"] == len(result["output_ids"]) <= max_new_tokens
    assert meta["finish_reason"]["type"] in ("stop", "length")


def test_simple_decode(smollm_server) -> None:
    _check_one(_decode(smollm_server))


def test_simple_decode_batch(smollm_server) -> None:
    out = _decode(smollm_server, batch=True)
    assert isinstance(out, list) and len(out) == 1
    _check_one(out[0])
    assert out[0]["output_ids"] == _decode(smollm_server)["output_ids"]


def test_parallel_sample(smollm_server) -> None:
    out = _decode(smollm_server, n=3)
    assert isinstance(out, list) and len(out) == 3
    for result in out:
        _check_one(result)


def test_parallel_sample_stream(smollm_server) -> None:
    chunks = _decode(smollm_server, n=3, stream=True)
    assert chunks
    assert {c["index"] for c in chunks} == {0, 1, 2}
    finished = [c for c in chunks if c["meta_info"]["finish_reason"] is not None]
    assert sorted(c["index"] for c in finished) == [0, 1, 2]


def test_logprob(smollm_server) -> None:
    out = _decode(smollm_server, return_logprob=True, top_logprobs_num=5, return_text=True)
    meta = out["meta_info"]
    assert len(meta["input_token_logprobs"]) == meta["prompt_tokens"]
    assert meta["input_token_logprobs"][0][0] is None  # the first prompt token has no logprob
    assert len(meta["output_token_logprobs"]) == meta["completion_tokens"]
    assert len(meta["output_top_logprobs"]) == meta["completion_tokens"]
    for logprob, token_id, text in meta["output_token_logprobs"]:
        assert logprob <= 0 and isinstance(token_id, int) and isinstance(text, str)
    assert all(len(top) == 5 for top in meta["output_top_logprobs"])


def test_logprob_start_len(smollm_server) -> None:
    logprob_start_len, new_tokens = 4, 4
    prompts = ["I have a very good idea on", "Today is a sunndy day and"]
    out = post_ok(smollm_server, "/generate", {
        "text": prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens},
        "return_logprob": True,
        "top_logprobs_num": 5,
        "return_text_in_logprobs": True,
        "logprob_start_len": logprob_start_len,
    })
    for prompt, res in zip(prompts, out):
        meta = res["meta_info"]
        assert meta["prompt_tokens"] == logprob_start_len + len(meta["input_token_logprobs"])
        assert prompt.endswith("".join(x[-1] for x in meta["input_token_logprobs"]))
        assert meta["completion_tokens"] == new_tokens
        assert len(meta["output_token_logprobs"]) == new_tokens
        assert res["text"] == "".join(x[-1] for x in meta["output_token_logprobs"])


def test_logprob_with_chunked_prefill(upstream_extra_server) -> None:
    """A prompt many times --chunked-prefill-size long, asking for output logprobs (upstream:
    an 80k-token prompt; here 14 chunks of 64 tokens on the server with --chunked-prefill-size 64)."""
    new_tokens = 4
    prompt = "I have a very good idea on this. " * 100
    res = post_ok(upstream_extra_server, "/generate", {
        "text": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": new_tokens},
        "return_logprob": True,
        "logprob_start_len": -1,
        "top_logprobs_num": 5,
    })
    meta = res["meta_info"]
    assert meta["prompt_tokens"] > 10 * EXTRA_CHUNKED_PREFILL
    assert meta["completion_tokens"] == new_tokens
    assert len(meta["output_token_logprobs"]) == new_tokens
    assert len(meta["output_top_logprobs"]) == new_tokens
    for i in range(new_tokens):  # greedy: the sampled token is the top-1
        assert meta["output_token_logprobs"][i] == meta["output_top_logprobs"][i][0]
        assert len(meta["output_top_logprobs"][i]) == 5


def test_logprob_match(smollm_server) -> None:
    """The logprobs of sampled tokens equal those a prefill of prompt + output computes
    (upstream: 512 new tokens; here 32)."""

    def run(prompt, max_new_tokens):
        key = "text" if isinstance(prompt, str) else "input_ids"
        return post_ok(smollm_server, "/generate", {
            key: prompt,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
            "return_logprob": True,
            "return_text_in_logprobs": True,
            "logprob_start_len": 0,
        })

    gen = run("I have a very good idea on how to", 32)
    meta = gen["meta_info"]
    output_logprobs = [x[0] for x in meta["output_token_logprobs"]]
    new_prompt = [x[1] for x in meta["input_token_logprobs"]] + [x[1] for x in meta["output_token_logprobs"]]
    score = run(new_prompt, 0)
    rescored = [x[0] for x in score["meta_info"]["input_token_logprobs"][meta["prompt_tokens"]:]]
    assert len(rescored) == len(output_logprobs) == 32
    assert max(abs(a - b) for a, b in zip(output_logprobs, rescored)) < 0.35


def _logprob_check(server, case: tuple) -> None:
    """Upstream's run_logprob_check: counts of prompt/output logprobs for a (prompt length,
    output length, logprob_start_len, return_logprob, top_logprobs_num) case."""
    input_len, output_len, temperature, logprob_start_len, return_logprob, top_logprobs_num = case
    res = post_ok(server, "/generate", {
        "input_ids": list(range(input_len)),
        "sampling_params": {"temperature": temperature, "max_new_tokens": output_len, "ignore_eos": True},
        "return_logprob": return_logprob,
        "logprob_start_len": logprob_start_len,
        "top_logprobs_num": top_logprobs_num,
    })
    meta = res["meta_info"]
    assert meta["prompt_tokens"] == input_len and meta["completion_tokens"] == output_len
    if not return_logprob:
        return
    assert len(meta["input_token_logprobs"]) + logprob_start_len == input_len
    assert len(meta["output_token_logprobs"]) == output_len
    if not top_logprobs_num:
        return
    assert len(meta["input_top_logprobs"]) + logprob_start_len == input_len
    assert len(meta["output_top_logprobs"]) == output_len
    for i in range(output_len):
        top = meta["output_top_logprobs"][i]
        assert len(top) == top_logprobs_num
        if temperature == 0:  # the sampled token is the top-1, or tied with it
            assert meta["output_token_logprobs"][i] in [t for t in top if t[0] == top[0][0]]


def test_logprob_mixed(smollm_server) -> None:
    """Many concurrent requests mixing prompt lengths, logprob_start_len, return_logprob and
    top_logprobs_num (upstream: prompts of 1k-50k tokens; here 48 and 160)."""
    cases = [
        (input_len, output_len, 0, start, return_logprob, top)
        for input_len in (48, 160)
        for output_len in (4, 8)
        for start in (0, 16, 96)
        for return_logprob in (True, False)
        for top in (0, 5)
        if start < input_len
    ]
    random.Random(0).shuffle(cases)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda case: _logprob_check(smollm_server, case), cases))


FORCE_TOKEN_SOURCE = """
class DeterministicLogitProcessor(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list):
        assert logits.shape[0] == len(custom_param_list)
        for i, params in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits
"""


def _force_token_processor() -> type:
    """Upstream's DeterministicLogitProcessor: every row samples its custom_params token_id.
    Upstream runs its file as __main__, so dill ships the class by value; under pytest a class of
    this module would be pickled as a reference to a module the server cannot import, so it is
    built in a namespace named __main__ (as engine_utils.processor_shipped_by_value does)."""
    namespace = {"CustomLogitProcessor": CustomLogitProcessor, "__name__": "__main__"}
    exec(FORCE_TOKEN_SOURCE, namespace)  # noqa: S102 - test-only code written above
    return namespace["DeterministicLogitProcessor"]


def _run_custom_logit_processor(server, target_token_id: Optional[int]) -> None:
    body: dict[str, Any] = {
        "text": "Question: Is Paris the Capital of France? Answer:",
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 8},
        "return_logprob": True,
    }
    if target_token_id is not None:
        body["custom_logit_processor"] = _force_token_processor().to_str()
        body["sampling_params"]["custom_params"] = {"token_id": target_token_id}
    res = post_ok(server, "/generate", body)
    sampled = [x[1] for x in res["meta_info"]["output_token_logprobs"]]
    if target_token_id is not None:
        assert sampled and all(x == target_token_id for x in sampled), (target_token_id, sampled)


def test_custom_logit_processor(smollm_server) -> None:
    _run_custom_logit_processor(smollm_server, UPSTREAM_TOKEN_5)


def test_custom_logit_processor_batch_mixed(smollm_server) -> None:
    targets = list(UPSTREAM_TOKENS_0_TO_31) + [None] * 16
    random.Random(0).shuffle(targets)
    with ThreadPoolExecutor(len(targets)) as pool:
        list(pool.map(lambda t: _run_custom_logit_processor(smollm_server, t), targets))


def _flush(server) -> int:
    return requests.post(server.url + "/flush_cache", timeout=60).status_code


def test_cache_tokens(smollm_server) -> None:
    """meta_info.cached_tokens counts the prompt tokens the prefix cache served (upstream:
    prompts of 100 / 10,000 / 1,000 / 11,000 ids; here 50 / 600 / 300 / 700)."""
    from flag_helpers import wait_until

    wait_until(lambda: _flush(smollm_server) == 200, what="an idle server to flush")  # upstream: sleep(1)
    assert _flush(smollm_server) == 200

    def cached(n: int) -> int:
        res = post_ok(smollm_server, "/generate", {"input_ids": list(range(n)), "sampling_params": {"max_new_tokens": 1}})
        return res["meta_info"]["cached_tokens"]

    assert cached(50) == 0
    assert cached(600) == 50
    assert cached(600) == 599
    assert cached(300) == 299
    assert cached(700) == 600


def test_get_server_info(smollm_server) -> None:
    info = requests.get(smollm_server.url + "/get_server_info", timeout=60).json()
    assert info["max_total_num_tokens"] == info["scheduler_info"]["max_total_num_tokens"] > 0
    assert isinstance(info["version"], str) and info["version"]


def test_logit_bias(smollm_server) -> None:
    res = post_ok(smollm_server, "/generate", {
        "text": PROMPT,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 4, "logit_bias": {str(PARIS): 100.0}},
        "return_logprob": True,
    })
    sampled = [x[1] for x in res["meta_info"]["output_token_logprobs"]]
    assert sampled and all(x == PARIS for x in sampled), sampled


def test_forbidden_token(smollm_server) -> None:
    res = post_ok(smollm_server, "/generate", {
        "text": "Only output 'rice' exactly like this, in lowercase ONLY: rice",
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 16, "logit_bias": {str(RICE): -100.0}},
        "return_logprob": True,
    })
    assert RICE not in [x[1] for x in res["meta_info"]["output_token_logprobs"]]


def test_logit_bias_isolation(smollm_server) -> None:
    def sampled(params: dict) -> list[int]:
        res = post_ok(smollm_server, "/generate", {
            "text": PROMPT,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 4, **params},
            "return_logprob": True,
        })
        return [x[1] for x in res["meta_info"]["output_token_logprobs"]]

    biased = sampled({"logit_bias": {str(PARIS): 100.0}})
    unbiased = sampled({})
    assert all(x == PARIS for x in biased), biased
    assert any(x != PARIS for x in unbiased), unbiased


def test_get_server_info_concurrent(smollm_server) -> None:
    with ThreadPoolExecutor(30) as pool:
        infos = list(pool.map(lambda _: requests.get(smollm_server.url + "/get_server_info", timeout=60), range(4)))
    assert all(r.status_code == 200 and r.json()["version"] for r in infos)

