"""Mistral (the Llama decoder; here with a head_dim other than hidden / heads), a tiny random
checkpoint written by transformers, served in float32 and compared with transformers: batched and
chunked, from the radix cache, and in the deterministic mode."""

from __future__ import annotations

import pytest

from family_utils import assert_matches_hf, prompts, save_tiny, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, head_dim=32, sliding_window=None)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("mistral"))
    return folder, save_tiny(folder, "MistralConfig", "MistralForCausalLM", **SHAPE)


def test_mistral_matches_transformers_batched_chunked_and_cached(mistral, gguf_path: str) -> None:
    folder, model = mistral
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts())
        assert_matches_hf(server, model, prompts())  # every prompt's prefix now in the radix cache


def test_mistral_deterministic_matches_transformers(mistral, gguf_path: str) -> None:
    folder, model = mistral
    with serving(folder, gguf_path, "--enable-deterministic-inference", "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts())
