"""The Llama-shaped families already served (Llama, Qwen2, Qwen3), each a tiny random checkpoint
written by transformers, served in float32 and compared with transformers; the template every
family test in this folder follows."""

from __future__ import annotations

import pytest

from family_utils import assert_matches_hf, prompts, save_tiny, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory, gguf_path: str):
    folder = str(tmp_path_factory.mktemp("qwen3"))
    model = save_tiny(folder, "Qwen3Config", "Qwen3ForCausalLM", head_dim=32, tie_word_embeddings=True, **SHAPE)
    with serving(folder, gguf_path, "--chunked-prefill-size", "16") as server:
        yield server, model


def test_qwen3_matches_transformers_batched_and_chunked(qwen3) -> None:
    server, model = qwen3
    assert_matches_hf(server, model, prompts())


def test_qwen3_prefix_cache_hit_matches_transformers(qwen3) -> None:
    server, model = qwen3
    # The second pass finds every prompt's prefix in the radix cache.
    assert_matches_hf(server, model, prompts())
