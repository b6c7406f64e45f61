"""The overlap schedule gives the same tokens as the plain loop, for greedy and for seeded
requests with penalties, with 32 requests of different lengths joining and finishing at
different steps (small prefill chunks and a running-request cap stagger them)."""

from __future__ import annotations

import concurrent.futures

import pytest
import requests

from engine_utils import generate_ok, running_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FLAGS = ("--chunked-prefill-size", "48", "--max-running-requests", "12")


def _requests() -> list[tuple[str, dict]]:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    reqs = []
    for i in range(32):
        prompt = " ".join(words[: 2 + i % 11]) * (1 + i % 4)
        max_new = 6 + (i * 7) % 29
        if i % 2 == 0:
            params = {"temperature": 0.0, "max_new_tokens": max_new}
        else:
            params = {
                "temperature": 0.9,
                "top_p": 0.95,
                "sampling_seed": 1000 + i,
                "frequency_penalty": 0.4,
                "presence_penalty": 0.3,
                "repetition_penalty": 1.2,
                "min_new_tokens": 3,
                "max_new_tokens": max_new,
            }
        reqs.append((prompt, params))
    return reqs


def _run_all(*flags: str) -> list[list[int]]:
    with running_server(*FLAGS, *flags) as server:
        with concurrent.futures.ThreadPoolExecutor(32) as pool:
            futures = [pool.submit(generate_ok, server, text, sampling_params=params) for text, params in _requests()]
            return [f.result()["output_ids"] for f in futures]


def test_overlap_on_and_off_give_identical_tokens():
    overlap = _run_all()
    plain = _run_all("--disable-overlap-schedule")
    assert len(overlap) == 32 and all(overlap)
    for i, (a, b) in enumerate(zip(overlap, plain)):
        assert a == b, f"request {i}: overlap {a} != plain {b}"


def _steps(server) -> int:
    return requests.get(server.url + "/get_server_info", timeout=60).json()["load"]["num_steps"]


def test_no_step_after_a_last_token_known_in_advance():
    """A request that ends by max_new_tokens runs one prefill and max_new_tokens - 1 decode steps
    under the overlap schedule too: no extra step whose token would be dropped (on the CPU it
    would hold the cores while the next request arrives)."""
    with running_server() as server:
        assert requests.get(server.url + "/get_server_info", timeout=60).json()["disable_overlap_schedule"] is False
        for _ in range(2):  # the second time the prompt is cached: the same count
            before = _steps(server)
            out = generate_ok(server, "Count to ten:", sampling_params={"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True})
            assert len(out["output_ids"]) == 5
            assert _steps(server) - before == 5
