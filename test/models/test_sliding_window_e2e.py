"""Llama-family checkpoints with a sliding window of 32, each a tiny random checkpoint written by
transformers, served in float32 and compared with transformers on prompts past the window and a
16-token prefill chunk (a chunk's queries see the window across the chunk boundary): Mistral
(every layer slides) and Qwen2 with use_sliding_window (layers from max_window_layers on)."""

from __future__ import annotations

import pytest

from family_utils import assert_matches_hf, prompts, save_tiny, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, sliding_window=32)


@pytest.fixture(scope="module")
def mistral(tmp_path_factory, gguf_path: str):
    folder = str(tmp_path_factory.mktemp("mistral"))
    model = save_tiny(folder, "MistralConfig", "MistralForCausalLM", head_dim=16, **SHAPE)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        yield server, model


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory, gguf_path: str):
    folder = str(tmp_path_factory.mktemp("qwen2"))
    model = save_tiny(folder, "Qwen2Config", "Qwen2ForCausalLM", use_sliding_window=True, max_window_layers=1,
                      tie_word_embeddings=True, **SHAPE)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16", "--enable-deterministic-inference") as server:
        yield server, model


def test_mistral_window_matches_transformers_batched_chunked_and_cached(mistral) -> None:
    server, model = mistral
    assert_matches_hf(server, model, prompts())
    # The second pass finds every prompt's prefix in the radix cache.
    assert_matches_hf(server, model, prompts())


def test_qwen2_window_matches_transformers_deterministic_and_cached(qwen2) -> None:
    server, model = qwen2
    assert_matches_hf(server, model, prompts())
    assert_matches_hf(server, model, prompts())
