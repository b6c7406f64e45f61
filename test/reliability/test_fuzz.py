"""Fuzz: schemathesis drives /generate and the OpenAI routes from the server's own OpenAPI
document (valid and invalid bodies), hypothesis draws sampling parameters for /generate. No
response is a 5xx, the server never goes down, and every 4xx message names a field."""

from __future__ import annotations

import json
import re

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings, strategies as st
from schemathesis import GenerationMode

from reliability_utils import API_KEY, LONG

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FUZZED_PATHS = "^/(generate|v1/completions|v1/chat/completions|v1/responses)$"
EXAMPLES = 400 if LONG else 15
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _field_names(document: dict) -> set[str]:
    """Every property name the document declares, and the sampling parameter names."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    names: set[str] = set(SamplingParams.__dataclass_fields__)
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            names.update(node.get("properties", {}) if isinstance(node.get("properties"), dict) else ())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return names


def _check(response: requests.Response, names: set[str]) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        body = response.json()
        # The native routes answer {"error": {"message"}}, the OpenAI ones {"object": "error", "message"}.
        message = body["error"]["message"] if "error" in body else body["message"]
        words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", message))
        named = {w.split(".")[-1] for w in words} | words
        # SGLang's own messages spell some fields as words ("custom logit processor") or flags.
        spelled = re.sub(r"[\s-]+", "_", message)
        # An OpenAI error's `param`: a request field the message names (fields SGLang defines that
        # this server refuses are not in its OpenAPI document).
        param = body.get("param") if "error" not in body else body["error"].get("param")
        assert (named & names or any(len(n) > 3 and n in spelled for n in names)
                or (isinstance(param, str) and param in named)
                or re.search(r"\b(body|JSON|field)\b", message)), message
    elif _content_type(response).startswith("text/event-stream"):
        assert b'"code":5' not in response.content, response.content[:500]


def _content_type(response) -> str:
    value = response.headers.get("content-type") or ""
    return value[0] if isinstance(value, list) else value  # schemathesis' responses hold lists


def test_schemathesis_against_the_openapi_document(guarded_server):
    document = requests.get(guarded_server.url + "/openapi.json", headers=AUTH, timeout=60).json()
    names = _field_names(document)
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.include(path_regex=FUZZED_PATHS).get_all_operations()]
    assert {op.path for op in operations} == {"/generate", "/v1/completions", "/v1/chat/completions", "/v1/responses"}
    for operation in operations:
        for mode in GenerationMode:

            @SETTINGS
            @given(case=operation.as_strategy(mode))
            def run(case) -> None:
                _check(case.call(base_url=guarded_server.url, headers=AUTH, timeout=600), names)

            run()
    assert requests.get(guarded_server.url + "/health", headers=AUTH, timeout=300).status_code == 200


_numbers = st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(-3, 300), st.none())
SAMPLING = st.fixed_dictionaries({}, optional={
    "temperature": _numbers, "top_p": _numbers, "top_k": _numbers, "min_p": _numbers,
    "max_new_tokens": st.one_of(st.integers(-2, 12), st.just(10**9)), "min_new_tokens": st.integers(-2, 8),
    "frequency_penalty": _numbers, "presence_penalty": _numbers, "repetition_penalty": _numbers,
    "stop": st.one_of(st.text(max_size=3), st.lists(st.text(max_size=3), max_size=3)),
    "stop_token_ids": st.lists(st.integers(-2, 60000), max_size=3), "ignore_eos": st.booleans(),
    "n": st.integers(-1, 3), "sampling_seed": st.one_of(st.integers(-2**64, 2**64), st.text(max_size=2)),
    "logit_bias": st.dictionaries(st.text(max_size=6), _numbers, max_size=3),
    "skip_special_tokens": st.booleans(), "regex": st.sampled_from(["(yes|no)", "[", "a{2,3}"]),
    "no_such_parameter": st.integers(),
})


def test_hypothesis_sampling_parameters(guarded_server):
    names = _field_names({})

    @SETTINGS
    @given(params=SAMPLING, stream=st.booleans())
    def run(params, stream) -> None:
        body = json.dumps({"text": "Hello", "sampling_params": params, "stream": stream})  # orjson stops at 64-bit ints
        response = requests.post(guarded_server.url + "/generate", data=body, headers=AUTH, timeout=600)
        _check(response, names | {"sampling_params"})
        if response.status_code == 200 and not stream:
            outs = response.json()
            for out in outs if isinstance(outs, list) else [outs]:  # n > 1: one per child
                reason = out["meta_info"]["finish_reason"]
                assert reason["type"] != "abort" or reason["status_code"] < 500, reason

    run()
    assert requests.get(guarded_server.url + "/health", headers=AUTH, timeout=300).status_code == 200
