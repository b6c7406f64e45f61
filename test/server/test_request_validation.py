"""Bad input fails alone: each invalid parameter is a 400 naming it on both APIs, while healthy
streams in flight finish unchanged; custom processors are refused unread when the flag is off."""

from __future__ import annotations

import concurrent.futures
import os
import pickle

import pytest
import requests

from engine_utils import generate, generate_ok, greedy, running_server, stream_chunks

pytestmark = pytest.mark.e2e

PROMPTS = [f"Write a short sentence about the number {i}." for i in range(8)]

NATIVE_BAD = [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"min_new_tokens": 5, "max_new_tokens": 2}, "min_new_tokens"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"n": 0}, "n"),
    ({"sampling_seed": 2**64}, "sampling_seed"),
    ({"logit_bias": {"999999": 1.0}}, "logit_bias"),
    ({"logit_bias": {"5": 1000.0}}, "logit_bias"),
    ({"stop_token_ids": ["x"]}, "stop_token_ids"),
    ({"regex": "(a+"}, "regex"),
    ({"not_a_param": 1}, "not_a_param"),
]

OPENAI_BAD = [
    ({"temperature": -1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"seed": 2**64}, "seed"),
    ({"logit_bias": {"5": 1000}}, "logit_bias"),
    ({"n": 0}, "n"),
    ({"frequency_penalty": 5}, "frequency_penalty"),
    ({"top_k": 0}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
]


@pytest.fixture(scope="module")
def server():
    with running_server() as srv:
        yield srv


def _stream_ids(server, prompt):
    return stream_chunks(server, {"text": prompt, "sampling_params": greedy(24, ignore_eos=True)})[-1]["output_ids"]


def test_bad_requests_fail_alone_while_streams_run(server):
    expected = [generate_ok(server, p, sampling_params=greedy(24, ignore_eos=True))["output_ids"] for p in PROMPTS]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        streams = [pool.submit(_stream_ids, server, p) for p in PROMPTS]
        for params, name in NATIVE_BAD:
            response = generate(server, "hello", sampling_params=params)
            assert response.status_code == 400, (params, response.text)
            assert name in response.json()["error"]["message"], (params, response.text)
        for fields, name in OPENAI_BAD:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
            response = requests.post(server.url + "/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 400, (fields, response.text)
            assert name in response.json()["message"], (fields, response.text)
        assert [s.result() for s in streams] == expected
    assert generate(server, "still alive?", sampling_params=greedy(2)).status_code == 200


class _TouchOnLoad:
    """Unpickling this creates a file: proof that a payload was (or was not) deserialised."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_custom_processor_refused_unread_when_flag_off(server, tmp_path):
    marker = tmp_path / "deserialised"
    payload = '{"callable": "%s"}' % pickle.dumps(_TouchOnLoad(str(marker))).hex()
    response = generate(server, "hello", sampling_params=greedy(2), custom_logit_processor=payload)
    assert response.status_code == 400
    assert "--enable-custom-logit-processor" in response.json()["error"]["message"]
    body = {"model": "m", "prompt": "hi", "max_tokens": 2, "custom_logit_processor": payload}
    response = requests.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 400 and "--enable-custom-logit-processor" in response.json()["message"]
    assert not os.path.exists(marker)
