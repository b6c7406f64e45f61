"""Step faults injected through SGLANG_TEST_STEP_FAULT (off by default): a failing step aborts
only the requests it was computing, the others complete with the tokens of a fault-free server,
the KV pool returns to idle; steps that keep failing end the server with a clear message; with
TP, a fault on one rank fails the step on every rank alike."""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from reliability_utils import PROMPTS, metric, replay_mismatches, Record, sampling_params, server, wait_idle
from sglang.srt.managers.step_failures import INJECTED_FAULT, STEP_FAULT_ENV

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

STEP_ERROR = {"reason": "StepError"}
NO_LIMIT = ("--step-failure-limit", "1000", "--step-failure-window", "100")


def _requests(count: int, seed: int) -> list[Record]:
    rng = random.Random(seed)
    return [Record({"text": rng.choice(PROMPTS) + f" [{i}]", "sampling_params": sampling_params(rng, rng.randint(8, 24))}, None)
            for i in range(count)]


def _send(srv, records: list[Record], workers: int = 24) -> list[Record]:
    def one(record: Record) -> Record:
        response = requests.post(srv.url + "/generate", json=record.body, timeout=900)
        record.status = response.status_code
        out = response.json()
        record.output_ids, record.finish_reason = out["output_ids"], out["meta_info"]["finish_reason"]
        return record

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, records))


def _split(records: list[Record], cause: str = INJECTED_FAULT) -> tuple[list[Record], list[Record]]:
    assert all(r.status == 200 for r in records)
    failed = [r for r in records if r.finish_reason["type"] == "abort"]
    for r in failed:
        assert r.finish_reason["err_type"] == "StepError" and r.finish_reason["status_code"] == 500, r.finish_reason
        assert cause in r.finish_reason["message"], r.finish_reason
    completed = [r for r in records if r.finish_reason["type"] != "abort"]
    assert all(r.finish_reason["type"] in ("length", "stop") for r in completed)
    return failed, completed


def test_injected_step_faults_fail_only_their_requests(gguf_path, clean_server):
    flags = ("--model-path", gguf_path, "--enable-deterministic-inference", "--enable-metrics", *NO_LIMIT)
    with server(*flags, env={STEP_FAULT_ENV: "0.1"}) as faulty:
        aborted_before = metric(faulty, "sglang:num_aborted_requests_total", **STEP_ERROR)
        failed_steps_before = metric(faulty, "sglang:num_failed_steps_total")
        failed, completed = _split(_send(faulty, _requests(64, seed=1)))
        print(f"{len(failed)} requests failed, {len(completed)} completed")
        assert failed and completed
        assert metric(faulty, "sglang:num_aborted_requests_total", **STEP_ERROR) - aborted_before == len(failed)
        assert metric(faulty, "sglang:num_failed_steps_total") > failed_steps_before
        wait_idle(faulty)  # the failed rows' slots are back; poisoned prefixes are evictable
    mismatches = replay_mismatches(clean_server, completed)
    assert not mismatches, [(r.body, r.output_ids, ids) for r, ids in mismatches[:3]]


def test_steps_that_keep_failing_end_the_server(gguf_path):
    with server("--model-path", gguf_path, "--step-failure-limit", "3", "--step-failure-window", "50",
                env={STEP_FAULT_ENV: "1.0"}) as broken:
        for _ in range(10):  # each request fails at its first step; the health check failed one already
            if broken.proc.poll() is not None:
                break
            try:
                response = requests.post(broken.url + "/generate", json={"text": "Hi", "sampling_params": {"max_new_tokens": 4}}, timeout=300)
            except requests.ConnectionError:
                break
            if response.status_code == 503:  # the limit was reached (start-up health checks fail steps too): refused
                assert "--step-failure-limit 3" in response.json()["error"]["message"], response.text
                continue
            out = response.json()
            # StepError, or the abort of a request in flight when the limit was reached.
            assert out["meta_info"]["finish_reason"]["err_type"] in ("StepError", "ServiceUnavailable"), out
        deadline = time.monotonic() + 120
        while broken.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert broken.proc.poll() not in (None, 0), broken.output[-3000:]
        assert "--step-failure-limit 3" in broken.output, broken.output[-3000:]


def test_a_fault_on_one_tp_rank_fails_the_step_on_every_rank(gguf_path):
    # SmolLM2's 9 heads and 3 KV heads split 3 ways, not 2.
    with server("--model-path", gguf_path, "--tp-size", "3", *NO_LIMIT, env={STEP_FAULT_ENV: "0.1:1"}) as faulty:
        # Rank 0, which answers, did not raise: it names the other rank.
        failed, completed = _split(_send(faulty, _requests(32, seed=2), workers=16), cause="the step failed on another TP rank")
        print(f"TP=3, faults on rank 1: {len(failed)} requests failed, {len(completed)} completed")
        assert failed and completed
        assert requests.get(faulty.url + "/health", timeout=300).status_code == 200
        wait_idle(faulty)
