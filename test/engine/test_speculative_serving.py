"""Speculative decoding with the serving features around it, through the real server, against the
same server without speculation (tiny random Qwen3 in float32): prompts that chunked prefill
splits, a follow-up whose cached prefix holds KV written by verify steps (the radix cache), the
OpenAI completions route, the acceptance histogram on /metrics, and data-parallel replicas
(--dp-size 2) with STANDALONE. The default mode, not the deterministic one: only the default
mode caches a finished request's output KV. Its verify and decode logits agree to float32
rounding, far inside this model's gaps between candidates, so the tokens are equal."""

from __future__ import annotations

import concurrent.futures
import re
import threading

import pytest
import requests

from engine_utils import generate_ok, iter_stream, running_server
from guidance_utils import save_guidance_tiny, tiny_flags
from sglang.test.server_process import ServerProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TIMEOUT = 300
MAX_NEW = 16
CHUNK = 16  # --chunked-prefill-size: every prompt below but the shortest takes several chunks
REPEATING = list(range(100, 130)) * 2  # NGRAM finds drafts in it
PROMPTS = [[3, 141, 59, 26, 53, 58, 97, 93, 23, 84, 62, 64, 33] * 3, REPEATING, [271, 82, 8, 28, 18]]
PENALISED = dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.02, frequency_penalty=0.5, presence_penalty=0.3,
                 repetition_penalty=1.2)
VARIANTS = [{"temperature": 0.0}, {**PENALISED, "sampling_seed": 5}, {"temperature": 0.0, "min_new_tokens": 8,
                                                                     "logit_bias": {"9": 2.0}}]
BATCH = [(p, {"max_new_tokens": MAX_NEW, "ignore_eos": True, **v}) for p in PROMPTS for v in VARIANTS]
HISTOGRAM = "sglang:spec_accept_length_per_request"
# Rows NGRAM finds no drafts in: distinct prompt tokens, then a new token at every step (the bias
# keeps the choice among 64 tokens, the frequency penalty away from those already drawn).
DRAFTLESS_PROMPTS = [list(range(150, 190)), [271, 82, 8, 28, 18]]
DRAFTLESS = dict(max_new_tokens=48, ignore_eos=True, frequency_penalty=2.0, logit_bias={str(t): 30.0 for t in range(200, 264)})
# Its first token continues its prompt's period: NGRAM has drafts for it from its first decode step on.
LATE = dict(temperature=0.0, max_new_tokens=MAX_NEW, ignore_eos=True, logit_bias={str(REPEATING[0]): 30.0})


@pytest.fixture(scope="module")
def target_path(tmp_path_factory) -> str:
    return save_guidance_tiny(str(tmp_path_factory.mktemp("target")), seed=0)


def _flags(target: str, tokenizer: str, *extra: str) -> list[str]:
    return tiny_flags(target, tokenizer, "--dtype", "float32",
                      "--chunked-prefill-size", str(CHUNK), "--enable-metrics", *extra)


@pytest.fixture(scope="module")
def plain(target_path: str, gguf_path: str):
    with running_server(*_flags(target_path, gguf_path)) as server:
        yield server


@pytest.fixture(scope="module")
def ngram(target_path: str, gguf_path: str):
    with running_server(*_flags(target_path, gguf_path, "--speculative-algorithm", "NGRAM",
                                "--speculative-num-draft-tokens", "6")) as server:
        yield server


def _batch(server: ServerProcess) -> list[dict]:
    with concurrent.futures.ThreadPoolExecutor(len(BATCH)) as pool:
        futures = [pool.submit(generate_ok, server, prompt, sampling_params=params) for prompt, params in BATCH]
        return [f.result() for f in futures]


def test_chunked_prompts_give_the_tokens_without_speculation(plain, ngram):
    want, got = _batch(plain), _batch(ngram)
    assert [a["output_ids"] for a in got] == [a["output_ids"] for a in want]
    assert sum(a["meta_info"]["spec_accept_token_num"] for a in got) > 0


def _joined_while_decoding(server: ServerProcess) -> tuple[list[list[int]], list[int]]:
    """Penalised rows without drafts decode (streamed); once each has streamed a chunk, a request
    whose prompt NGRAM finds drafts in joins them: (the rows' output ids, the late one's)."""
    early = [{"input_ids": p, "sampling_params": {**DRAFTLESS, **v}} for p in DRAFTLESS_PROMPTS
             for v in ({"temperature": 0.0}, {"temperature": 0.3, "sampling_seed": 9})]
    decoding = [threading.Event() for _ in early]

    def run(i: int) -> list[int]:
        ids: list[int] = []
        try:
            for chunk in iter_stream(server, early[i]):
                decoding[i].set()
                ids = chunk["output_ids"]
        finally:
            decoding[i].set()  # a failed request shows in its result
        return ids

    with concurrent.futures.ThreadPoolExecutor(len(early)) as pool:
        futures = [pool.submit(run, i) for i in range(len(early))]
        assert all(event.wait(TIMEOUT) for event in decoding)
        late = generate_ok(server, REPEATING, sampling_params=LATE)
        return [f.result() for f in futures], late["output_ids"]


