"""SGLang's returned sampling information and scheduling fields end to end, on one server (the
embedded model) started with --enable-priority-scheduling --disable-priority-preemption
--max-running-requests 1 (running requests are never retracted, so queued ones wait for them):
return_sampling_mask / sampling_logprobs_mode / return_entropy / return_prompt_token_ids in
SGLang's response shape (batches mixing askers and non-askers, n > 1, streaming), priority order
in the queue, cache_salt isolation of the prefix cache, and the 400s naming each field."""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time

import pytest
import requests

from engine_utils import generate, generate_ok, iter_stream, running_server

pytestmark = pytest.mark.e2e

MASK_CAP = 16
TIMEOUT = 300


@pytest.fixture(scope="module")
def server():
    flags = (
        "--enable-priority-scheduling", "--disable-priority-preemption", "--max-running-requests", "1",
        "--sampling-mask-max-tokens", str(MASK_CAP),
    )
    with running_server(*flags) as proc:
        yield proc


def _sampled(top_k: int, seed: int, n_tokens: int = 6, **params) -> dict:
    return {"temperature": 0.9, "top_k": top_k, "sampling_seed": seed, "max_new_tokens": n_tokens, "ignore_eos": True, **params}


def test_support_mode_matches_the_renormalised_top_k_logprobs(server) -> None:
    """top_k alone: the support is the top-k ids (no ties in float logits) and the behaviour
    logprobs are the scaled top-k logprobs renormalised over them."""
    k = 8
    out = generate_ok(
        server, "The capital of France is", sampling_params=_sampled(k, 3), return_sampling_mask=True,
        sampling_logprobs_mode="support", return_logprob=True, top_logprobs_num=k,
    )
    meta = out["meta_info"]
    masks, logprobs = meta["output_token_sampling_mask"], meta["output_token_sampling_logprobs"]
    assert len(masks) == len(logprobs) == meta["output_token_sampling_mask_length"] == len(out["output_ids"]) == 6
    for token, mask, lps, top in zip(out["output_ids"], masks, logprobs, meta["output_top_logprobs"]):
        assert token in mask and len(mask) == len(lps) == k
        assert sorted(mask) == sorted(t for _, t, _ in top)
        norm = math.log(sum(math.exp(lp) for lp, _, _ in top))
        want = {t: lp - norm for lp, t, _ in top}
        assert lps == pytest.approx([want[t] for t in mask], abs=1e-4)


def test_selected_mode_is_the_support_logprob_of_the_sampled_token(server) -> None:
    text, params = "Once upon a time", _sampled(5, 11)
    selected = generate_ok(server, text, sampling_params=params, return_sampling_mask=True)
    support = generate_ok(server, text, sampling_params=params, return_sampling_mask=True, sampling_logprobs_mode="support")
    assert selected["output_ids"] == support["output_ids"]  # same seed, same tokens (the second prompt is cached)
    sel, sup = selected["meta_info"], support["meta_info"]
    assert sel["output_token_sampling_mask"] == sup["output_token_sampling_mask"]
    for token, mask, lp, lps in zip(
        selected["output_ids"], sup["output_token_sampling_mask"], sel["output_token_sampling_logprobs"],
        sup["output_token_sampling_logprobs"],
    ):
        assert isinstance(lp, float) and lp == pytest.approx(lps[mask.index(token)], abs=1e-4)


def test_a_batch_mixing_askers_and_non_askers(server) -> None:
    outs = generate_ok(
        server, ["Hello", "Hello", "Hello"], sampling_params=[_sampled(4, 1), _sampled(4, 1), {"temperature": 0, "max_new_tokens": 4}],
        return_sampling_mask=[True, False, True], return_entropy=[True, False, False],
    )
    asker, plain, greedy = outs
    assert asker["output_ids"] == plain["output_ids"]  # asking changes no token
    assert "output_token_sampling_mask" not in plain["meta_info"] and "output_token_entropy_val" not in plain["meta_info"]
    entropy = asker["meta_info"]["output_token_entropy_val"]
    assert len(entropy) == 6 and all(e >= 0.0 for e in entropy)
    meta = greedy["meta_info"]
    assert meta["output_token_sampling_mask"] == [[t] for t in greedy["output_ids"]]
    assert meta["output_token_sampling_logprobs"] == [0.0] * 4 and "output_token_entropy_val" not in meta


def test_n_children_each_report_their_tokens(server) -> None:
    outs = generate_ok(server, "Hi there", sampling_params=_sampled(6, 5, n=2), return_sampling_mask=True)
    assert len(outs) == 2
    for out in outs:
        masks = out["meta_info"]["output_token_sampling_mask"]
        assert len(masks) == len(out["output_ids"]) and all(t in m for t, m in zip(out["output_ids"], masks))


def test_streamed_reports_are_cumulative(server) -> None:
    chunks = list(iter_stream(server, {"text": "Count: 1, 2,", "sampling_params": _sampled(3, 2, 8), "return_sampling_mask": True}))
    last = chunks[-1]
    assert len(last["meta_info"]["output_token_sampling_mask"]) == len(last["output_ids"]) == 8
    for chunk in chunks:
        assert chunk["meta_info"]["output_token_sampling_mask_length"] == len(chunk["output_ids"])


