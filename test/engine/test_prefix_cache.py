"""The radix prefix cache through the real server: cached runs give the uncached tokens (greedy
and seeded, with chunked prefill, eviction forced by a small pool, TP=2, deterministic mode),
hits are reported in meta_info.cached_tokens, LRU eviction, /flush_cache, prompt logprobs
inside a cached prefix, and --schedule-policy lpm."""

from __future__ import annotations

import concurrent.futures
import json

import pytest
import requests

from engine_utils import generate_ok, greedy, running_server
from test_model_runner import _save_tiny

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SYSTEM = (
    "You are a careful assistant for a small museum. Visitors ask about paintings, sculptures, "
    "opening hours, tickets and the history of the building, which was a railway station until "
    "1950. Answer in two sentences, politely, and suggest one related exhibit when you can. "
)
QUESTIONS = ["When do you open?", "Who painted the large harbour scene?", "Is there a cafe?", "Can I take photos?"]
# Prompts sharing prefixes of different lengths (whole system prompt, parts of it, none).
PROMPTS = [SYSTEM[:cut] + q for cut in (len(SYSTEM), 120, 40, 0) for q in QUESTIONS]
SEEDED = {"temperature": 0.9, "top_p": 0.95, "sampling_seed": 7, "frequency_penalty": 0.3, "max_new_tokens": 12}
# Room for a few requests only: the cache must evict while the workload runs.
SMALL_POOL = ("--max-total-tokens", "700", "--chunked-prefill-size", "48")


def _run_workload(server, params: dict) -> tuple[list[list[int]], list[int]]:
    """Every prompt, four at a time (so batches mix), then a second chat turn on each answer."""
    def one(prompt: str) -> dict:
        return generate_ok(server, prompt, sampling_params=params)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        first = list(pool.map(one, PROMPTS))
        turns = [p + r["text"] + "\nVisitor: Thank you! And the tickets?" for p, r in zip(PROMPTS, first)]
        second = list(pool.map(one, turns))
    results = first + second
    return [r["output_ids"] for r in results], [r["meta_info"]["cached_tokens"] for r in results]


@pytest.fixture(scope="module")
def cached():
    with running_server(*SMALL_POOL) as srv:
        yield srv


@pytest.fixture(scope="module")
def uncached():
    with running_server(*SMALL_POOL, "--disable-radix-cache") as srv:
        yield srv


@pytest.mark.parametrize("params", [greedy(12), SEEDED], ids=["greedy", "seeded"])
def test_cached_outputs_equal_uncached_outputs(cached, uncached, params) -> None:
    with_cache, hits = _run_workload(cached, params)
    without_cache, no_hits = _run_workload(uncached, params)
    assert with_cache == without_cache
    assert set(no_hits) == {0}
    assert sum(h > 0 for h in hits) >= len(PROMPTS)  # at least every second turn, and shared system prompts


def test_lru_eviction_then_reuse(cached) -> None:
    requests.post(cached.url + "/flush_cache", timeout=60).raise_for_status()
    first = PROMPTS[0]
    n = generate_ok(cached, first, sampling_params=greedy(1))["meta_info"]["prompt_tokens"]
    assert generate_ok(cached, first, sampling_params=greedy(1))["meta_info"]["cached_tokens"] == n - 1
    # Distinct prompts that together need more than the pool: the oldest prefix goes.
    for i in range(8):
        generate_ok(cached, f"{i} " * 60 + "count on", sampling_params=greedy(4))
    assert generate_ok(cached, first, sampling_params=greedy(1))["meta_info"]["cached_tokens"] == 0
    assert generate_ok(cached, first, sampling_params=greedy(1))["meta_info"]["cached_tokens"] == n - 1


def test_flush_cache_empties_the_cache(cached) -> None:
    prompt = PROMPTS[5]
    generate_ok(cached, prompt, sampling_params=greedy(2))
    assert generate_ok(cached, prompt, sampling_params=greedy(2))["meta_info"]["cached_tokens"] > 0
    assert requests.post(cached.url + "/flush_cache", timeout=60).text == "Cache flushed.\n"
    assert generate_ok(cached, prompt, sampling_params=greedy(2))["meta_info"]["cached_tokens"] == 0


def test_prompt_logprobs_inside_a_cached_prefix(cached, uncached) -> None:
    prompt = PROMPTS[2]
    generate_ok(cached, prompt, sampling_params=greedy(1))  # the whole prompt is cached now
    fields = {"sampling_params": greedy(2), "return_logprob": True, "logprob_start_len": 10}
    hit = generate_ok(cached, prompt, **fields)
    fresh = generate_ok(uncached, prompt, **fields)
    assert hit["meta_info"]["cached_tokens"] == 9  # position 10's logprob needs the logits at 9
    got, want = hit["meta_info"]["input_token_logprobs"], fresh["meta_info"]["input_token_logprobs"]
    assert len(got) == hit["meta_info"]["prompt_tokens"] - 10 and [t for _, t, *_ in got] == [t for _, t, *_ in want]
    assert [lp for lp, *_ in got] == pytest.approx([lp for lp, *_ in want], abs=1e-4)
    assert hit["output_ids"] == fresh["output_ids"]


