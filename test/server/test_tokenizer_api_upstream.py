"""Port of SGLang's test/srt/test_tokenizer_api.py (class TestTokenizerAPI): /tokenize and
/detokenize against the model's own tokenizer, their 400s, special tokens and a round trip.

That upstream file sends {"text": ...} and {"keep_special_tokens": ...}; SGLang 0.5's released
routes (and this server) take {"prompt": ...} and {"skip_special_tokens": ...}, so the port uses
those names for the same checks. Upstream's list of special-token spellings (<s>, [CLS], ...)
becomes the model tokenizer's own list. On the shared server (`smollm_server`).
"""

from __future__ import annotations

import pytest
import requests
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tokenizer(gguf_path: str):
    return get_tokenizer(gguf_path, False)


def _post(server, path: str, body: dict) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=60)


@pytest.mark.parametrize("text", [
    pytest.param("Hello, world!", id="simple"),
    pytest.param("", id="empty"),
    pytest.param("This is a longer text that should be tokenized properly. " * 10, id="long"),
])
def test_tokenize(smollm_server, tokenizer, text) -> None:
    r = _post(smollm_server, "/tokenize", {"prompt": text})
    assert r.status_code == 200, r.text
    data = r.json()
    expected = tokenizer.encode(text)
    assert isinstance(data["tokens"], list)
    assert data["tokens"] == expected
    assert data["count"] == len(expected)


def test_tokenize_invalid(smollm_server) -> None:
    r = _post(smollm_server, "/tokenize", {"prompt": 123})
    assert r.status_code == 400
    assert "error" in r.json()


def test_detokenize_simple(smollm_server, tokenizer) -> None:
    text = "Hello, world!"
    r = _post(smollm_server, "/detokenize", {"tokens": tokenizer.encode(text)})
    assert r.status_code == 200, r.text
    assert r.json()["text"].strip() == text.strip()


def test_detokenize_empty(smollm_server) -> None:
    r = _post(smollm_server, "/detokenize", {"tokens": []})
    assert r.status_code == 200, r.text
    assert r.json()["text"] == ""


@pytest.mark.parametrize("tokens", [pytest.param("not_a_list", id="format"), pytest.param([1, 2, "not_an_int", 4], id="token")])
def test_detokenize_invalid(smollm_server, tokens) -> None:
    r = _post(smollm_server, "/detokenize", {"tokens": tokens})
    assert r.status_code == 400
    assert "error" in r.json()


def test_detokenize_keep_special_tokens(smollm_server, tokenizer) -> None:
    """Upstream: "Hello, world!" (with whatever special tokens encode adds); SmolLM2 adds none,
    so one is put in, to make the two answers differ as upstream expects when they can."""
    tokens = [tokenizer.convert_tokens_to_ids("<|im_start|>")] + tokenizer.encode("Hello, world!")
    plain = _post(smollm_server, "/detokenize", {"tokens": tokens})
    kept = _post(smollm_server, "/detokenize", {"tokens": tokens, "skip_special_tokens": False})
    assert plain.status_code == kept.status_code == 200
    assert isinstance(kept.json()["text"], str)
    if kept.json()["text"] != plain.json()["text"]:
        assert any(special in kept.json()["text"] for special in tokenizer.all_special_tokens)


def test_roundtrip(smollm_server) -> None:
    original = "This is a test of the tokenizer API roundtrip functionality."
    tokens = _post(smollm_server, "/tokenize", {"prompt": original}).json()["tokens"]
    r = _post(smollm_server, "/detokenize", {"tokens": tokens})
    assert r.status_code == 200, r.text
    assert r.json()["text"].strip() == original.strip()