def test_prompt_token_ids_are_returned(server) -> None:
    ids = [504, 3458, 282, 4649, 314]
    out = generate_ok(server, ids, sampling_params={"max_new_tokens": 1}, return_prompt_token_ids=True)
    assert out["prompt_token_ids"] == ids
    assert "prompt_token_ids" not in generate_ok(server, ids, sampling_params={"max_new_tokens": 1})
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "return_prompt_token_ids": True}
    chat = requests.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT).json()
    prompt_ids = chat["choices"][0]["prompt_token_ids"]
    assert len(prompt_ids) == chat["usage"]["prompt_tokens"]
    streamed = requests.post(server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=TIMEOUT)
    assert streamed.status_code == 400 and "return_prompt_token_ids" in streamed.text


@pytest.mark.parametrize("fields, name", [
    ({"sampling_logprobs_mode": "support"}, "sampling_logprobs_mode"),
    ({"return_sampling_mask": True, "sampling_logprobs_mode": "all"}, "sampling_logprobs_mode"),
    ({"return_sampling_mask": True, "sampling_params": {"top_k": -1}}, "top_k=-1"),
    ({"return_sampling_mask": True, "sampling_params": {"top_k": MASK_CAP + 1}}, f"top_k={MASK_CAP + 1}"),
    ({"return_sampling_mask": "yes"}, "return_sampling_mask"),
    ({"return_entropy": 1}, "return_entropy"),
    ({"return_prompt_token_ids": "no"}, "return_prompt_token_ids"),
    ({"priority": "high"}, "priority"),
    ({"priority": 1 << 63}, "priority"),
    ({"max_thinking_tokens": -1}, "max_thinking_tokens"),
])
def test_bad_values_are_a_400_naming_the_field(server, fields: dict, name: str) -> None:
    response = generate(server, "Hi", **fields)
    assert response.status_code == 400 and name in response.json()["error"]["message"], response.text


def test_a_bad_request_fails_alone_in_a_batch(server) -> None:
    """One bad input of a batch body is a 400 for the body, and the server serves the next request."""
    assert generate(server, ["a", "b"], return_sampling_mask=[True, True], sampling_logprobs_mode=["support", "every"]).status_code == 400
    assert generate_ok(server, "a", sampling_params={"max_new_tokens": 1})["meta_info"]["completion_tokens"] == 1


def _queued(server) -> int:
    return requests.get(server.url + "/get_server_info", timeout=TIMEOUT).json()["load"]["num_queue_reqs"]


def _wait_queued(server, count: int, futures: list) -> None:
    deadline = time.monotonic() + TIMEOUT
    while _queued(server) < count:
        for future in futures:  # a request that ran at once (or failed) never queues
            assert not future.done(), f"a request ended while the blocker ran: {future.exception()!r}"
        assert time.monotonic() < deadline, f"{count} requests never queued"
        time.sleep(0.05)


def test_higher_priority_is_admitted_first(server) -> None:
    """With one running request, the queued ones run by priority (higher first), not arrival."""
    finished: list[str] = []
    lock = threading.Lock()

    def run(name: str, priority: int) -> None:
        generate_ok(server, f"Story {name}:", priority=priority,
                    sampling_params={"temperature": 0, "max_new_tokens": 2, "ignore_eos": True})
        with lock:
            finished.append(name)

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        blocker = iter_stream(server, {"text": "Long story:", "sampling_params": {"max_new_tokens": 2000, "ignore_eos": True}})
        first = next(blocker)  # it holds the one running slot
        assert "error" not in first, first
        futures = []
        for queued, (name, priority) in enumerate([("low", 0), ("high", 10), ("mid", 5)], start=1):
            futures.append(pool.submit(run, name, priority))
            _wait_queued(server, queued, futures)  # arrival order: low, high, mid
        blocker.close()  # the client goes away: the long request is aborted, the queue runs
        for f in futures:
            f.result()
    assert finished == ["high", "mid", "low"]


def test_cache_salt_isolates_prefix_cache_entries(server) -> None:
    prompt = "Salted prompt: the quick brown fox jumps over the lazy dog " * 4
    params = {"temperature": 0, "max_new_tokens": 1}

    def cached(**fields) -> int:
        return generate_ok(server, prompt, sampling_params=params, **fields)["meta_info"]["cached_tokens"]

    assert cached(cache_salt="tenant-a") == 0
    assert cached(cache_salt="tenant-a") > 0  # the same salt shares
    assert cached(cache_salt="tenant-b") == 0  # another tenant shares nothing
    assert cached() == 0  # nor does an unsalted request
    body = {"model": "x", "prompt": prompt, "max_tokens": 1, "temperature": 0}
    usage = [
        requests.post(server.url + "/v1/completions", json={**body, "cache_salt": salt}, timeout=TIMEOUT).json()["usage"]
        for salt in ("tenant-c", "tenant-c")
    ]
    assert (usage[0].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] > 0


def test_openai_routes_take_priority(server) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "priority": 7}
    assert requests.post(server.url + "/v1/chat/completions", json=body, timeout=TIMEOUT).status_code == 200
    bad = requests.post(server.url + "/v1/completions", json={"model": "x", "prompt": "Hi", "priority": "x"}, timeout=TIMEOUT)
    assert bad.status_code == 400 and "priority" in bad.text