def test_n_children_and_later_requests_share_the_prompt(cached) -> None:
    requests.post(cached.url + "/flush_cache", timeout=60).raise_for_status()
    prompt = PROMPTS[9]
    children = generate_ok(cached, prompt, sampling_params={**SEEDED, "n": 3})
    n = children[0]["meta_info"]["prompt_tokens"]
    assert sorted(c["meta_info"]["cached_tokens"] for c in children) == [0, n - 1, n - 1]
    again = generate_ok(cached, prompt, sampling_params={**SEEDED, "n": 3})
    assert [c["output_ids"] for c in again] == [c["output_ids"] for c in children]


# --- --schedule-policy lpm --------------------------------------------------------------------


def test_lpm_admits_the_longest_cached_prefix_first() -> None:
    with running_server("--schedule-policy", "lpm", "--max-running-requests", "1") as server:
        cold, warm = "Name three rivers in Europe, please.", PROMPTS[0]
        generate_ok(server, warm, sampling_params=greedy(1))
        blocker = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}, "stream": True}
        with requests.post(server.url + "/generate", json=blocker, stream=True, timeout=300) as running:
            lines = running.iter_lines()  # held: dropping it would abort the blocker
            next(line for line in lines if line.startswith(b"data: "))
            # One batch: `cold` reaches the queue first, both wait behind the blocker.
            queued = {"text": [cold, warm], "sampling_params": greedy(2), "stream": True}
            with requests.post(server.url + "/generate", json=queued, stream=True, timeout=300) as response:
                first = next(json.loads(line[6:]) for line in response.iter_lines() if line.startswith(b"data: "))
    assert first["index"] == 1 and first["meta_info"]["cached_tokens"] > 0


# --- TP=2 and the deterministic mode ----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    folder = str(tmp_path_factory.mktemp("qwen3_tiny_cache"))
    _save_tiny("qwen3_head_dim_32_sharded", folder)
    return folder


def _ids_workload(server, params: dict) -> tuple[list[list[int]], list[int]]:
    base = list(range(20, 80))
    prompts = [base[:cut] + [100 + i, 7] for cut in (60, 30, 10) for i in range(3)]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda p: generate_ok(server, p, sampling_params=params), prompts))
    return [r["output_ids"] for r in results], [r["meta_info"]["cached_tokens"] for r in results]


def test_tp2_cached_equals_uncached(tiny_path: str) -> None:
    flags = ("--model-path", tiny_path, "--tp-size", "2", "--max-total-tokens", "400", "--chunked-prefill-size", "32")
    outputs = {}
    for name, extra in (("cache", ()), ("none", ("--disable-radix-cache",))):
        with running_server(*flags, *extra) as server:
            outputs[name] = [_ids_workload(server, params) for params in (greedy(8), SEEDED)]
    for (with_cache, hits), (without_cache, no_hits) in zip(outputs["cache"], outputs["none"]):
        assert with_cache == without_cache
        assert max(hits) > 0 and set(no_hits) == {0}


@pytest.mark.parametrize("linears", [(), ("--cpu-int8-activations",)], ids=["exact", "int8-activations"])
def test_deterministic_mode_cached_equals_uncached_to_the_bit(linears: tuple[str, ...]) -> None:
    flags = ("--enable-deterministic-inference", "--chunked-prefill-size", "16", *linears)
    fields = {"sampling_params": SEEDED, "return_logprob": True}
    runs = {}
    for name, extra in (("cache", ()), ("none", ("--disable-radix-cache",))):
        with running_server(*flags, *extra) as server:
            runs[name] = [generate_ok(server, p, **fields) for p in PROMPTS[:6]]
    hits = [r["meta_info"]["cached_tokens"] for r in runs["cache"]]
    assert max(hits) >= 16 and all(h % 16 == 0 for h in hits)  # whole 16-token chunks only
    for a, b in zip(runs["cache"], runs["none"]):
        assert a["output_ids"] == b["output_ids"]
        assert a["meta_info"]["output_token_logprobs"] == b["meta_info"]["output_token_logprobs"]


@pytest.mark.parametrize("server_name", ["cached", "uncached"])
def test_admission_reserves_for_requests_whose_prefill_is_in_flight(server_name, request) -> None:
    """More long requests at once than the pool holds: under the overlap schedule the scheduler
    builds the next step before reading the in-flight prefill's tokens, and must still count
    those requests' reservations (it used to admit more and run out of KV slots mid-decode)."""
    server = request.getfixturevalue(server_name)
    params = {"max_new_tokens": 150, "ignore_eos": True, "temperature": 0.0}
    prompts = [f"Request {i}: " + "tell me about the sea and the ships " * 4 for i in range(8)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: generate_ok(server, p, sampling_params=params), prompts))
    assert [len(r["output_ids"]) for r in results] == [150] * 8
