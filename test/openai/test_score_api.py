"""POST /v1/score: SGLang's scoring API.

End to end on the embedded SmolLM2 (the session's shared server): scores are exp of the label
logprobs /generate returns for the same prompt, softmax-normalised with apply_softmax, for text
and token-id inputs and item_first. Request validation runs against the fake tokenizer manager
of test_openai_api (no model needed).
"""

from __future__ import annotations

import math
from typing import Any, Union

import pytest
import requests
from fastapi.testclient import TestClient

from engine_utils import generate_ok
from sglang.test.server_process import ServerProcess
from sglang.srt.entrypoints.openai.serving_score import label_scores
from test_openai_api import FakeTokenizer, FakeTokenizerManager, make_app

QUERY = "I pledge allegiance"
ITEMS = ["", " to the flag", " of"]
TIMEOUT = 300


def score(server: ServerProcess, **body: Any) -> dict[str, Any]:
    response = requests.post(server.url + "/v1/score", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()


def token_ids(server: ServerProcess, text: str) -> list[int]:
    response = requests.post(server.url + "/tokenize", json={"prompt": text}, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def generate_label_logprobs(server: ServerProcess, prompt: Union[str, list[int]], labels: list[int]) -> list[float]:
    """The labels' logprobs at the first generated position, straight from /generate."""
    out = generate_ok(
        server, prompt, sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        return_logprob=True, token_ids_logprob=labels,
    )
    by_id = {entry[1]: entry[0] for entry in out["meta_info"]["output_token_ids_logprobs"][0]}
    return [by_id[t] for t in labels]


@pytest.fixture(scope="module")
def labels(smollm_server: ServerProcess) -> list[int]:
    ids = [token_ids(smollm_server, word)[0] for word in (" to", " the", " of", "!")]
    assert len(set(ids)) == 4
    return ids


# ----------------------------------------------------------------------------- end to end


@pytest.mark.e2e
def test_scores_are_the_label_probabilities_after_query_then_item(
    smollm_server: ServerProcess, labels: list[int]
) -> None:
    body = score(smollm_server, query=QUERY, items=ITEMS, label_token_ids=labels)
    assert body["object"] == "scoring" and len(body["scores"]) == len(ITEMS)
    for item, scores in zip(ITEMS, body["scores"]):
        expected = [math.exp(lp) for lp in generate_label_logprobs(smollm_server, QUERY + item, labels)]
        assert scores == pytest.approx(expected, rel=1e-3, abs=1e-12)
        assert all(0.0 <= s <= 1.0 for s in scores) and sum(scores) < 1.0  # the rest of the vocabulary


@pytest.mark.e2e
def test_apply_softmax_normalises_over_the_labels(smollm_server: ServerProcess, labels: list[int]) -> None:
    body = score(smollm_server, query=QUERY, items=ITEMS, label_token_ids=labels, apply_softmax=True)
    for item, scores in zip(ITEMS, body["scores"]):
        logprobs = generate_label_logprobs(smollm_server, QUERY + item, labels)
        total = sum(math.exp(lp) for lp in logprobs)
        assert scores == pytest.approx([math.exp(lp) / total for lp in logprobs], rel=1e-3)
        assert sum(scores) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.e2e
def test_item_first_puts_the_item_before_the_query(smollm_server: ServerProcess, labels: list[int]) -> None:
    items = ["Tokyo", "Paris"]
    body = score(smollm_server, query=" is a city in", items=items, label_token_ids=labels, item_first=True)
    for item, scores in zip(items, body["scores"]):
        expected = [math.exp(lp) for lp in generate_label_logprobs(smollm_server, item + " is a city in", labels)]
        assert scores == pytest.approx(expected, rel=1e-3, abs=1e-12)


@pytest.mark.e2e
def test_token_id_inputs_are_concatenated_as_ids(smollm_server: ServerProcess, labels: list[int]) -> None:
    query = token_ids(smollm_server, QUERY)
    items = [token_ids(smollm_server, " to the flag"), token_ids(smollm_server, " of")]
    body = score(smollm_server, query=query, items=items, label_token_ids=labels)
    for item, scores in zip(items, body["scores"]):
        expected = [math.exp(lp) for lp in generate_label_logprobs(smollm_server, query + item, labels)]
        assert scores == pytest.approx(expected, rel=1e-3, abs=1e-12)
    flipped = score(smollm_server, query=query, items=items, label_token_ids=labels, item_first=True)
    expected = [math.exp(lp) for lp in generate_label_logprobs(smollm_server, items[1] + query, labels)]
    assert flipped["scores"][1] == pytest.approx(expected, rel=1e-3, abs=1e-12)


@pytest.mark.e2e
def test_a_single_text_item_and_the_response_fields(smollm_server: ServerProcess, labels: list[int]) -> None:
    body = score(smollm_server, query=QUERY, items=" to", label_token_ids=labels[:2], model="my-name")
    prompt_tokens = len(token_ids(smollm_server, QUERY + " to"))
    assert set(body) == {"scores", "model", "usage", "object"} and body["model"] == "my-name"
    assert len(body["scores"]) == 1 and len(body["scores"][0]) == 2
    usage = body["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (prompt_tokens, 0, prompt_tokens)
    served = requests.get(smollm_server.url + "/v1/models", timeout=TIMEOUT).json()["data"][0]["id"]
    assert score(smollm_server, query=QUERY, items=" to", label_token_ids=labels[:1])["model"] == served


@pytest.mark.e2e
def test_repeated_labels_get_the_same_score(smollm_server: ServerProcess, labels: list[int]) -> None:
    (scores,) = score(smollm_server, query=QUERY, items=[" to"], label_token_ids=[labels[0], labels[1], labels[0]])["scores"]
    assert scores[0] == scores[2] and scores[0] != scores[1]


@pytest.mark.e2e
def test_an_engine_rejection_is_a_400(smollm_server: ServerProcess, labels: list[int]) -> None:
    response = requests.post(
        smollm_server.url + "/v1/score", json={"query": "", "items": [""], "label_token_ids": labels}, timeout=TIMEOUT
    )
    assert response.status_code == 400 and "empty" in response.json()["message"]


# ----------------------------------------------------------------------------- validation (no model)


@pytest.fixture(scope="module")
def raw() -> TestClient:
    return TestClient(make_app(FakeTokenizerManager(FakeTokenizer())))


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"query": "q", "items": ["a"]}, "label_token_ids", "label_token_ids"),
        ({"query": "q", "items": ["a"], "label_token_ids": []}, "label_token_ids", "at least 1"),
        ({"query": "q", "items": ["a"], "label_token_ids": [100]}, "label_token_ids", "100"),
        ({"query": "q", "items": ["a"], "label_token_ids": [-1]}, "label_token_ids", "-1"),
        ({"query": "q", "items": ["a"], "label_token_ids": [True]}, "label_token_ids", "label_token_ids"),
        ({"query": "q", "items": [], "label_token_ids": [1]}, "items", "empty"),
        ({"query": "q", "items": [[1, 2]], "label_token_ids": [1]}, "items", "strings"),
        ({"query": [1, 2], "items": ["a"], "label_token_ids": [1]}, "items", "token ids"),
        ({"items": ["a"], "label_token_ids": [1]}, "query", "query"),
        ({"query": "q", "items": ["a"], "label_token_ids": [1], "apply_softmax": "yes"}, "apply_softmax", "bool"),
        ({"query": "q", "items": ["a"], "label_token_ids": [1], "labels": [1]}, "labels", "labels"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(raw: TestClient, body: dict, param: str, words: str) -> None:
    response = raw.post("/v1/score", json=body)
    assert response.status_code == 400
    error = response.json()
    assert error["object"] == "error" and error["code"] == 400
    assert error["param"] == param and words in error["message"], error


def test_bad_bodies_are_400s(raw: TestClient) -> None:
    assert raw.post("/v1/score", content=b"{nope").status_code == 400
    assert raw.post("/v1/score", json=[1]).status_code == 400


def test_each_item_is_one_engine_request_with_the_labels() -> None:
    fake = FakeTokenizerManager(FakeTokenizer())
    client = TestClient(make_app(fake))
    # The fake returns no token-id logprobs, so the scoring fails after the requests are made.
    response = client.post(
        "/v1/score", json={"query": "q", "items": ["a", "b"], "label_token_ids": [5, 6], "item_first": True}
    )
    assert response.status_code == 500 and response.json()["type"] == "InternalServerError"
    assert [obj.text for obj in fake.received] == ["aq", "bq"]
    for obj in fake.received:
        assert obj.return_logprob and obj.token_ids_logprob == [5, 6] and obj.stream is False
        assert obj.sampling_params == {"max_new_tokens": 1, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0}


def test_label_scores_conversion() -> None:
    assert label_scores([math.log(0.5), math.log(0.25), None], apply_softmax=False) == pytest.approx([0.5, 0.25, 0.0])
    assert label_scores([math.log(0.5), math.log(0.25)], apply_softmax=True) == pytest.approx([2 / 3, 1 / 3])
    masked = -3.4028234663852886e38  # the engine's logprob for a masked token
    assert label_scores([masked, 0.0], apply_softmax=False) == [0.0, 1.0]
    assert label_scores([masked, masked], apply_softmax=True) == [0.5, 0.5]
