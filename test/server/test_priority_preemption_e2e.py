"""Priority preemption end to end, on one server (the embedded model) started with
--enable-priority-scheduling --max-running-requests 1 (preemption on, threshold 10): a running
low-priority request is retracted for a high-priority one, which finishes first, and the low one's
output then continues exactly as if it had run alone. --disable-priority-preemption (the old
behaviour: the queue waits for the running request) is checked by
test_sampling_info_e2e.py::test_higher_priority_is_admitted_first, whose server runs with it."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest

from engine_utils import generate_ok, iter_stream, running_server

pytestmark = pytest.mark.e2e

TIMEOUT = 300
PROMPT = "Once upon a time, in a quiet village by the sea,"
# Seeded sampling with a frequency penalty: the tokens after the retraction equal those of a run
# alone only if the seeded draws keep their positions and the penalty counts the earlier output.
LOW = {"temperature": 0.9, "top_k": 40, "sampling_seed": 1234, "frequency_penalty": 0.5, "max_new_tokens": 48, "ignore_eos": True}


@pytest.fixture(scope="module")
def server():
    with running_server("--enable-priority-scheduling", "--max-running-requests", "1") as proc:
        yield proc


def test_a_high_priority_request_preempts_a_low_one_whose_output_continues_unchanged(server) -> None:
    alone = generate_ok(server, PROMPT, sampling_params=LOW, priority=0, return_logprob=True)
    assert alone["meta_info"]["num_retractions"] == 0 and len(alone["output_ids"]) == LOW["max_new_tokens"]
    started = threading.Event()
    finished_at: dict[str, float] = {}

    def low() -> dict:
        chunks = iter_stream(server, {"text": PROMPT, "sampling_params": LOW, "priority": 0, "return_logprob": True})
        last = next(chunks)
        started.set()  # it holds the one running slot
        for last in chunks:
            pass
        finished_at["low"] = time.monotonic()
        return last

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(low)
        assert started.wait(TIMEOUT)
        high = generate_ok(server, "The capital of France is", priority=100,
                           sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
        finished_at["high"] = time.monotonic()
        preempted = future.result(timeout=TIMEOUT)
    assert finished_at["high"] < finished_at["low"]
    assert high["meta_info"]["num_retractions"] == 0 and len(high["output_ids"]) == 8
    meta = preempted["meta_info"]
    assert meta["num_retractions"] == 1
    assert preempted["output_ids"] == alone["output_ids"]
    assert meta["completion_tokens"] == LOW["max_new_tokens"] and meta["finish_reason"]["type"] == "length"
    # Logprobs continue over the retraction: one per token, the same tokens, the same values.
    ours, theirs = meta["output_token_logprobs"], alone["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in ours] == [t for _, t, _ in theirs] == alone["output_ids"]
    assert [lp for lp, _, _ in ours] == pytest.approx([lp for lp, _, _ in theirs], abs=1e-3)


def test_a_request_within_the_threshold_waits_for_the_running_one(server) -> None:
    """A priority 10 above the running request's is not more than the threshold (10): it queues."""
    params = {**LOW, "max_new_tokens": 24}
    started = threading.Event()

    def low() -> dict:
        chunks = iter_stream(server, {"text": PROMPT, "sampling_params": params, "priority": 0})
        last = next(chunks)
        started.set()
        for last in chunks:
            pass
        return last

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(low)
        assert started.wait(TIMEOUT)
        waiter = generate_ok(server, "The capital of France is", priority=10, sampling_params={"temperature": 0, "max_new_tokens": 2})
        running = future.result(timeout=TIMEOUT)
    assert running["meta_info"]["num_retractions"] == 0 and waiter["meta_info"]["num_retractions"] == 0
