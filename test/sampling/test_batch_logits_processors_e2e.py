"""Batch-level logits processors end to end on the embedded SmolLM2 (and a tiny random Qwen3-style
checkpoint for thinking_token_budget): every step's row view equals the scheduler's batch through
40 requests joining and leaving (overlap on and off, with SGLANG_CHECK_LOGITS_PROCESSORS on), a
plugin changes exactly the rows that asked for it, bad arguments are 400s naming the processor,
a raising processor fails only its requests, the row check catches seed 004's bug, and the four
built-ins have their effect on both APIs, with the other rows of their batch unchanged."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import threading
from typing import Any, Iterator

import pytest
import requests

from engine_utils import iter_stream

from sglang.test.server_process import ServerProcess, free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # test/, which holds the helper modules
PLUGINS = [f"logits_processor_plugins:{name}" for name in
           ("RecordingProcessor", "ForceTokenProcessor", "RaisingProcessor", "FirstPromptProcessor")]
FLAGS = ("--chunked-prefill-size", "48", "--max-running-requests", "12")
TIMEOUT = 600


@contextlib.contextmanager
def plugin_server(model_path: str, record_path: str, *flags: str) -> Iterator[ServerProcess]:
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([TEST_DIR, os.environ.get("PYTHONPATH", "")]),
        "SGLANG_CHECK_LOGITS_PROCESSORS": "1",
        "LP_RECORD_PATH": record_path,
        # One OpenMP thread: on a shared 2-core CI box a second thread's spin-waits made decode
        # steps 100x slower; the tests check tokens, not speed.
        "OMP_NUM_THREADS": "1",
    }
    argv = ["--port", str(port), "--model-path", model_path, "--logits-processors", *PLUGINS, *FLAGS, *flags]
    server = ServerProcess(argv, port, env=env, startup_timeout=TIMEOUT)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def record_path(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("records") / "steps.jsonl")


@pytest.fixture(scope="module")
def server(gguf_path: str, record_path: str):
    with plugin_server(gguf_path, record_path) as proc:
        yield proc


def post(server: ServerProcess, text: Any, params: dict) -> requests.Response:
    """/generate with text (a string) or input_ids (a list of ids)."""
    key = "text" if isinstance(text, str) else "input_ids"
    return requests.post(server.url + "/generate", json={key: text, "sampling_params": params}, timeout=TIMEOUT)


def post_ok(server: ServerProcess, text: Any, params: dict) -> dict:
    response = post(server, text, params)
    assert response.status_code == 200, response.text
    return response.json()


def run_concurrently(server: ServerProcess, jobs: dict[str, tuple[str, dict]]) -> dict[str, requests.Response]:
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futures = {name: pool.submit(post, server, text, params) for name, (text, params) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def failure_message(response: requests.Response) -> str:
    """A request failed by a processor: an error response, or (when tokens were already produced)
    a 200 whose finish reason is an abort; its message."""
    if response.status_code != 200:
        return response.text
    reason = response.json()["meta_info"]["finish_reason"]
    assert reason["type"] == "abort", reason
    return reason["message"]


def greedy(n: int, **params: Any) -> dict:
    return {"temperature": 0.0, "max_new_tokens": n, "ignore_eos": True, **params}


# ---------------------------------------------------------------------- row views


def forty_requests() -> list[tuple[list[int], dict]]:
    """Prompts of 3 to 42 ids (distinct), outputs of 4 to 26 tokens, greedy and seeded."""
    jobs = []
    for i in range(40):
        prompt = [10 + (i * 37 + k * 11) % 5000 for k in range(3 + (i * 13) % 40)]
        params = greedy(4 + (i * 7) % 23) if i % 2 else {"temperature": 0.8, "sampling_seed": i, "max_new_tokens": 4 + (i * 5) % 19, "ignore_eos": True}
        jobs.append((prompt, params))
    return jobs


def check_recorded_views(record_path: str, results: list[dict], prompts: list[list[int]]) -> None:
    """Every step's rows are 0..B-1, each row a request of this run, and each request's output
    length grows by exactly one per step it is sampled in (so index reuse, filtering, merging and
    the overlap schedule never showed a processor a stale or foreign row)."""
    with open(record_path) as f:
        steps = [json.loads(line) for line in f]
    lengths: dict[tuple, list[int]] = {tuple(p): [] for p in prompts}
    for step in steps:
        assert [row for row, _, _ in step["rows"]] == list(range(step["batch_size"])), step
        for _, prompt, out_len in step["rows"]:
            lengths[tuple(prompt)].append(out_len)
    for prompt, result in zip(prompts, results):
        seen, n = lengths[tuple(prompt)], len(result["output_ids"])
        # Under overlap a finished request runs one more step, whose token is dropped.
        assert seen in (list(range(n)), list(range(n + 1))), (n, seen)


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "no-overlap"])
def test_forty_requests_rows_match_the_scheduler(gguf_path, server, record_path, tmp_path, overlap):
    jobs = forty_requests()
    if overlap:
        proc, path = contextlib.nullcontext(server), record_path
    else:
        path = str(tmp_path / "steps.jsonl")
        proc = plugin_server(gguf_path, path, "--disable-overlap-schedule")
    with proc as srv:
        open(path, "w").close()
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            futures = [pool.submit(post_ok, srv, text, params) for text, params in jobs]
            results = [f.result() for f in futures]
    prompts = [prompt for prompt, _ in jobs]
    assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)
    check_recorded_views(path, results, prompts)


def prompt_ids_of(server: ServerProcess, text: str) -> list[int]:
    response = requests.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def test_row_check_catches_a_processor_that_gives_every_row_the_first_prompt(server):
    first = {"text": "Tell me a long story about a dragon.", "sampling_params": greedy(48)}
    started, outcome = threading.Event(), {}

    def stream_first() -> None:
        for chunk in iter_stream(server, first, TIMEOUT):
            started.set()
            outcome["first"] = chunk

    thread = threading.Thread(target=stream_first)
    thread.start()
    assert started.wait(TIMEOUT)
    buggy = post(server, "A different prompt entirely.", greedy(8, custom_params={"first_prompt_bug": True}))
    thread.join()
    message = failure_message(buggy)
    assert "FirstPromptProcessor" in message and "row check: row 1 is request" in message, message
    assert outcome["first"]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(outcome["first"]["output_ids"]) == 48


# ---------------------------------------------------------------------- plugins


def test_plugin_changes_exactly_the_rows_that_ask(server):
    texts = {"a": "The capital of France is", "b": "List some fruits:", "c": "Once upon a time"}
    solo = {name: post_ok(server, text, greedy(16))["output_ids"] for name, text in texts.items()}
    forced = 1234
    batch = run_concurrently(server, {
        "a": (texts["a"], greedy(16, custom_params={"force_token": forced})),
        "b": (texts["b"], greedy(16)),
        "c": (texts["c"], {"temperature": 1.0, "sampling_seed": 7, "max_new_tokens": 16, "ignore_eos": True,
                           "custom_params": {"force_token": forced}}),
    })
    assert all(r.status_code == 200 for r in batch.values()), {k: r.text for k, r in batch.items()}
    assert batch["a"].json()["output_ids"] == [forced] * 16
    assert batch["c"].json()["output_ids"] == [forced] * 16
    assert batch["b"].json()["output_ids"] == solo["b"]


def test_invalid_plugin_argument_is_a_400_naming_processor_and_argument(server):
    response = post(server, "Hi", greedy(4, custom_params={"force_token": "x"}))
    assert response.status_code == 400
    assert "ForceTokenProcessor" in response.text and "force_token" in response.text, response.text
    chat = requests.post(server.url + "/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "vllm_xargs": {"force_token": -3}}, timeout=TIMEOUT)
    assert chat.status_code == 400 and "force_token" in chat.text, chat.text


def test_raising_processor_fails_only_its_requests_and_the_server_goes_on(server):
    texts = {"plain1": "The capital of France is", "plain2": "List some fruits:"}
    solo = {name: post_ok(server, text, greedy(12))["output_ids"] for name, text in texts.items()}
    batch = run_concurrently(server, {
        "raise1": ("Once upon a time", greedy(12, custom_params={"raise": True})),
        "plain1": (texts["plain1"], greedy(12)),
        "raise2": ("Write about the sea.", {"temperature": 1.0, "max_new_tokens": 12, "custom_params": {"raise": True}}),
        "plain2": (texts["plain2"], greedy(12)),
    })
    for name in ("raise1", "raise2"):
        assert "RaisingProcessor failed: RuntimeError: this processor always fails" in failure_message(batch[name])
    for name in texts:
        assert batch[name].status_code == 200 and batch[name].json()["output_ids"] == solo[name]
    assert post_ok(server, texts["plain1"], greedy(12))["output_ids"] == solo["plain1"]


# ---------------------------------------------------------------------- built-ins


def test_allowed_token_ids_at_temperature_one_and_greedy(server):
    allowed = [28, 314, 1083, 2654, 9081]
    sampled = post_ok(server, "Count:", {"temperature": 1.0, "max_new_tokens": 256, "ignore_eos": True,
                                         "allowed_token_ids": allowed})
    assert len(sampled["output_ids"]) == 256 and set(sampled["output_ids"]) <= set(allowed)
    assert len(set(sampled["output_ids"])) > 1
    chosen = post_ok(server, "Count:", greedy(16, allowed_token_ids=allowed))
    assert set(chosen["output_ids"]) <= set(allowed)


def test_bad_words_with_and_without_a_leading_space(server):
    text = "The capital of France is"
    before = post_ok(server, text, greedy(24))
    word = "Paris"
    assert word in before["text"], before["text"]
    after = post_ok(server, text, greedy(24, bad_words=[word]))
    banned = [prompt_ids_of(server, word), prompt_ids_of(server, " " + word)]
    for seq in banned:
        out = after["output_ids"]
        assert not any(out[i : i + len(seq)] == seq for i in range(len(out))), (seq, out)
    assert after["output_ids"] != before["output_ids"]


def repeats(sequence: list[int], start: int, n: int) -> list[int]:
    """Positions >= start whose n-gram (ending there) occurs earlier in the sequence."""
    found = []
    for end in range(max(start, n - 1), len(sequence)):
        gram = sequence[end - n + 1 : end + 1]
        if any(sequence[e - n + 1 : e + 1] == gram for e in range(n - 1, end)):
            found.append(end)
    return found


def test_no_repeat_ngram_size_three_and_one(server):
    prompt = prompt_ids_of(server, "the cat sat on the mat. the cat sat on the mat. the cat sat on the")
    loose = post_ok(server, prompt, greedy(48))
    assert repeats(prompt + loose["output_ids"], len(prompt), 3), "the prompt should make the model repeat"
    three = post_ok(server, prompt, greedy(48, no_repeat_ngram_size=3))
    assert repeats(prompt + three["output_ids"], len(prompt), 3) == []
    one = post_ok(server, prompt, greedy(48, no_repeat_ngram_size=1))
    seq = prompt + one["output_ids"]
    assert all(seq[p] not in seq[:p] for p in range(len(prompt), len(seq)))


def test_each_built_in_in_a_mixed_batch_leaves_the_other_rows_unchanged(server):
    plain = {
        "greedy": ("The capital of France is", greedy(20)),
        "seeded": ("Once upon a time", {"temperature": 1.0, "sampling_seed": 1234, "max_new_tokens": 20, "ignore_eos": True}),
        "penalised": ("List some fruits:", greedy(20, frequency_penalty=0.5, repetition_penalty=1.2)),
    }
    solo = {name: post_ok(server, text, params)["output_ids"] for name, (text, params) in plain.items()}
    built_ins = {
        "allowed": ("Count:", greedy(20, allowed_token_ids=[28, 314, 1083])),
        "bad": ("The capital of France is", greedy(20, bad_words=["Paris"])),
        "ngram": ("the cat sat on the mat. the cat sat on the", greedy(20, no_repeat_ngram_size=2)),
    }
    batch = run_concurrently(server, {**plain, **built_ins})
    assert all(r.status_code == 200 for r in batch.values()), {k: r.text for k, r in batch.items()}
    assert {name: batch[name].json()["output_ids"] for name in plain} == solo
    assert set(batch["allowed"].json()["output_ids"]) <= {28, 314, 1083}


def test_openai_routes_take_the_built_ins_and_their_400s(server):
    url = server.url + "/v1/completions"
    ok = requests.post(url, json={"prompt": "Count:", "max_tokens": 12, "temperature": 0, "allowed_token_ids": [28, 314]},
                       timeout=TIMEOUT)
    assert ok.status_code == 200, ok.text
    xargs = requests.post(url, json={"prompt": "the cat the cat the cat", "max_tokens": 12, "temperature": 0,
                                      "vllm_xargs": {"no_repeat_ngram_size": 1}}, timeout=TIMEOUT)
    assert xargs.status_code == 200, xargs.text
    for body, param in [
        ({"allowed_token_ids": []}, "allowed_token_ids"),
        ({"allowed_token_ids": [10**7]}, "allowed_token_ids"),
        ({"bad_words": [""]}, "bad_words"),
        ({"bad_words": [f"w{i}" for i in range(65)]}, "bad_words"),
        ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size"),
        ({"thinking_token_budget": -2}, "thinking_token_budget"),
    ]:
        response = requests.post(url, json={"prompt": "Hi", "max_tokens": 4, **body}, timeout=TIMEOUT)
        assert response.status_code == 400 and param in response.text, (body, response.text)
