"""Two of our servers behind sglang-router (SGLang's Rust load balancer, `pip install -e ".[router]"`).

The workers run a tiny random Qwen3 with SmolLM2's vocabulary in deterministic mode, so an answer
does not depend on its batch-mates and every answer through the router must equal the same request
sent to a worker directly: 200 mixed requests (/generate, /v1/completions, /v1/chat/completions,
streamed and not, greedy and seeded), and requests carrying logit_bias or custom_params on the
routes where the router forwards them. With cache_aware, requests sharing a long prefix land on one
worker (its radix cache hits show in cached_tokens). A worker killed mid-run (power_of_two, which
reads /get_load): every request completes or gets an error, counted; none hangs."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any, Optional

import pytest
import requests

from engine_utils import running_server
from flag_helpers import wait_until
from scaling_utils import PROMPTS, model_flags, save_tiny_full_vocab
from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor
from sglang.test.server_process import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

pytest.importorskip("sglang_router")

NEW_TOKENS = 6
KINDS = [(endpoint, stream) for endpoint in ("generate", "completions", "chat") for stream in (False, True)]
ROUTER_READY_S = 120
REQUEST_TIMEOUT_S = 300  # a hang is no answer at all; a slow answer on a loaded 2-core box is not one
# Deterministic mode caches only whole prefill chunks: small chunks make a shared prefix hit.
WORKER_FLAGS = ["--enable-deterministic-inference", "--chunked-prefill-size", "64", "--enable-custom-logit-processor"]


@pytest.fixture(scope="module")
def worker_flags(tmp_path_factory, gguf_path: str) -> list[str]:
    folder = str(tmp_path_factory.mktemp("tiny_full_vocab"))
    save_tiny_full_vocab(folder)
    return [*model_flags(folder, gguf_path), *WORKER_FLAGS]


@pytest.fixture(scope="module")
def workers(worker_flags: list[str]) -> Iterator[list]:
    with running_server(*worker_flags) as first, running_server(*worker_flags) as second:
        yield [first, second]


@contextlib.contextmanager
def router(urls: list[str], policy: str, log_path: str) -> Iterator[str]:
    """`python -m sglang_router.launch_router` in front of `urls`, once it holds them all healthy."""
    port = free_port()
    command = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
               "--worker-urls", *urls, "--policy", policy, "--prometheus-port", str(free_port())]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for_workers(base, len(urls), proc, log_path)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_workers(base: str, count: int, proc: subprocess.Popen, log_path: str) -> None:
    deadline = time.monotonic() + ROUTER_READY_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, open(log_path).read()
        with contextlib.suppress(requests.ConnectionError, ValueError):
            workers = requests.get(base + "/workers", timeout=10).json()["workers"]
            if sum(w["is_healthy"] for w in workers) == count:
                return
        time.sleep(0.2)
    pytest.fail(f"the router did not hold {count} healthy workers within {ROUTER_READY_S} s:\n{open(log_path).read()}")


# --- requests and their comparable answers ---------------------------------------------------------


def mixed_request(i: int) -> tuple[str, bool, str, Optional[int]]:
    """(endpoint, stream, prompt, seed or None for greedy): 48 distinct requests, cycled."""
    endpoint, stream = KINDS[(i // len(PROMPTS)) % len(KINDS)]
    seeded = (i // (len(PROMPTS) * len(KINDS))) % 2 == 1
    return endpoint, stream, PROMPTS[i % len(PROMPTS)], 100 + i % len(PROMPTS) if seeded else None


def _body(endpoint: str, stream: bool, prompt: str, seed: Optional[int]) -> tuple[str, dict]:
    sampling = {"temperature": 0.0} if seed is None else {"temperature": 0.8, "top_p": 0.9}
    if endpoint == "generate":
        params = {**sampling, "max_new_tokens": NEW_TOKENS, **({} if seed is None else {"sampling_seed": seed})}
        return "/generate", {"text": prompt, "sampling_params": params, "stream": stream}
    openai = {"model": "tiny", "max_tokens": NEW_TOKENS, "stream": stream, **sampling, **({} if seed is None else {"seed": seed})}
    if endpoint == "completions":
        return "/v1/completions", {"prompt": prompt, **openai}
    return "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], **openai}


def call(base: str, request: tuple) -> dict[str, Any]:
    """The parts of the answer that must not depend on the route: text, ids, finish reason."""
    endpoint, stream, _, _ = request
    path, body = _body(*request)
    with requests.post(base + path, json=body, stream=stream, timeout=REQUEST_TIMEOUT_S) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        if not stream:
            return _answer(endpoint, response.json(), stream=False)
        chunks = _sse_chunks(response)
    if endpoint == "generate":
        return _answer(endpoint, chunks[-1], stream=True)
    parts = [_answer(endpoint, chunk, stream=True) for chunk in chunks]
    return {"text": "".join(p["text"] for p in parts), "finish": next((p["finish"] for p in parts if p["finish"]), None)}


def _sse_chunks(response: requests.Response) -> list[dict]:
    chunks = []
    for line in response.iter_lines():
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            chunk = json.loads(line[len(b"data: "):])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            chunks.append(chunk)
    return chunks


def _answer(endpoint: str, out: dict, stream: bool) -> dict[str, Any]:
    if endpoint == "generate":
        reason = out["meta_info"]["finish_reason"]
        return {"text": out["text"], "ids": out["output_ids"], "finish": reason and reason["type"]}
    choice = out["choices"][0]
    if endpoint == "completions":
        text = choice["text"]
    else:
        text = (choice["delta"] if stream else choice["message"]).get("content") or ""
    return {"text": text, "finish": choice["finish_reason"]}


def _direct_answers(worker_url: str, requests_: list[tuple]) -> dict[tuple, dict]:
    distinct = sorted(set(requests_), key=str)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return dict(zip(distinct, pool.map(lambda r: call(worker_url, r), distinct)))


# --- through the router ----------------------------------------------------------------------------


def test_cache_aware_keeps_a_shared_prefix_on_one_worker(workers, tmp_path) -> None:
    prefix = f"Reference {uuid.uuid4().hex}: " + " ".join(f"item{k}" for k in range(200))
    with router([w.url for w in workers], "cache_aware", str(tmp_path / "router.log")) as base:
        cached = []
        for i in range(5):
            body = {"text": f"{prefix} question {i}", "sampling_params": {"temperature": 0.0, "max_new_tokens": 2}}
            meta = requests.post(base + "/generate", json=body, timeout=REQUEST_TIMEOUT_S).json()["meta_info"]
            cached.append((meta["cached_tokens"], meta["prompt_tokens"]))
    # The first request computes the prefix; each later one finds it cached, so it reached the
    # worker that holds it (the other one never saw this prefix).
    assert cached[0][0] == 0, cached
    assert all(hit >= prompt // 2 for hit, prompt in cached[1:]), cached


def test_200_mixed_requests_through_the_router_equal_direct_answers(workers, tmp_path) -> None:
    mixed = [mixed_request(i) for i in range(200)]
    direct = _direct_answers(workers[0].url, mixed)
    with router([w.url for w in workers], "round_robin", str(tmp_path / "router.log")) as base:
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            routed = list(pool.map(lambda r: call(base, r), mixed))
    for request, answer in zip(mixed, routed):
        assert answer == direct[request], f"{request}: through the router {answer} != direct {direct[request]}"
        assert answer["finish"] == "length" and answer["text"]


def _post(base: str, path: str, body: dict) -> dict[str, Any]:
    response = requests.post(base + path, json=body, timeout=REQUEST_TIMEOUT_S)
    assert response.status_code == 200, response.text[:300]
    return _answer("completions" if path == "/v1/completions" else "chat", response.json(), stream=False)


def test_logit_bias_and_custom_params_reach_the_worker_on_the_openai_routes(workers, tmp_path) -> None:
    """sglang-router 0.3.2 forwards logit_bias on /v1/completions and /v1/chat/completions and
    custom_params (with custom_logit_processor) on /v1/completions: each such request gets the
    direct answer, which differs from the unbiased one. (/generate drops both: docs/scaling.md.)"""
    prompt = PROMPTS[0]
    greedy_ids = requests.post(workers[0].url + "/generate", timeout=REQUEST_TIMEOUT_S, json={
        "text": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS}}).json()["output_ids"]
    common = {"model": "tiny", "max_tokens": NEW_TOKENS, "temperature": 0.0}
    completion = {"prompt": prompt, **common}
    chat = {"messages": [{"role": "user", "content": prompt}], **common}
    bias = {"logit_bias": {"1000": 100.0}}
    banned = {"custom_logit_processor": DisallowedTokensLogitsProcessor.to_str(), "custom_params": {"token_ids": greedy_ids}}
    cases = [("/v1/completions", completion, bias), ("/v1/chat/completions", chat, bias), ("/v1/completions", completion, banned)]
    with router([w.url for w in workers], "round_robin", str(tmp_path / "router.log")) as base:
        for path, body, extra in cases:
            plain = _post(workers[0].url, path, body)
            direct = _post(workers[0].url, path, {**body, **extra})
            routed = _post(base, path, {**body, **extra})
            assert direct["text"] != plain["text"], f"{path} {list(extra)}: the parameter changed nothing"
            assert routed == direct, f"{path} {list(extra)}: through the router {routed} != direct {direct}"


def test_a_worker_killed_mid_run_leaves_no_request_hanging(workers, worker_flags, tmp_path) -> None:
    mixed = [mixed_request(i) for i in range(48)]
    direct = _direct_answers(workers[0].url, mixed)
    done = threading.Semaphore(0)

    def routed(request: tuple) -> tuple[str, Any]:
        try:
            answer = call(base, request)
            return ("ok", answer) if answer["finish"] else ("error", f"no finish reason: {answer}")
        except requests.Timeout as err:  # no answer within REQUEST_TIMEOUT_S: the hang this test rules out
            return "hang", repr(err)
        except (requests.RequestException, RuntimeError, KeyError, ValueError) as err:
            return "error", repr(err)
        finally:
            done.release()

    # The victim is a worker of this test's own: the module's two stay up for the other tests.
    # power_of_two: the router polls each worker's /get_load.
    with running_server(*worker_flags) as victim, \
            router([workers[0].url, victim.url], "power_of_two", str(tmp_path / "router.log")) as base:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            futures = [pool.submit(routed, r) for r in mixed]
            for _ in range(8):
                done.acquire()
            victim.proc.kill()  # its scheduler and detokenizer die with it
            finished, still_open = concurrent.futures.wait(futures, timeout=3 * REQUEST_TIMEOUT_S)
        # The router polls loads on its own clock (seconds apart): a fast run may end before its first poll.
        wait_until(lambda: '"GET /get_load HTTP/1.1" 200' in workers[0].output, 60, "the router's first /get_load")
    assert not still_open, f"{len(still_open)} requests still open"
    outcomes = [f.result() for f in futures]
    ok = [(r, answer) for r, (status, answer) in zip(mixed, outcomes) if status == "ok"]
    errors = [answer for status, answer in outcomes if status == "error"]
    hangs = [answer for status, answer in outcomes if status == "hang"]
    print(f"worker killed after 8 of {len(mixed)}: {len(ok)} completed, {len(errors)} errors: {errors[:3]}")
    assert not hangs, f"{len(hangs)} requests got no answer within {REQUEST_TIMEOUT_S} s: {hangs[:3]}"
    assert len(ok) >= 8
    for request, answer in ok:
        assert answer == direct[request], f"{request}: {answer} != direct {direct[request]}"
