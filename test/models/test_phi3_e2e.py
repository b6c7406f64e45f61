"""Phi-3, tiny random checkpoints written by transformers (fused qkv_proj and gate_up_proj),
served in float32 and compared with transformers: LongRoPE with original_max_position_embeddings
32, so that prompts fall on both sides of it; a partial rotary factor; a sliding window larger
than every sequence; the radix cache and the deterministic mode."""

from __future__ import annotations

import pytest
import torch

from family_utils import assert_matches_hf, prompts, save_tiny, serving

pytestmark = pytest.mark.e2e

SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, original_max_position_embeddings=32,
             sliding_window=100)
HEAD_DIM = 16


def _longrope(rotary_dim: int) -> dict:
    g = torch.Generator().manual_seed(1)
    short, long = (1 + torch.rand(rotary_dim // 2, generator=g) * k for k in (0.5, 8.0))
    return {"rope_type": "longrope", "short_factor": short.tolist(), "long_factor": long.tolist(),
            "rope_theta": 10000.0}


def _save(folder: str, partial: float):
    rope = _longrope(int(HEAD_DIM * partial)) | {"partial_rotary_factor": partial}
    return save_tiny(folder, "Phi3Config", "Phi3ForCausalLM", rope_parameters=rope, **SHAPE)


@pytest.fixture(scope="module")
def phi3(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("phi3"))
    return folder, _save(folder, 1.0)


def test_phi3_longrope_matches_transformers_batched_and_cached(phi3, gguf_path: str) -> None:
    """Prompts of 3 and 17 tokens stay within 32 positions with their 8 new tokens (short
    factors); 33, 48 and 75 start past it (long factors); all in one batch."""
    folder, model = phi3
    with serving(folder, gguf_path) as server:
        assert_matches_hf(server, model, prompts())
        assert_matches_hf(server, model, prompts())  # every prompt's prefix now in the radix cache


def test_phi3_longrope_deterministic_matches_transformers(phi3, gguf_path: str) -> None:
    folder, model = phi3
    with serving(folder, gguf_path, "--enable-deterministic-inference") as server:
        assert_matches_hf(server, model, prompts())


def test_phi3_partial_rotary_matches_transformers_chunked(tmp_path, gguf_path: str) -> None:
    """Half of each head rotated; prompts within the original length (the short factors), so
    that prefill chunks of 16 compute what one forward over the prompt does."""
    model = _save(str(tmp_path), 0.5)
    with serving(str(tmp_path), gguf_path, "--chunked-prefill-size", "16") as server:
        assert_matches_hf(server, model, prompts(2), new_tokens=12)