def test_a_request_with_drafts_joining_decoding_rows_gives_the_tokens_without_speculation(plain, ngram):
    """The late request's prefilled batch joins the running rows while their decode step is in
    flight (overlap schedule): the step after it verifies only once that step's tokens are on
    the host, so the rows' verify starts from their latest token."""
    want, got = _joined_while_decoding(plain), _joined_while_decoding(ngram)
    assert got == want
    assert all(len(set(ids)) == DRAFTLESS["max_new_tokens"] for ids in got[0][::2])  # greedy: never a repeat
    assert got[1][0] == REPEATING[0]


def test_a_cached_prefix_written_by_verify_steps_gives_the_tokens_without_speculation(plain, ngram):
    """The follow-up's prompt is the first answer's prompt and output: its cached KV includes the
    positions that verify steps wrote (accepted drafts kept, rejected ones freed)."""
    params = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
    first = generate_ok(ngram, REPEATING, sampling_params=params)
    assert first["meta_info"]["spec_accept_token_num"] > 0
    follow_up = REPEATING + first["output_ids"]
    got = generate_ok(ngram, follow_up, sampling_params=params)
    assert got["meta_info"]["cached_tokens"] > len(REPEATING)
    assert got["output_ids"] == generate_ok(plain, follow_up, sampling_params=params)["output_ids"]
    assert first["output_ids"] == generate_ok(plain, REPEATING, sampling_params=params)["output_ids"]


def test_openai_completions_under_speculation(plain, ngram):
    body = {"model": "x", "prompt": REPEATING, "max_tokens": MAX_NEW, "temperature": 0, "logprobs": 2}
    want, got = (requests.post(s.url + "/v1/completions", json=body, timeout=TIMEOUT) for s in (plain, ngram))
    assert want.status_code == got.status_code == 200, got.text
    w, g = want.json()["choices"][0], got.json()["choices"][0]
    assert g["text"] == w["text"] and g["finish_reason"] == w["finish_reason"]
    assert g["logprobs"]["tokens"] == w["logprobs"]["tokens"]
    for a, b in zip(w["logprobs"]["token_logprobs"], g["logprobs"]["token_logprobs"]):
        assert abs(a - b) < 1e-4
    assert got.json()["usage"]["completion_tokens"] == MAX_NEW


def _histogram(server: ServerProcess) -> tuple[float, float]:
    """(count, sum) of the acceptance-length histogram, over its label sets."""
    text = requests.get(server.url + "/metrics", timeout=TIMEOUT).text
    totals = []
    for suffix in ("_count", "_sum"):
        values = re.findall(rf"^{re.escape(HISTOGRAM + suffix)}(?:{{[^}}]*}})? (\S+)$", text, flags=re.M)
        totals.append(sum(float(v) for v in values))
    return totals[0], totals[1]


def test_metrics_observe_each_finished_requests_acceptance_length(plain, ngram):
    count, total = _histogram(ngram)
    answers = [generate_ok(ngram, prompt, sampling_params=params) for prompt, params in BATCH[:4]]
    new_count, new_total = _histogram(ngram)
    assert new_count - count == len(answers)
    assert new_total - total == pytest.approx(sum(a["meta_info"]["spec_accept_length"] for a in answers), rel=1e-9)
    assert _histogram(plain) == (0.0, 0.0)


def test_standalone_on_two_data_parallel_replicas(plain, target_path, gguf_path):
    flags = _flags(target_path, gguf_path, "--dp-size", "2", "--speculative-algorithm", "STANDALONE",
                   "--speculative-draft-model-path", target_path, "--speculative-num-steps", "3")
    want = _batch(plain)
    with running_server(*flags) as server:
        got = _batch(server)
    assert [a["output_ids"] for a in got] == [a["output_ids"] for a in want]
    greedy = [got[i]["meta_info"] for i in range(0, len(BATCH), len(VARIANTS))]  # the self-draft proposes their tokens
    assert all(m["spec_draft_token_num"] > 0 and m["spec_accept_token_num"] == m["spec_draft_token_num"] for m in greedy)
