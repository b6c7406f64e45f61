"""Port of SGLang's test/srt/test_score_api.py (class TestScoreAPI): scores of label tokens for
query + item (or item + query) match a reference computation, softmaxed over the labels, for
batches of items.

Upstream calls sglang.Engine.score and takes its reference from HuggingFace transformers on the
same model. Engine.score is not in issue 19's engine surface, so the same checks run over the
server's /v1/score (`smollm_server`); the reference is the next-token distribution /generate
reports for the concatenated text (token_ids_logprob of the labels at temperature 1, the
distribution /v1/score is defined on), softmaxed over the labels. The embedded model is a GGUF,
which transformers would dequantize differently from this engine's kernels.

Not ported: test_score_request_construction (patches SGLang's TokenizerManager.generate_request
to check that scoring asks for max_new_tokens=0: an implementation detail; this server documents
that it generates and discards one token).
"""

from __future__ import annotations

import math

import pytest
import requests
from sglang.srt.utils.hf_transformers_utils import get_tokenizer
from upstream_helpers import post_ok, served_model

pytestmark = pytest.mark.e2e

TOLERANCE = 0.01  # upstream: 1% between HF and SGLang


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    return get_tokenizer(gguf_path, False)


def _score(server, **body) -> list[list[float]]:
    r = requests.post(server.url + "/v1/score", json={"model": served_model(server), **body}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["scores"]


def _reference(server, query: str, items: list[str], labels: list[int], item_first: bool) -> list[list[float]]:
    scores = []
    for item in items:
        text = f"{item}{query}" if item_first else f"{query}{item}"
        out = post_ok(server, "/generate", {
            "text": text,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 1},
            "return_logprob": True,
            "token_ids_logprob": labels,
        })
        by_id = {tid: lp for lp, tid, *_ in out["meta_info"]["output_token_ids_logprobs"][0]}
        exps = [math.exp(by_id[label]) for label in labels]
        scores.append([e / sum(exps) for e in exps])
    return scores


CASES = [
    pytest.param("I pledge allegiance", ["", " to"], False, id="default"),
    pytest.param(" is a city", ["Tokyo", "Japan"], True, id="item_first"),
]


@pytest.mark.parametrize("query, items, item_first", CASES)
def test_score_consistency(smollm_server, tokenizer, query, items, item_first) -> None:
    labels = [tokenizer.encode(t, add_special_tokens=False)[0] for t in (" to", " the")]
    ours = _score(smollm_server, query=query, items=items, label_token_ids=labels, apply_softmax=True,
                  item_first=item_first)
    reference = _reference(smollm_server, query, items, labels, item_first)
    assert len(ours) == len(reference)
    for our_list, ref_list in zip(ours, reference):
        assert len(our_list) == len(ref_list)
        for ours_p, ref_p in zip(our_list, ref_list):
            assert abs(ours_p - ref_p) <= TOLERANCE, (ours_p, ref_p)
            assert 0 <= ours_p <= 1
        assert sum(our_list) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("batch_size", [1, 2, 4, 8])
def test_score_batch_handling(smollm_server, batch_size) -> None:
    labels = [1, 2, 3]
    scores = _score(smollm_server, query="The test was", items=[f"test {i}" for i in range(batch_size)],
                    label_token_ids=labels, apply_softmax=True)
    assert len(scores) == batch_size
    for score_list in scores:
        assert len(score_list) == len(labels)
        assert all(isinstance(v, float) for v in score_list)
        assert sum(score_list) == pytest.approx(1.0, abs=1e-6)
