"""Admission and limits: --max-queued-requests answers 503, prompts longer than the context and
max_new_tokens past it are 400s naming the numbers, bodies past --max-request-body-bytes are
413s, /abort_request abort_all empties the server; SIGTERM drains gracefully and exits 0."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import requests

from reliability_utils import Record, server, stream_request, wait_for_load, wait_idle

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONTEXT = 256
BODY_LIMIT = 100_000
LONG_RUN = 3000  # tokens: minutes of CPU decoding, so these requests are running while the test acts


@pytest.fixture(scope="module")
def limited(gguf_path):
    with server("--model-path", gguf_path, "--context-length", str(CONTEXT), "--max-request-body-bytes", str(BODY_LIMIT)) as srv:
        yield srv


@pytest.fixture(scope="module")
def queued(gguf_path):
    """Two running, one waiting; the last test of the module shuts it down with SIGTERM."""
    with server("--model-path", gguf_path, "--max-running-requests", "2", "--max-queued-requests", "1", "--max-total-tokens", "16384",
                "--graceful-shutdown-timeout", "15") as srv:
        yield srv


def _post(srv, path: str, body) -> requests.Response:
    return requests.post(srv.url + path, json=body, timeout=600)


def test_prompt_longer_than_the_context_is_a_400_naming_length_and_limit(limited):
    response = _post(limited, "/generate", {"input_ids": [1] * 300, "sampling_params": {"max_new_tokens": 1}})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "300" in message and str(CONTEXT) in message, message
    response = _post(limited, "/v1/completions", {"model": "m", "prompt": [1] * 300, "max_tokens": 1})
    assert response.status_code == 400 and "300" in response.text and str(CONTEXT) in response.text, response.text


def test_max_new_tokens_past_the_context_is_a_400_and_null_means_the_rest(limited):
    response = _post(limited, "/generate", {"input_ids": [1] * 200, "sampling_params": {"max_new_tokens": 100}})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "max_new_tokens=100" in message and str(CONTEXT) in message, message
    out = _post(limited, "/generate", {"input_ids": [1] * 250, "sampling_params": {"max_new_tokens": None, "ignore_eos": True, "temperature": 0}}).json()
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": CONTEXT - 250}
    assert len(out["output_ids"]) == CONTEXT - 250


def test_bodies_past_the_limit_are_413(limited):
    big = {"text": "x" * BODY_LIMIT}
    response = _post(limited, "/generate", big)
    assert response.status_code == 413 and "--max-request-body-bytes" in response.text, response.text
    chunked = requests.post(limited.url + "/generate", data=iter([b"{" + b" " * BODY_LIMIT, b"}"]), timeout=600)
    assert chunked.status_code == 413, chunked.text


def test_a_full_queue_answers_503_and_abort_all_empties_the_server(queued):
    body = {"text": "Count:", "sampling_params": {"max_new_tokens": LONG_RUN, "ignore_eos": True}}
    records = [Record(body, None) for _ in range(2)]
    streams = [threading.Thread(target=stream_request, args=(queued, record)) for record in records]
    # One at a time: two arriving in one scheduler receive would both be waiting, and the second refused.
    for running, t in enumerate(streams, start=1):
        t.start()
        wait_for_load(queued, lambda s, n=running: s["num_running_reqs"] == n)
    waiting = threading.Thread(target=_post, args=(queued, "/generate", body))
    waiting.start()
    wait_for_load(queued, lambda s: s["num_queue_reqs"] == 1)
    refused = _post(queued, "/generate", body)
    assert refused.status_code == 503, refused.text
    assert "--max-queued-requests 1" in refused.json()["error"]["message"]
    refused = _post(queued, "/v1/completions", {"model": "m", "prompt": "Count:", "max_tokens": 8})
    assert refused.status_code == 503 and "--max-queued-requests 1" in refused.text, refused.text
    assert _post(queued, "/abort_request", {"abort_all": True}).status_code == 200
    for t in [*streams, waiting]:
        t.join()
    for record in records:
        assert record.status == 200 and (record.finish_reason or {}).get("type") == "abort", record
    wait_idle(queued)


def test_sigterm_refuses_new_requests_aborts_what_outlives_the_timeout_and_exits_0(queued):
    record = Record({"text": "Count:", "sampling_params": {"max_new_tokens": LONG_RUN, "ignore_eos": True}}, None)
    streamer = threading.Thread(target=stream_request, args=(queued, record))
    streamer.start()
    wait_for_load(queued, lambda s: s["num_running_reqs"] == 1)
    queued.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 60
    while requests.get(queued.url + "/health", timeout=60).status_code != 503 and time.monotonic() < deadline:
        time.sleep(0.05)
    refused = _post(queued, "/generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
    assert refused.status_code == 503 and "shutting down" in refused.text, refused.text
    streamer.join()
    assert queued.proc.wait(120) == 0, queued.output[-3000:]
    assert record.finish_reason["type"] == "abort" and record.finish_reason["err_type"] == "ServerShutdown", record
    assert 0 < len(record.output_ids) < LONG_RUN
